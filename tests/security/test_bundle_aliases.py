"""An alias bomb through bundles (issue 26, round 2).

`explain` refuses YAML aliases (tests/security/test_dump_input.py), but the bundle's raw-object copy
re-read the dump's files with a plain YAML loader: a file repeating one of the run's objects with a
kilobyte of nested aliases expanded to gigabytes when the bundle serialized it. One safe loader and
one size cap serve both readers now.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from collector.cli import main
from tests.dumpkit import pod, write_dump
from tests.test_explain_fixtures import NOW, taurun

AT = "2026-01-10T12:00:00Z"
ROOT = Path(__file__).resolve().parents[2]


def bomb(levels: int) -> str:
    """The run's TauRun again, its spec holding `levels` of nine-fold nested aliases."""
    names = [chr(ord("a") + i) for i in range(levels)]
    lines = ["apiVersion: taugrid.io/v1alpha1", "kind: TauRun",
             "metadata: {name: llm, namespace: research, creationTimestamp: '2026-01-10T11:00:00Z'}",
             "status: {phase: Running}", "spec:", "  profile: a100-2x8", "  workers: 1",
             f"  {names[0]}: &{names[0]} [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for prev, cur in zip(names, names[1:], strict=False):
        lines.append(f"  {cur}: &{cur} [{', '.join(['*' + prev] * 9)}]")
    return "\n".join(lines) + "\n"


def dump(tmp_path: Path, levels: int) -> Path:
    tr = taurun("llm", "research", "Running", NOW - timedelta(hours=1), workers=1)
    w0 = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    d = write_dump(tmp_path / "dump", [tr, w0])
    (d / "zz-bomb.yaml").write_text(bomb(levels))
    return d


def test_the_raw_object_copy_refuses_the_file_the_dump_loader_refused(tmp_path: Path) -> None:
    d = dump(tmp_path, 6)  # 9^6 strings once expanded: small enough to show the expansion, not to hurt
    r = CliRunner().invoke(main, ["bundle", "llm", "--from-dump", str(d), "--at", AT, "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    b = Path(r.stdout.strip())
    history = json.loads((b / "objects/TauRun/research/llm.json").read_text())
    assert len(history["versions"]) == 1  # the good file's version only
    assert "lol" not in json.dumps(history)
    missing = json.loads((b / "manifest.json").read_text())["missing"]
    assert any("zz-bomb.yaml" in m["what"] and "alias" in m["why"] for m in missing)  # said, once


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_a_full_size_alias_bomb_does_not_exhaust_memory(tmp_path: Path) -> None:
    d = dump(tmp_path, 10)  # ~1 KB; 9^10 strings (tens of GB of JSON) once expanded
    code = ("import sys; from collector.cli import main; "
            "main(['bundle', 'llm', '--from-dump', sys.argv[1], '--at', sys.argv[2], '--out', sys.argv[3]])")
    proc = subprocess.run([sys.executable, "-c", code, str(d), AT, str(tmp_path / "o")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, preexec_fn=_limit_memory)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "MemoryError" not in proc.stderr
    b = Path(proc.stdout.strip())
    assert (b / "manifest.json").is_file() and "lol" not in (b / "objects/TauRun/research/llm.json").read_text()
