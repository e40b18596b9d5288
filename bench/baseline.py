"""A baseline tree for the benches' `--baseline REF`: REF checked out in a temporary git worktree,
measured by the same script in a child process in the same run, then removed; and the loop that runs
such a script in each tree, interleaved, and the medians of what it answers."""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def baseline_tree(ref: str, prefix: str = "bench-") -> Iterator[Path]:
    """The tree of commit `ref` (a detached worktree of this repository) while the block runs."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), ref], check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def trees(stack: ExitStack, baseline: str, prefix: str, before_tree: Path | None = None) -> list[tuple[str, Path]]:
    """The trees to measure, by name: this one ("now"), then `baseline`'s (a temporary worktree, removed
    when `stack` closes) or else a tree already unpacked (`before_tree`), if either is given."""
    out = [("now", ROOT)]
    if baseline:
        out.append((baseline, stack.enter_context(baseline_tree(baseline, prefix))))
    elif before_tree:
        out.append((str(before_tree), before_tree.resolve()))
    return out


def interleaved(script: str, measured: Sequence[tuple[str, Path]], args: Callable[[Path], list[str]],
                env: Callable[[Path], dict[str, str]], repeats: int, *, cwd: bool = False) -> dict[str, list[Any]]:
    """`script --json ARGS(tree)` in a child process for each tree in turn, `repeats` times (each repeat
    runs every tree once: both figures come from one invocation), with `env(tree)` over this process's
    environment (and in the tree's directory with `cwd`). The last line a child prints is its answer
    (JSON); each tree's answers, by name, in repeat order."""
    got: dict[str, list[Any]] = {name: [] for name, _ in measured}
    for r in range(repeats):
        for name, tree in measured:
            out = subprocess.run([sys.executable, script, "--json", *args(tree)], capture_output=True, text=True,
                                 check=True, env={**os.environ, **env(tree)}, cwd=tree if cwd else None)
            got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  repeat {r + 1}/{repeats} done", flush=True)
    return got


def tree_args(ap: argparse.ArgumentParser, *, repeats: int = 3, before_tree: bool = False) -> None:
    """The arguments of a bench that measures this tree beside a baseline: --repeats, --baseline (a
    commit), --before-tree (an unpacked tree) where asked, and the child's own --tree and --json."""
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--baseline", default="", help="a commit to measure beside this tree (a temporary worktree)")
    if before_tree:
        ap.add_argument("--before-tree", type=Path, help="a source tree to measure beside this one")
    ap.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)


def answer(tree: Path, measure: Callable[[], Any]) -> None:
    """What a `--json` child does: `tree`'s code imported first, logging off (a bench's figures, not the
    collector's warnings, on stdout), and `measure()`'s result as its last line (see `interleaved`)."""
    sys.path.insert(0, str(tree))
    logging.disable(logging.CRITICAL)
    print(json.dumps(measure()))


def median_cell(xs: Sequence[float], width: int, digits: int) -> tuple[float, str]:
    """The median of one figure's repeats, and it as a table cell: the median, then each repeat in brackets."""
    med = statistics.median(xs)
    return med, f"{med:{width}.{digits}f} [{' '.join(f'{x:.{digits}f}' for x in xs)}]"
