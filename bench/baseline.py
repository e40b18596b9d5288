"""A baseline tree for the benches' `--baseline REF`: REF checked out in a temporary git worktree,
measured by the same script in a child process in the same run, then removed."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
