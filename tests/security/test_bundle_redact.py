"""`bundle redact` on bundles that are not what the writer left (issue 26, round 2).

A bundle is handed around and edited; `bundle redact` is how a leak found later is taken out. It
left files it did not know unredacted and re-hashed them (`*.log.1`, `.jsonl`, `.gz`, `.html`,
extra manifest keys), kept a stale `index.html`, stopped half-way on a bad `timeline.json`, and
unpacked any archive whole (a 0.9 MB tarball with a 300 MB member exhausted memory). Now it works on
a copy and swaps it in at the end, redacts or removes every file, and caps what an archive unpacks.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import resource
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from collector.cli import main
from exporters.bundles.writer import verify
from tests.bundles.scenario import RUN, write_scenario

AT = "2026-01-10T12:00:00Z"
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "ghp_" + "L8k7J6h5G4f3D2s1A0q9W8e7R6t5Y4u3I2o1"
HOOK = "https://hooks.slack.com/services/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"


def fresh_bundle(tmp_path: Path) -> Path:
    dump = write_scenario(tmp_path / "dump", dumps=False)
    r = CliRunner().invoke(main, ["bundle", RUN, "--from-dump", str(dump), "--at", AT, "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    return Path(r.stdout.strip())


def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def leaked(root: Path) -> list[str]:
    out = []
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        data = p.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        for secret in (TOKEN, HOOK.rsplit("/", 1)[1], "tr0ub4dor-J7"):
            if secret.encode() in data or json.dumps(secret)[1:-1].encode() in data:
                out.append(f"{secret[:8]}… in {p.relative_to(root)}")
    return out


def redact(target: Path, code: int = 0) -> str:
    r = CliRunner().invoke(main, ["bundle", "redact", str(target)])
    assert r.exit_code == code, r.output
    return r.output


def plant_unknown_files(b: Path) -> None:
    log_dir = next(p for p in sorted((b / "logs").iterdir()) if p.is_dir())
    (log_dir / "main.log.1").write_text(f"rotated: clone with {TOKEN}\n")
    (b / "events.jsonl").write_text(json.dumps({"msg": "login", "password": "tr0ub4dor-J7"}) + "\n"
                                    + f"not json: notify {HOOK}\n")
    (b / "extra.log.gz").write_bytes(gzip.compress(f"token {TOKEN}\n".encode()))
    (b / "notes.html").write_text(f"<p>token&#58; {TOKEN}</p>")
    (b / "notes.txt").write_text("DB_PASSWORD=tr0ub4dor-J7\n")
    m = json.loads((b / "manifest.json").read_text())
    m["operator_notes"] = {"webhook": HOOK, "seen": f"leaked {TOKEN}"}
    (b / "manifest.json").write_text(json.dumps(m))


def test_every_file_is_redacted_or_removed_and_the_manifest_says_so(tmp_path: Path) -> None:
    b = fresh_bundle(tmp_path)
    plant_unknown_files(b)
    assert leaked(b)  # control
    redact(b)
    assert leaked(b) == []
    assert verify(b) == []
    m: dict[str, Any] = json.loads((b / "manifest.json").read_text())
    listed = {f["path"] for f in m["files"]}
    on_disk = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()} - {"manifest.json"}
    assert listed == on_disk
    assert "extra.log.gz" not in on_disk and "notes.html" not in on_disk  # cannot be redacted: removed
    why = {x["what"]: x["why"] for x in m["missing"]}
    assert "removed by bundle redact" in why["extra.log.gz"] and "removed by bundle redact" in why["notes.html"]
    assert "[REDACTED]" in (b / "events.jsonl").read_text() and "login" in (b / "events.jsonl").read_text()
    assert m["operator_notes"]["seen"] == "leaked [REDACTED]"


def test_a_stale_index_html_is_rebuilt_or_removed(tmp_path: Path) -> None:
    b = fresh_bundle(tmp_path)
    (b / "index.html").write_text(f"<html>stale page with {TOKEN}</html>")
    redact(b)
    page = (b / "index.html").read_text()
    assert TOKEN not in page and "Claims now" in page  # rebuilt from timeline.json
    (b / "index.html").write_text(f"<html>stale page with {TOKEN}</html>")
    (b / "timeline.json").unlink()
    redact(b)
    assert not (b / "index.html").exists() and leaked(b) == []
    assert verify(b) == []


def test_a_bad_timeline_json_is_redacted_as_text_and_the_page_removed(tmp_path: Path) -> None:
    b = fresh_bundle(tmp_path)
    (b / "timeline.json").write_text(f'{{"run": "x", "events": [{{"message": "token {TOKEN}"')  # cut short
    log = next(p for p in sorted((b / "logs").iterdir()) if p.is_dir()) / "all_containers.log"
    log.write_text(log.read_text() + f"late {TOKEN}\n")
    redact(b)
    assert leaked(b) == [] and verify(b) == []
    assert not (b / "index.html").exists()
    why = {x["what"]: x["why"] for x in json.loads((b / "manifest.json").read_text())["missing"]}
    assert "timeline.json" in why["index.html"]


def test_a_failure_half_way_leaves_the_bundle_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = fresh_bundle(tmp_path)
    plant_unknown_files(b)
    before = snapshot(b)

    def boom(*_: Any, **__: Any) -> str:
        raise OSError("disk full")

    import exporters.bundles.timeline as timeline

    monkeypatch.setattr(timeline, "render_page", boom)
    for mod in list(sys.modules.values()):  # wherever it was imported by name
        if getattr(mod, "render_page", None) is not None and getattr(mod, "__name__", "").startswith("exporters"):
            monkeypatch.setattr(mod, "render_page", boom)
    redact(b, code=1)
    assert snapshot(b) == before
    assert [p.name for p in b.parent.iterdir()] == [b.name]  # no work directory left behind


def _tar(path: Path, members: list[tuple[str, int, bytes]]) -> None:
    """(name, size, repeated block) members, streamed: nothing of that size is held in memory."""

    class Repeat(io.RawIOBase):
        def __init__(self, block: bytes, size: int) -> None:
            self.block, self.left = block, size

        def readable(self) -> bool:
            return True

        def readinto(self, buf: Any) -> int:
            n = min(len(buf), self.left)
            view = memoryview(buf)
            done = 0
            while done < n:
                k = min(len(self.block), n - done)
                view[done:done + k] = self.block[:k]
                done += k
            self.left -= n
            return n

    with tarfile.open(path, "w:gz", compresslevel=9) as t:
        for name, size, block in members:
            info = tarfile.TarInfo(name)
            info.size = size
            t.addfile(info, io.BufferedReader(Repeat(block, size), 1 << 20) if size else None)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_an_archive_with_a_huge_member_is_refused_without_exhausting_memory(tmp_path: Path) -> None:
    arch = tmp_path / "b.tar.gz"
    line = b"step 1 loss 2.0 password=hunter2 " + b"0" * 2000 + b"\n"
    _tar(arch, [("b/manifest.json", 2, b"{}"), ("b/logs/w0/main.log", 300 << 20, line)])
    assert arch.stat().st_size < 1 << 20  # under a megabyte on disk
    before = arch.read_bytes()
    code = "import sys; from collector.cli import main; main(['bundle', 'redact', sys.argv[1]])"
    proc = subprocess.run([sys.executable, "-c", code, str(arch)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, preexec_fn=_limit_memory)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "MemoryError" not in proc.stderr and "bytes" in proc.stderr and "limit" in proc.stderr
    assert arch.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["b.tar.gz"]


def test_an_archive_with_too_many_members_is_refused(tmp_path: Path) -> None:
    arch = tmp_path / "many.tar.gz"
    _tar(arch, [("b/manifest.json", 2, b"{}")] + [(f"b/logs/{i}.log", 0, b"") for i in range(25_000)])
    before = arch.read_bytes()
    out = redact(arch, code=1)
    assert "members" in out and arch.read_bytes() == before
