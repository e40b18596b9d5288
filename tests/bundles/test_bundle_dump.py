"""`taugrid-evidence bundle RUN --from-dump DIR`: contents, hashes, redaction, bad input, re-redaction."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from collector.cli import main
from exporters.bundles.writer import verify
from tests.bundles.scenario import LATE_RANK, NS, RUN, SECRETS, leaks, write_scenario
from tests.dumpkit import ts

AT = "2026-01-10T12:00:00Z"


def run_cli(*args: str, code: int = 0) -> str:
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == code, res.output + (res.stderr if res.stderr_bytes else "")
    return res.stdout


def bundle(tmp: Path, *extra: str, dump: Path | None = None, artifacts: bool = True) -> Path:
    dump = dump or write_scenario(tmp / "dump")
    args = ["bundle", RUN, "--from-dump", str(dump), "--at", AT, "--out", str(tmp / "out")]
    if artifacts and (tmp / "artifacts").is_dir():
        args += ["--artifacts", str(tmp / "artifacts")]
    return Path(run_cli(*args, *extra).strip())


def manifest(b: Path) -> dict[str, Any]:
    m: dict[str, Any] = json.loads((b / "manifest.json").read_text())
    return m


def test_bundle_from_a_dump_holds_everything_and_hashes_match(tmp_path: Path) -> None:
    b = bundle(tmp_path)
    assert b.name == f"{NS}.{RUN}.20260110T120000Z" and b.is_dir()
    m = manifest(b)
    assert m["format"] == "taugrid-evidence-bundle/1" and m["run"]["name"] == RUN and m["run"]["uid"]
    assert m["collector_version"] == "0.1.0"
    assert m["time_range"] == {"start": "2026-01-10T11:00:00Z", "end": AT}
    assert m["claims"]["claims"]["progressing"]["observed"] == "false"
    assert m["claims"]["claims"]["progressing"]["evidence"], "evidence travels with the verdict"
    # work at risk travels too: a dump holds no checkpoint listing, so it is unknown, never 0 (issue 28)
    wr = json.loads((b / "claims.json").read_text())["work_at_risk"]
    assert wr["gpu_hours"] is None and "no checkpoint evidence" in wr["reason"] and wr["gpus"] > 0
    # Every file is listed with its size and sha256, and they match.
    listed = {f["path"]: f for f in m["files"]}
    on_disk = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(listed) == on_disk
    for rel, f in listed.items():
        data = (b / rel).read_bytes()
        assert f["bytes"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()
    assert verify(b) == []
    for rel in ("claims.json", "events.json", "index.html", "REDACTIONS.md", "timeline.json", "logs/scan.json",
                "series/progress.csv", "xids.json", "analysis/flightrec.json",
                f"objects/TauRun/{NS}/{RUN}.json", f"objects/Pod/{NS}/{RUN}-w0.json",
                f"logs/{RUN}-w0/all_containers.log", f"artifacts/{RUN}-w0/nccl_trace_rank_0.decoded.json",
                f"artifacts/{RUN}-w1/nccl_trace_rank_9.json", f"artifacts/{RUN}-w0/py-spy-dump-rank0.txt"):
        assert rel in listed, rel
    # Progress series: the Megatron steps, dated.
    rows = list(csv.DictReader((b / "series/progress.csv").open()))
    w0 = [r for r in rows if r["ref"].endswith(f"{RUN}-w0")]
    assert [int(r["step"]) for r in w0] == list(range(1, 41)) and w0[0]["at"].startswith("2026-01-10T11:10")
    scans = json.loads((b / "logs/scan.json").read_text())
    assert any(h["kind"] == "nccl-watchdog-timeout" for s in scans for h in s["hang"])
    # each signal's scan names its pod and container (its `file`, only who read it)
    assert any(s.get("ref", "").startswith("Pod/") and s.get("container") for s in scans), scans
    # Events: deduplicated with their series; the warning's count kept.
    events = json.loads((b / "events.json").read_text())
    unhealthy = [e for e in events if e["reason"] == "Unhealthy"]
    assert len(unhealthy) == 2 and all(e["count"] == 7 and e["type"] == "Warning" for e in unhealthy)
    # GPU: no node agent here, and the manifest says so.
    assert {"what": "GPU series and XIDs from NVML",
            "why": "no agent: no node agent reports for this run's nodes"} in m["missing"]
    assert not (b / "series/gpu.csv").exists()


def test_hang_suspects_are_named_with_pod_and_node(tmp_path: Path) -> None:
    m = manifest(bundle(tmp_path))
    hang = m["hang_analysis"]
    assert hang["suspects"] == [{"rank": LATE_RANK, "pod": f"{RUN}-w1", "node": "gpu-node-1",
                                 "placement": "dump found with this pod"}]
    assert "ranks diverge at collective #1580 (nccl:all_reduce)" in hang["summary"]
    assert hang["ranks_with_dumps"] == list(range(16))


def test_no_planted_secret_survives_anywhere(tmp_path: Path) -> None:
    dump = write_scenario(tmp_path / "dump")
    planted = leaks(dump) + leaks(tmp_path / "artifacts")
    for name in SECRETS:  # the test means something: every secret is really in the input
        assert any(p.startswith(f"{name} in") for p in planted), name
    b = bundle(tmp_path, dump=dump)
    assert leaks(b) == []
    report = (b / "REDACTIONS.md").read_text()
    # (AZURE_STORAGE_CONNECTION_STRING names a secret: its whole value goes by secret-assignment)
    for rule in ("secret-assignment", "api-key", "authorization-header", "sas-signature", "github-token",
                 "aws-access-key", "url-credentials", "private-key"):
        assert rule in report, rule
    assert f"objects/Pod/{NS}/{RUN}-w0.json:spec.containers[0].env[0].value" in report
    assert "metadata.annotations.example.com/api-token" in report
    assert all(v not in report for v in SECRETS.values())
    # The tarball form too, every byte of it (compressed and not).
    tar = Path(run_cli("bundle", RUN, "--from-dump", str(dump), "--at", AT, "--artifacts",
                       str(tmp_path / "artifacts"), "--out", str(tmp_path / "t" / "b.tar.gz")).strip())
    assert tar.name == "b.tar.gz"
    raw = gzip.decompress(tar.read_bytes())
    assert all(v.encode() not in raw for v in SECRETS.values())
    with tarfile.open(tar) as t:
        names = t.getnames()
    assert f"{NS}.{RUN}.20260110T120000Z/manifest.json" in names


def test_bad_input_still_gives_a_bundle_that_says_what_is_missing(tmp_path: Path) -> None:
    dump = write_scenario(tmp_path / "dump", logs=False, dumps=False)
    pod_dir = dump / NS / f"{RUN}-w1"
    pod_dir.mkdir(parents=True)
    # w1: a binary log and a previous log over the bound; w0: no logs at all.
    (pod_dir / "logs.txt").write_bytes(b"\x7fELF\x00\x00\x01\x02" * 512)
    (pod_dir / "main-previous.txt").write_text("".join(f"line {i} step {i}\n" for i in range(200_000)))
    arts = tmp_path / "artifacts" / f"{RUN}-w0"
    arts.mkdir(parents=True)
    (arts / "nccl_trace_rank_0").write_bytes(b"\x80\x02cos\nsystem\nq\x00.")
    (arts / "trace.pt.trace.json").write_bytes(b"\x00\x01binary")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("bundles:\n  log_tail_bytes: 65536\n")
    b = bundle(tmp_path, "--config", str(cfg), dump=dump)
    m = manifest(b)
    why = {x["what"]: x["why"] for x in m["missing"]}
    assert why[f"log {RUN}-w0/all containers"] == "no logs.txt in the dump"
    assert why[f"log {RUN}-w1/all containers"].startswith("binary content")
    assert "earlier bytes past the 65536 byte tail bound" in why[f"log {RUN}-w1/main (previous): head"]
    assert "refusing global os.system" in why[f"artifact {RUN}-w0/nccl_trace_rank_0"]
    assert why[f"artifact {RUN}-w0/trace.pt.trace.json"].startswith("binary")
    prev = (b / f"logs/{RUN}-w1/main.previous.log").read_text()
    assert len(prev.encode()) <= 65536 + 100 and prev.startswith("# taugrid-evidence: last")
    assert prev.rstrip().endswith("line 199999 step 199999")
    assert not (b / f"logs/{RUN}-w1/all_containers.log").exists()
    assert verify(b) == []


def test_unknown_run_is_a_clear_error(tmp_path: Path) -> None:
    dump = write_scenario(tmp_path / "dump", dumps=False)
    res = CliRunner().invoke(main, ["bundle", "nope", "--from-dump", str(dump), "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and "no run matches nope; runs: research/llm-pretrain" in res.output


@pytest.mark.parametrize("tarball", [False, True])
def test_bundle_redact_reapplies_rules_and_updates_hashes(tmp_path: Path, tarball: bool) -> None:
    b = bundle(tmp_path)
    # An old bundle, written before a rule existed: a token in a log file and in an object.
    late = "xoxb-" + "123456789012-abcdefghijklmnop"
    log = b / f"logs/{RUN}-w0/all_containers.log"
    log.write_text(log.read_text() + f"slack {late}\n")
    obj = b / f"objects/TauRun/{NS}/{RUN}.json"
    doc = json.loads(obj.read_text())
    doc["versions"][0]["object"]["metadata"]["labels"] = {"note": f"posted with {late}"}
    obj.write_text(json.dumps(doc))
    assert verify(b) != []  # hashes no longer match what was changed by hand
    target = b
    if tarball:
        target = b.parent / f"{b.name}.tar.gz"
        with tarfile.open(target, "w:gz") as t:
            t.add(b, arcname=b.name)
    out = run_cli("bundle", "redact", str(target))
    assert "2 more value(s) redacted" in out
    if tarball:
        work = tmp_path / "x"
        with tarfile.open(target) as t:
            t.extractall(work, filter="data")
        b = work / b.name
    assert late not in "".join(p.read_text(errors="replace") for p in b.rglob("*") if p.is_file())
    assert verify(b) == []
    m = manifest(b)
    assert len(m["redactions"]) == 2 and m["redactions"][1]["values"] == 2
    report = (b / "REDACTIONS.md").read_text()
    assert "## Re-redaction" in report and f"logs/{RUN}-w0/all_containers.log` | slack-token | 1" in report
    assert "labels.note` | slack-token | 1" in report


def test_explain_links_the_latest_bundle(tmp_path: Path) -> None:
    dump = write_scenario(tmp_path / "dump", dumps=False)
    out = tmp_path / "bundles"
    run_cli("bundle", RUN, "--from-dump", str(dump), "--at", "2026-01-10T11:50:00Z", "--out", str(out))
    run_cli("bundle", RUN, "--from-dump", str(dump), "--at", AT, "--out", str(out))
    text = run_cli("explain", "--from-dump", str(dump), "--at", ts_at(), "--bundles", str(out))
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("evidence"))
    assert line.strip() == f"evidence      {out / f'{NS}.{RUN}.20260110T120000Z'}"
    plain = run_cli("explain", "--from-dump", str(dump), "--at", ts_at(), "--bundles", str(tmp_path / "none"))
    assert "evidence " not in plain


def ts_at() -> str:
    from tests.bundles.scenario import NOW

    return ts(NOW)


def test_redaction_is_idempotent(tmp_path: Path) -> None:
    b = bundle(tmp_path)
    before = {p: p.read_bytes() for p in b.rglob("*") if p.is_file() and p.name not in ("manifest.json",
                                                                                         "REDACTIONS.md")}
    assert "0 more value(s) redacted" in run_cli("bundle", "redact", str(b))
    assert {p: p.read_bytes() for p in before} == before
