"""Hostile dump files: alias bombs, huge files, duplicate keys, links out, FIFOs, odd names (issue 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from collector.cli import EXIT_SKIPPED, main
from collector.config import ConfigError, load_settings
from collector.sources.dump import load_dump
from tests.dumpkit import pod, write_dump
from tests.test_explain_fixtures import NOW, taurun

EXE = str(Path(sys.executable).with_name("taugrid-evidence"))

# 9 levels of 10: 10^9 list items once expanded, 400 bytes on disk.
ALIAS_BOMB = "\n".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    + ["kind: Pod", "metadata: {name: bomb, namespace: research}"]
) + "\n"


def base_dump(tmp_path: Path) -> Path:
    tr = taurun("llm", "research", "Running", NOW - timedelta(hours=1), workers=1)
    p = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    return write_dump(tmp_path / "d", [tr, p])


def explain_text(dump: Path, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", "2026-01-10T12:00:00Z", *args])
    return r.exit_code, r.stdout, r.stderr


def test_yaml_alias_bomb_is_refused_and_named(tmp_path: Path) -> None:
    dump = base_dump(tmp_path)
    (dump / "bomb.yaml").write_text(ALIAS_BOMB)
    started = time.monotonic()
    code, out, err = explain_text(dump)
    assert time.monotonic() - started < 10
    assert code == EXIT_SKIPPED
    assert "bomb.yaml" in err and "alias" in err
    assert "research/llm" in out  # the rest of the dump is still evaluated


def test_alias_bomb_in_a_settings_file_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(ALIAS_BOMB.replace("kind: Pod\nmetadata: {name: bomb, namespace: research}\n", ""))
    with pytest.raises(ConfigError, match="alias"):
        load_settings(cfg)


def test_oversized_object_files_are_skipped_with_a_clear_message(tmp_path: Path) -> None:
    dump = base_dump(tmp_path)
    big = {"kind": "List", "apiVersion": "v1", "items": [], "padding": "x" * 200_000}
    (dump / "big.json").write_text(json.dumps(big))
    code, out, err = explain_text(dump, "--max-file-bytes", "100000")
    assert code == EXIT_SKIPPED
    assert "big.json" in err and "over the 100000-byte limit" in err
    assert "research/llm" in out


def test_duplicate_keys_are_warned_not_silently_resolved(tmp_path: Path) -> None:
    dump = base_dump(tmp_path)
    (dump / "dup.json").write_text('{"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "a", '
                                   '"namespace": "research", "name": "b"}, '
                                   '"status": {"phase": "Running", "phase": "Failed"}}')
    (dump / "dup.yaml").write_text("kind: Pod\napiVersion: v1\nmetadata:\n  name: c\n  namespace: research\n"
                                   "  name: d\n")
    code, _, err = explain_text(dump)
    assert code == 0  # read, with warnings
    assert "dup.json: duplicate key 'name'" in err and "dup.json: duplicate key 'phase'" in err
    assert "dup.yaml: duplicate key 'name' at line 6" in err


def test_a_symlink_leaving_the_dump_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "shadow.json"
    secret.write_text(json.dumps({"kind": "Pod", "apiVersion": "v1",
                                  "metadata": {"name": "from-outside", "namespace": "research"}}))
    dump = base_dump(tmp_path)
    (dump / "research" / "stolen.json").symlink_to(secret)
    (dump / "linked-dir").symlink_to(outside, target_is_directory=True)
    (dump / "inside.json").symlink_to(dump / "crds.json")  # a link that stays inside is fine
    d = load_dump(dump)
    assert all(r.ref.name != "from-outside" for r in d.records)
    msgs = [str(p) for p in d.problems]
    assert "research/stolen.json: symbolic link leading out of the dump; not followed" in msgs
    assert "linked-dir: symbolic link leading out of the dump; not followed" in msgs
    assert not any("inside.json" in m for m in msgs)


def test_fifos_are_skipped_and_named_without_hanging(tmp_path: Path) -> None:
    dump = base_dump(tmp_path)
    os.mkfifo(dump / "research" / "pipe.json")
    os.mkfifo(dump / "research" / "llm-w0-logs.txt")
    (dump / "research" / "llm-w0").mkdir(exist_ok=True)
    os.mkfifo(dump / "research" / "llm-w0" / "logs.txt")
    proc = subprocess.run([EXE, "explain", "--from-dump", str(dump), "--at", "2026-01-10T12:00:00Z"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_SKIPPED
    assert "research/pipe.json: not a regular file (a FIFO); not read" in proc.stderr
    assert "research/llm-w0/logs.txt: not a regular file (a FIFO); not read" in proc.stderr
    assert "research/llm" in proc.stdout


def test_scan_skips_a_fifo_instead_of_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    real = tmp_path / "real.log"
    real.write_text("step=1 loss=2.0\n")
    proc = subprocess.run([EXE, "scan", str(fifo), str(real)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_SKIPPED
    assert f"{fifo}: a FIFO; only regular files are scanned" in proc.stderr
    assert str(real) in proc.stdout


def test_names_with_slashes_or_dotdot_are_refused_and_non_rfc3339_times_are_warned(tmp_path: Path) -> None:
    dump = base_dump(tmp_path)
    odd = {"kind": "List", "apiVersion": "v1", "items": [
        {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "../../etc", "namespace": "research"}},
        {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "ok", "namespace": "research",
                                                         "creationTimestamp": "2026-01-10"}},
        {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "ok2", "namespace": "research",
                                                         "creationTimestamp": "2026-01-10T11:00"}},
    ]}
    (dump / "odd.json").write_text(json.dumps(odd))
    code, _, err = explain_text(dump)
    assert code == EXIT_SKIPPED  # issue 26: such a name becomes a path; the object is refused, not read
    assert "'../../etc' holds '/' or '..'" in err and "refused" in err
    assert "'2026-01-10' is not RFC3339" in err and "'2026-01-10T11:00' is not RFC3339" in err
