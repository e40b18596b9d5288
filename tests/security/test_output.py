"""What tenants write reaches output safely: no terminal control, no secrets (issue 8).

Each test first checks, on the claims themselves, that the hostile text really reaches a reason
or evidence (the control), then that the output shows it escaped or redacted.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from collector.claims import evaluate
from collector.cli import main
from collector.correlate import build_index
from collector.model import RunClaims
from collector.settings import Settings
from collector.sources.dump import load_dump
from exporters.prometheus import ClaimsExporter, new_registry, render
from tests.dumpkit import event, fixture_status, pod, ts, write_dump
from tests.test_explain_fixtures import NOW, taurun

GH_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
ACCOUNT_KEY = "c2VjcmV0LWtleS0xMjM0NTY3ODkw"
PASSWORD = "hunter2-Sup3rS3cret"
OSC_TITLE = "\x1b]0;all runs verified\x07"
OSC_LINK = "\x1b]8;;https://evil.example/\x07click me\x1b]8;;\x07"
OVERWRITE = "\r\x1b[2K  progressing   verified      all runs verified\b\b\b"
MARKUP = "[bold green]verified[/] [link=https://evil.example]docs[/link]"


def hostile_dump(tmp_path: Path) -> Path:
    tr = taurun("llm", "research", "Running", NOW - timedelta(hours=1), workers=2)
    ok = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"},
             ready=False, containers=[{
                 "name": "main", "ready": False, "restartCount": 0,
                 "state": {"waiting": {"reason": "CreateContainerConfigError",
                                       "message": f"{OSC_TITLE}AccountKey={ACCOUNT_KEY}; couldn't find key"}}}])
    pending = pod("llm-w1", "research", NOW - timedelta(minutes=30), node=None, gpus=8,
                  labels={"taugrid.io/run": "llm"}, phase="Pending")
    ev = event("llm-w1.1", "research", pending, "FailedScheduling",
               f"0/4 nodes: {MARKUP} password={PASSWORD} {GH_TOKEN}{OVERWRITE}{OSC_LINK}",
               NOW - timedelta(minutes=1), type_="Warning", component="default-scheduler")
    return write_dump(tmp_path / "d", [tr, ok, pending, ev])


def claims_of(dump: Path) -> list[RunClaims]:
    d = load_dump(dump)
    index = build_index(d.records)
    index.synced.update(dict.fromkeys(d.snapshot_kinds(), NOW))
    return [evaluate(ev, NOW, Settings().claims) for ev in index.all_evidence()]


def raw_text(claims: list[RunClaims]) -> str:
    return json.dumps([c.to_json() for c in claims])


def test_control_the_hostile_text_reaches_the_claims(tmp_path: Path) -> None:
    raw = raw_text(claims_of(hostile_dump(tmp_path)))
    assert GH_TOKEN in raw and ACCOUNT_KEY in raw and PASSWORD in raw
    assert json.dumps(OVERWRITE)[1:-1] in raw and json.dumps(OSC_TITLE)[1:-1] in raw


def test_explain_text_escapes_control_characters_and_redacts(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(hostile_dump(tmp_path)), "--at", ts(NOW)])
    out = r.stdout
    assert "research/llm" in out
    assert not any(c in out for c in ("\x1b", "\r", "\b", "\x07")), repr(out)
    assert "\\x1b]0;" in out or "\\x1b]8;" in out  # shown, escaped: nobody can hide it
    for secret in (GH_TOKEN, ACCOUNT_KEY, PASSWORD):
        assert secret not in out
    assert "[REDACTED]" in out and "[REDACTED]]" not in out


def test_explain_json_redacts_every_free_text_field(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(hostile_dump(tmp_path)), "--at", ts(NOW), "-o",
                                  "json"])
    doc = json.loads(r.stdout)
    text = json.dumps(doc)
    for secret in (GH_TOKEN, ACCOUNT_KEY, PASSWORD):
        assert secret not in text
    assert "[REDACTED]" in text


def test_stderr_problems_are_escaped(tmp_path: Path) -> None:
    dump = hostile_dump(tmp_path)
    (dump / f"evil{OSC_TITLE}.json").write_text("{not json")
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", ts(NOW)])
    assert "\x1b" not in r.stderr and "\\x1b]0;all runs verified\\x07" in r.stderr


def test_prometheus_carries_no_free_text(tmp_path: Path) -> None:
    registry = new_registry()
    exporter = ClaimsExporter(registry, retention=timedelta(minutes=15))
    exporter.update(claims_of(hostile_dump(tmp_path)), NOW)
    body = render(registry).decode()
    assert 'run="llm"' in body
    for secret in (GH_TOKEN, ACCOUNT_KEY, PASSWORD, "all runs verified", "evil.example"):
        assert secret not in body


def test_demo_table_never_interprets_markup_from_data(tmp_path: Path) -> None:
    from collector.demo import table

    claims = claims_of(hostile_dump(tmp_path))
    buf = io.StringIO()
    Console(file=buf, width=400, force_terminal=False, color_system=None).print(table(claims, "t"))
    shown = buf.getvalue()
    assert "[bold green]verified[/]" in shown  # printed as written, not interpreted
    assert GH_TOKEN not in shown and "\x1b" not in shown


def test_condition_messages_are_redacted_too(tmp_path: Path) -> None:
    from tests.test_explain_fixtures import T0, kueue_job, workload_for

    job = kueue_job("train", "team-a", T0, suspend=True, queue="user-queue")
    wl = workload_for(job, fixture_status("kueue/workload_pending_insufficient_quota_kueue_docs.yaml"),
                      queue="user-queue")
    wl["status"]["conditions"][0]["message"] = f"couldn't assign flavors; api_key={PASSWORD}{OSC_TITLE}"
    dump = write_dump(tmp_path / "d", [job, wl])
    assert PASSWORD in raw_text(claims_of(dump))  # control: the condition message reaches the claims
    for args in ([], ["-o", "json"]):
        r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), *args])
        assert PASSWORD not in r.stdout and "\x1b" not in r.stdout and "[REDACTED]" in r.stdout
