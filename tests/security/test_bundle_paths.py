"""`bundle --from-dump` with a dump whose names are paths (issue 26, round 2).

A dump is from anyone. Its pod and namespace names become paths (`<dump>/<ns>/<pod>/logs.txt`,
`<out>/<ns>.<run>.<time>`): an absolute name or one holding `..` read the analyst's files into the
bundle and wrote (and `rmtree`d) outside `--out`; a pod directory that is a symlink read wherever
it pointed. Such names are refused when the dump is loaded, and every path stays inside the dump or
`--out`.
"""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from collector.cli import main
from collector.sources.dump import load_dump
from exporters.bundles.model import bundle_name
from exporters.bundles.storage import LocalStore
from tests.dumpkit import pod, write_dump
from tests.test_explain_fixtures import NOW, taurun

AT = "2026-01-10T12:00:00Z"
PRIVATE = "ANALYST-PRIVATE-7f3a"


def analyst_home(tmp_path: Path) -> Path:
    """Files on the analyst's machine that no bundle may hold."""
    home = tmp_path / "analyst"
    home.mkdir()
    (home / "logs.txt").write_text(f"{PRIVATE} ssh config\n")
    (home / "notes.txt").write_text(f"{PRIVATE} notes\n")
    (home / "cloud.json").write_text(f'{{"note": "{PRIVATE}"}}')
    return home


def dump_with(tmp_path: Path, ns: str, pod_name: str) -> Path:
    tr = taurun("llm", ns, "Running", NOW - timedelta(hours=1), workers=1)
    w0 = pod(pod_name, ns, NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    return write_dump(tmp_path / "dump", [tr, w0])


def run_bundle(dump: Path, out: Path) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["bundle", "llm", "--from-dump", str(dump), "--at", AT, "--out", str(out)])
    return r.exit_code, r.output


def everything_under(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def test_an_absolute_pod_name_does_not_read_the_analysts_files(tmp_path: Path) -> None:
    home = analyst_home(tmp_path)
    dump = dump_with(tmp_path, "research", str(home))
    code, output = run_bundle(dump, tmp_path / "out")
    assert PRIVATE not in everything_under(tmp_path / "out")
    assert PRIVATE not in output
    d = load_dump(dump)
    assert not [r for r in d.records if r.ref.name == str(home)], "refused at load"
    assert any("refused" in p.message and p.skipped for p in d.problems)


@pytest.mark.parametrize("pod_name", ["../../analyst", "..", "llm-w0/../../../analyst"])
def test_a_pod_name_with_dotdot_does_not_leave_the_dump(tmp_path: Path, pod_name: str) -> None:
    analyst_home(tmp_path)
    dump = dump_with(tmp_path, "research", pod_name)
    run_bundle(dump, tmp_path / "out")
    assert PRIVATE not in everything_under(tmp_path / "out")
    assert not [r for r in load_dump(dump).records if r.ref.kind == "Pod"]


def test_a_namespace_that_is_a_path_writes_and_deletes_nothing_outside_out(tmp_path: Path) -> None:
    victim = tmp_path / "victim.llm.20260110T120000Z"  # where `<ns>.<run>.<time>` lands for ns = .../victim
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    for ns in (str(tmp_path / "victim"), "../../victim"):
        dump = dump_with(tmp_path / ns.replace("/", "_"), ns, "llm-w0")
        out = tmp_path / "out"
        code, output = run_bundle(dump, out)
        assert (victim / "precious.txt").read_text() == "keep me"
        assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
        outside = [p for p in tmp_path.rglob("manifest.json") if out not in p.parents]
        assert outside == []
        assert code != 0 and "no run matches llm" in output  # its objects were refused at load


def test_a_pod_directory_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    home = analyst_home(tmp_path)
    dump = dump_with(tmp_path, "research", "llm-w0")
    (dump / "research" / "llm-w0").symlink_to(home, target_is_directory=True)
    code, output = run_bundle(dump, tmp_path / "out")
    assert code == 0, output
    bundle = next((tmp_path / "out").iterdir())
    assert PRIVATE not in everything_under(bundle)
    manifest = (bundle / "manifest.json").read_text()
    assert "symbolic link" in manifest or "outside the dump" in manifest  # said, not silently dropped


def test_a_namespace_directory_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    home = analyst_home(tmp_path)
    (home / "llm-w0").mkdir()
    (home / "llm-w0" / "logs.txt").write_text(f"{PRIVATE} via the namespace link\n")
    dump = write_dump(tmp_path / "dump", [])
    tr = taurun("llm", "research", "Running", NOW - timedelta(hours=1), workers=1)
    w0 = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    write_dump(dump, [tr])
    (dump / "pods.json").write_text(json.dumps({"kind": "PodList", "apiVersion": "v1", "items": [w0]}))
    shutil.rmtree(dump / "research")  # (write_dump writes the namespace's empty lists, as kubectl does)
    (dump / "research").symlink_to(home, target_is_directory=True)
    code, output = run_bundle(dump, tmp_path / "out")
    assert code == 0, output
    assert PRIVATE not in everything_under(tmp_path / "out")


def test_bundle_names_and_store_puts_stay_one_path_component(tmp_path: Path) -> None:
    for ns, name in (("..", "x"), ("a/b", "x"), ("ns", "../x"), ("/abs", "x")):
        with pytest.raises(ValueError):
            bundle_name(ns, name, NOW)
    src = tmp_path / "b"
    src.mkdir()
    (src / "manifest.json").write_text("{}")
    store = LocalStore(tmp_path / "store")
    for bad in ("../escape", "/abs/escape", "..", "a/b"):
        with pytest.raises(ValueError):
            store.put(src, bad)
    assert not (tmp_path / "escape").exists()
