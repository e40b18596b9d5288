"""The controller's /runs and /runs/NAMESPACE/NAME (behind /metrics' token), and `explain --controller`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import taugrid_evidence as te
from collector.endpoints import HttpOptions
from collector.runsapi import BadDocument, decode_runs, dns1123_label, dns1123_subdomain
from kubesim.clock import ManualClock
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, apply_run, observed, start, wait_until

REPO = Path(__file__).resolve().parents[2]


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (a loopback test URL)
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def explain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from collector.cli import main; main()", "explain", *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
                          cwd=REPO, check=False)


def test_runs_are_served_with_their_history_behind_the_metrics_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    clock = ManualClock(T0)
    with Simulator(settings=FAST, watch_window=50) as sim:
        sim.start()
        apply_run(sim, "r1")
        ctl = start(sim, clock)
        try:
            port = ctl.serve("127.0.0.1", 0, HttpOptions(token_file=token))
            base = f"http://127.0.0.1:{port}"
            wait_until(lambda: observed(ctl, "r1").get("running") == "true", what="r1 running")
            apply_run(sim, "r1", crash=True)  # the run's pod crash-loops: running goes false
            wait_until(lambda: observed(ctl, "r1").get("running") == "false", what="r1 crashing")

            assert get(f"{base}/runs")[0] == 401  # the same token as /metrics
            assert get(f"{base}/runs/research/r1", "wrong")[0] == 401
            assert get(f"{base}/healthz")[0] == 200  # probes stay open
            code, body = get(f"{base}/runs", "s3cret")
            assert code == 200
            doc = json.loads(body)
            (run,) = doc["runs"]
            assert (run["namespace"], run["name"]) == ("research", "r1")
            assert run["claims"]["running"]["observed"] == "false"
            moves = [(h["claim"], (h["from"] or {}).get("observed"), h["to"]["observed"])
                     for h in run["history"] if h["claim"] == "running"]
            assert moves[-1] == ("running", "true", "false"), run["history"]

            code, body = get(f"{base}/runs/research/r1", "s3cret")
            assert code == 200 and [r["name"] for r in json.loads(body)["runs"]] == ["r1"]
            assert get(f"{base}/runs/research/nope", "s3cret")[0] == 404
            for bad in ("Research/r1", "research/R1", "research/a..b", "-x/r1", "research/%2e%2e", "a" * 64 + "/r1"):
                code, body = get(f"{base}/runs/{bad}", "s3cret")
                assert code == 400 and bad.encode() not in body, bad
            assert get(f"{base}/runs/research/r1/extra", "s3cret")[0] == 404
            code, body = get(f"{base}/runs/research", "s3cret")  # one namespace's runs
            assert code == 200 and [r["name"] for r in json.loads(body)["runs"]] == ["r1"]
            code, body = get(f"{base}/runs/elsewhere", "s3cret")
            assert code == 200 and json.loads(body)["runs"] == []
            for bad in ("Research", "a..b", "-x", "%2e%2e"):
                code, body = get(f"{base}/runs/{bad}", "s3cret")
                assert code == 400 and bad.encode() not in body, bad
            assert get(f"{base}/runs/research")[0] == 401

            # explain --controller prints it with explain's renderer, history included.
            out = explain("--controller", base, "--token-file", str(token), "research/r1")
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith("research/r1   TauRun")
            assert "running       contradicted" in out.stdout
            assert "research/r1 history (the controller's, oldest first):" in out.stdout
            js = explain("--controller", base, "--token-file", str(token), "-n", "research", "r1", "-o", "json")
            assert js.returncode == 0, js.stderr
            again = json.loads(js.stdout)["runs"][0]
            assert again["claims"] == run["claims"] and again["history"] == run["history"]
            ex = te.explain("research/r1", controller=base, token_file=token)
            assert ex.source == f"controller:{base}" and list(ex.runs["name"]) == ["r1"]
            moved = ex.transitions[ex.transitions["claim"] == "running"].iloc[-1]
            assert (moved["from_observed"], moved["to_observed"]) == ("true", "false")
            assert str(ex.transitions["at"].dtype) == "datetime64[ns, UTC]"
            denied = explain("--controller", base, "r1")
            assert denied.returncode == 1 and "HTTP 401" in denied.stderr
            bad = explain("--controller", base, "--token-file", str(token), "research/..")
            assert bad.returncode == 2 and "DNS-1123" in bad.stderr
        finally:
            ctl.close()


@pytest.mark.parametrize("doc", [
    b"not json", b"{}", b'{"evaluated_at": "x", "runs": []}',
    b'{"evaluated_at": "2026-01-01T00:00:00Z", "runs": [{"namespace": "a", "name": "b", "kind": "Job", "claims": {}}]}',
    b'{"evaluated_at": "2026-01-01T00:00:00Z", "runs": [{"namespace": "a", "name": "b", "kind": "Job", "claims": '
    b'{"scheduled": {"asserted": null, "observed": "maybe", "verdict": "pending"}}}]}',
])
def test_a_document_that_is_not_the_runs_document_is_refused(doc: bytes) -> None:
    with pytest.raises(BadDocument):
        decode_runs(doc)


def test_dns1123() -> None:
    assert dns1123_label("team-b") and not dns1123_label("Team") and not dns1123_label("a.b")
    assert dns1123_subdomain("llm-sft.v2") and not dns1123_subdomain("a..b") and not dns1123_subdomain("a/b")
    assert not dns1123_subdomain("a" * 254) and not dns1123_label("")


def test_history_keeps_the_latest_transitions_of_each_run() -> None:
    from dataclasses import replace
    from datetime import timedelta

    from collector.evaluation import unknown_claims
    from collector.model import Claim, Observed, Ref, Verdict
    from collector.runsapi import HISTORY_PER_RUN, RunHistory

    ref = Ref("TauRun", "research", "r1")
    history = RunHistory()
    base = unknown_claims(ref, None, T0, "x" * 1000)
    up = Claim(True, Observed.TRUE, Verdict.VERIFIED, T0, "up")
    for i in range(3 * HISTORY_PER_RUN):
        rc = base if i % 2 == 0 else replace(base, running=up)
        history.record([replace(rc, evaluated_at=T0 + timedelta(minutes=i))])
    kept = history.of(ref.key)
    assert len(kept) == HISTORY_PER_RUN
    assert all(h["claim"] == "running" for h in kept[1:])  # an unchanged claim makes no entry
    assert kept[-1]["to"] == {"observed": "true", "verdict": "verified"}
    assert kept[-1]["at"] == "2026-01-10T12:47:00Z"
    assert max(len(h["reason"]) for h in kept) <= 300
    history.forget(ref.key)
    assert history.of(ref.key) == []


def test_a_queued_runs_queue_status_survives_the_runs_document() -> None:
    """What the controller serves of a queued run is what `explain --controller` prints."""
    import orjson

    from collector.render import render_text, to_json
    from tests.exporters.exporter_samples import blocked_run

    rc = blocked_run()
    assert rc.queue is not None
    doc = orjson.dumps({**to_json([rc], T0), "runs": [{**r, "history": []} for r in to_json([rc], T0)["runs"]]})
    _, [(back, _)] = decode_runs(doc)
    assert back.queue == rc.queue
    assert render_text([back], T0) == render_text([rc], T0)
    assert "admission     estimated in 10m–1h30m (80% band, median 30m)" in render_text([rc], T0)


def test_stragglers_energy_and_work_at_risk_survive_the_runs_document() -> None:
    """`explain --controller` shows what the controller holds: every part of a run's record comes back
    from /runs as it went (it dropped stragglers and energy before)."""
    from datetime import UTC, datetime

    from collector.model import Claim, Energy, Observed, Ref, RunClaims, Straggler, Stragglers, Verdict
    from collector.riskfacts import NodeRisk, WorkAtRisk
    from collector.runsapi import RunHistory, decode_runs, runs_answer

    at = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    claim = Claim(None, Observed.TRUE, Verdict.VERIFIED, at, "ok")
    rc = RunClaims(Ref("TauRun", "research", "r1", "u1"), claim, claim, claim, None, at,
                   stragglers=Stragglers((Straggler("rank", "3", "r1-w3", "n3", 0.12, at, "arrival", "last 16 of 16",
                                                    1.5),
                                          Straggler("gpu", "", "r1-w1", "n1", 0.2, at, "gpu-spread", "SM clock",
                                                    gpu="GPU-1")), 8, 40, "rank 3 is 12 % slower"),
                   energy=Energy(40_000.0, 4_000.0, 8, 30.0, 300.0, "40,000 J per step", 0.5),
                   work_at_risk=WorkAtRisk(2.0, 16, at, "checkpoint", "x", 100, at,
                                           (NodeRisk("n1", 30.0, ("cordoned",), ("cordoned",), 8, 1.0),), ()))
    code, _, body = runs_answer("/runs", lambda: {rc.ref.key: rc}, lambda: at, RunHistory())
    assert code == 200
    _, [(back, _)] = decode_runs(body)
    assert back.stragglers is not None and back.energy is not None and back.work_at_risk is not None
    assert back.to_json() == rc.to_json()


def _record_as_before(history: dict[Any, list[dict[str, Any]]], last: dict[Any, Any], rc: Any) -> None:
    """RunHistory.record as it was (every claim compared, no fast path), the reference."""
    from collector.model import rfc3339
    from collector.runsapi import REASON_CHARS

    now = {k: (c.observed.value, c.verdict.value) for k, c in rc.claims.items()}  # (the state as a dict, as it was)
    now["blocked"] = (rc.blocked.stage.value if rc.blocked else "", "")
    before = last.get(rc.ref.key)
    last[rc.ref.key] = now
    hist = history.setdefault(rc.ref.key, [])
    for name, (seen, verdict) in now.items():
        old = before.get(name) if before is not None else None
        if old == (seen, verdict):
            continue
        if name == "blocked":
            if before is None and not seen:
                continue
            hist.append({"at": rfc3339(rc.evaluated_at), "claim": "blocked", "from": old[0] if old else None,
                         "to": seen or None, "reason": (rc.blocked.reason if rc.blocked else "")[:REASON_CHARS]})
            continue
        hist.append({"at": rfc3339(rc.evaluated_at), "claim": name,
                     "from": {"observed": old[0], "verdict": old[1]} if old else None,
                     "to": {"observed": seen, "verdict": verdict}, "reason": rc.claims[name].reason[:REASON_CHARS]})


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.booleans()), max_size=30))
def test_history_records_what_it_recorded_before_the_fast_path(steps: list[tuple[int, int, bool]]) -> None:
    """An evaluation with no transition returns at once: the same history as comparing every claim."""
    from dataclasses import replace
    from datetime import timedelta

    from collector.evaluation import unknown_claims
    from collector.model import Blocked, Claim, Observed, Ref, Stage, Verdict
    from collector.runsapi import HISTORY_PER_RUN, RunHistory

    history = RunHistory()
    want: dict[Any, list[dict[str, Any]]] = {}
    last: dict[Any, Any] = {}
    states = [Claim(True, Observed.TRUE, Verdict.VERIFIED, T0, "up"),
              Claim(True, Observed.FALSE, Verdict.CONTRADICTED, T0, "down"),
              Claim(None, Observed.UNKNOWN, Verdict.UNASSERTED, None, "unknown")]
    for i, (run, state, blocked) in enumerate(steps):
        ref = Ref("TauRun", "research", f"r{run % 2}")
        rc = replace(unknown_claims(ref, None, T0, "x"), running=states[state % 3],
                     progressing=states[(state + 1) % 3], evaluated_at=T0 + timedelta(minutes=i),
                     blocked=Blocked(Stage.QUEUE_ADMISSION, "queued", T0) if blocked else None)
        history.record([rc])
        _record_as_before(want, last, rc)
    for key, hist in want.items():
        assert history.of(key) == hist[-HISTORY_PER_RUN:]
