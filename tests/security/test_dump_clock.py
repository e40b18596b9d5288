"""A dump's clock comes from control-plane stamps, never from tenant lines or deadlines (DESIGN.md §8).

`explain` without `--at` evaluates a dump at its capture time: the newest stamp the API server,
kubelets and controllers wrote (node heartbeats and Leases, Events, pod status, creation times),
bounded from above by what live kubelets renew periodically (node Leases every 10 s, heartbeats at
least every 5 minutes). Forged stamps past that bound are ignored (said once, summarised); a claim
that holds only while a window is open must hold at the latest possible capture instant.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from collector.cli import main
from tests.dumpkit import event, node, pod, ts, write_dump
from tests.test_explain_fixtures import NOW, megatron_log, taurun


def run_explain(dump: Path, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "-o", "json", *args])
    body = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
    return r.exit_code, body, r.stderr + (str(r.exception) if r.exception and r.exit_code not in (0, 2, 3) else "")


def healthy(tmp_path: Path, name: str, extra: list[dict[str, Any]] | None = None,
            extra_logs: dict[tuple[str, str], str] | None = None, *, captured: datetime | None = None,
            start: datetime | None = None, **kw: Any) -> tuple[Path, datetime]:
    """A one-worker run printing Megatron steps every 87 s; captured (heartbeats, Leases) a minute after
    its last step unless `captured` says otherwise."""
    log, last = megatron_log(start or NOW - timedelta(minutes=10))
    tr = taurun("llm", "research", "Running", NOW - timedelta(hours=1), workers=1)
    p = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    logs = {("research", "llm-w0"): log, **(extra_logs or {})}
    return write_dump(tmp_path / name, [tr, p, *(extra or [])], logs=logs,
                      captured=captured or last + timedelta(minutes=1), **kw), last


def claim_of(out: dict[str, Any], run: str, name: str) -> dict[str, Any]:
    c: dict[str, Any] = next(r for r in out["runs"] if r["name"] == run)["claims"][name]
    return c


def test_the_clock_is_the_capture_time_not_the_newest_log_line(tmp_path: Path) -> None:
    """A silently stalled run whose newest stamp is the trainer's own last line: judged at that line,
    the stall was invisible. The node Leases say when the dump was really taken."""
    _, last = megatron_log(NOW - timedelta(minutes=10))
    captured = last + timedelta(minutes=20)
    dump, _ = healthy(tmp_path, "d", captured=captured)
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    assert out["evaluated_at"] == ts(captured)
    p = claim_of(out, "llm", "progressing")
    assert p["observed"] == "false" and p["reason"].startswith("STALLED 20m"), p["reason"]


def test_a_newer_real_event_is_the_clock_not_a_forged_outlier(tmp_path: Path) -> None:
    """Heartbeats, Leases and a kubelet Event two hours after the trainer's last line all agree: the
    Event is evidence of when the dump was taken, not "one value standing alone"."""
    _, last = megatron_log(NOW - timedelta(minutes=10))
    captured = last + timedelta(hours=2)
    p = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    ev = event("llm-w0.1", "research", p, "Unhealthy", "Liveness probe failed", captured - timedelta(seconds=20),
               type_="Warning")
    dump, _ = healthy(tmp_path, "d", [ev], captured=captured)
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    assert out["evaluated_at"] == ts(captured)
    assert "stands alone" not in err and "ignored for the clock" not in err
    assert claim_of(out, "llm", "progressing")["reason"].startswith("STALLED 2h"), claim_of(out, "llm", "progressing")


def test_a_terminating_pods_deadline_does_not_move_the_clock(tmp_path: Path) -> None:
    """`deletionTimestamp` is a deadline in the future (now + grace period): it says nothing about when
    the dump was taken. A copied dump (file times of the copy) must not let it through either."""
    _, last = megatron_log(NOW - timedelta(minutes=10))
    captured = last + timedelta(minutes=1)
    leaving = pod("old-w0", "research", NOW - timedelta(hours=2), node="gpu-2", gpus=8)
    leaving["metadata"]["deletionTimestamp"] = ts(captured + timedelta(minutes=30))
    leaving["metadata"]["deletionGracePeriodSeconds"] = 1800
    dump, _ = healthy(tmp_path, "d", [leaving], captured=captured)
    later = (captured + timedelta(hours=5)).timestamp()  # copied hours later: file times say nothing
    for top, _, names in os.walk(dump):
        for n in names:
            os.utime(os.path.join(top, n), (later, later))
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    assert out["evaluated_at"] == ts(captured)
    assert claim_of(out, "llm", "progressing")["verdict"] == "verified"


def test_one_year_9999_creation_timestamp_does_not_move_the_clock(tmp_path: Path) -> None:
    clean, last = healthy(tmp_path, "clean")
    evil = pod("evil", "research", NOW - timedelta(hours=1), node="gpu-2")
    evil["metadata"]["creationTimestamp"] = "9999-12-31T23:59:59Z"
    forged, _ = healthy(tmp_path, "forged", [evil])
    code0, base, _ = run_explain(clean)
    code, out, err = run_explain(forged)
    assert code0 == 0 and code == 0 and base is not None and out is not None, err
    assert out["evaluated_at"] == base["evaluated_at"] == ts(last + timedelta(minutes=1))
    assert claim_of(out, "llm", "progressing")["verdict"] == "verified"
    assert "Pod research/evil" in err and "9999-12-31" in err and "ignored for the clock" in err
    text = CliRunner().invoke(main, ["explain", "--from-dump", str(forged)]).stdout
    assert "days" not in text  # not "STALLED 2,912,433 days"


def test_a_forged_log_line_cannot_move_the_clock_or_make_its_run_progress(tmp_path: Path) -> None:
    # The forger's run has no real progress; one line claims a step hours after everything else.
    _, last = megatron_log(NOW - timedelta(minutes=10))
    forged_at = last + timedelta(hours=3)
    forger = taurun("forger", "research", "Running", NOW - timedelta(hours=1), workers=1)
    fpod = pod("forger-w0", "research", NOW - timedelta(hours=1), node="gpu-3", gpus=8,
               labels={"taugrid.io/run": "forger"})
    line = (f"{forged_at.strftime('%Y-%m-%dT%H:%M:%S')}.000000000Z  iteration    99999/  250000 | "
            "consumed samples: 1 | elapsed time per iteration (ms): 1.0 | learning rate: 1.0E-05 | "
            "global batch size:  1024 | lm loss: "
            "1.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n")
    dump, _ = healthy(tmp_path, "d", [forger, fpod], {("research", "forger-w0"): line})
    clean, _ = healthy(tmp_path, "clean")
    code, out, err = run_explain(dump)
    _, base, _ = run_explain(clean)
    assert code == 0 and out is not None and base is not None, err
    assert out["evaluated_at"] == base["evaluated_at"]  # the clock did not follow the forged line
    assert claim_of(out, "forger", "progressing")["observed"] != "true"
    assert claim_of(out, "llm", "progressing")["verdict"] == "verified"  # the honest run is not made stale
    assert "log research/forger-w0/logs.txt" in err and "ignored for the clock" in err


def test_agreeing_forged_stamps_past_the_lease_bound_are_ignored(tmp_path: Path) -> None:
    """Two forged objects agree with each other (an outlier rule alone would keep them); the node
    Leases bound the capture time, and both lie past it."""
    _, last = megatron_log(NOW - timedelta(minutes=10))
    evil = pod("evil", "research", NOW - timedelta(hours=1), node="gpu-2")
    evil["metadata"]["creationTimestamp"] = ts(last + timedelta(hours=2))
    evil2 = pod("evil2", "research", NOW - timedelta(hours=1), node="gpu-2")
    evil2["metadata"]["creationTimestamp"] = ts(last + timedelta(hours=2, seconds=5))
    dump, _ = healthy(tmp_path, "d", [evil, evil2])
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    assert out["evaluated_at"] == ts(last + timedelta(minutes=1))
    assert "2 timestamp(s) later than the capture bound" in err and "Pod research/evil2" in err


def test_clock_warnings_are_summarised_not_one_line_per_object(tmp_path: Path) -> None:
    forged = []
    for i in range(40):
        p = pod(f"evil-{i}", "research", NOW - timedelta(hours=1), node="gpu-2")
        p["metadata"]["creationTimestamp"] = ts(NOW + timedelta(days=i + 1))
        forged.append(p)
    dump, _ = healthy(tmp_path, "d", forged)
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    clock_lines = [line for line in err.splitlines() if "ignored for the clock" in line]
    assert len(clock_lines) == 1, err
    assert "40 timestamp(s)" in clock_lines[0] and "and 37 more" in clock_lines[0]


def test_heartbeats_alone_leave_a_fast_runs_progress_unknown(tmp_path: Path) -> None:
    """Without node Leases the kubelet's heartbeat may be 5 minutes old when the dump is taken: a step
    inside a 4-minute window at the newest heartbeat may be outside it at the capture instant."""
    _, last = megatron_log(NOW - timedelta(minutes=10))
    dump, _ = healthy(tmp_path, "d", leases=False)
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    p = claim_of(out, "llm", "progressing")
    assert p["observed"] == "unknown" and "known only to within 6m" in p["reason"], p["reason"]
    # the README's procedure adds the node Leases: the same dump is then verified
    dump, _ = healthy(tmp_path, "with-leases")
    _, out, _ = run_explain(dump)
    assert out is not None and claim_of(out, "llm", "progressing")["verdict"] == "verified"


def test_a_dump_without_node_stamps_says_so_and_progress_is_unknown(tmp_path: Path) -> None:
    dump, _ = healthy(tmp_path, "d", nodes=False, leases=False)
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    assert "no node Lease or heartbeat of a Ready node bounds the capture time" in err
    p = claim_of(out, "llm", "progressing")
    assert p["observed"] == "unknown" and "no control-plane stamp bounds the dump's capture time" in p["reason"]
    r = claim_of(out, "llm", "running")
    assert r["observed"] == "unknown" and "node gpu-1 is not in the evidence" in r["reason"], r["reason"]
    (dump / "nodes.json").unlink()  # not even an empty NodeList: Nodes were not captured at all
    _, out, err = run_explain(dump)
    assert out is not None, err
    r = claim_of(out, "llm", "running")
    assert r["observed"] == "unknown" and "the evidence holds no Nodes" in r["reason"], r["reason"]


def test_a_node_missing_from_the_dump_leaves_running_unknown(tmp_path: Path) -> None:
    """A pod bound to a node the dump does not hold runs on a node of unknown health."""
    _, last = megatron_log(NOW - timedelta(minutes=10))
    other = node("gpu-9", last + timedelta(minutes=1))  # nodes.json holds a node, not the pod's
    dump, _ = healthy(tmp_path, "d", [other], nodes=False)
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    r = claim_of(out, "llm", "running")
    assert r["observed"] == "unknown" and "node gpu-1 is not in the evidence" in r["reason"], r["reason"]
    assert claim_of(out, "llm", "progressing")["observed"] == "unknown"


def test_a_future_last_resolved_time_is_not_fresh_forever(tmp_path: Path) -> None:
    from tests.test_claim_owners import profile_run, taucluster

    for when in ("9999-12-31T23:59:59Z", ts(NOW + timedelta(hours=6))):
        tc = taucluster()
        tc["status"]["lastResolvedTime"] = when
        run = profile_run(tmp_path / when[:4], tc)
        for c in ("scheduled", "running"):
            assert run["claims"][c]["observed"] == "unknown", (when, c, run["claims"][c])


@pytest.mark.parametrize("flag", ["--at", "--captured-at"])
@pytest.mark.parametrize("value", ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01"])
def test_extreme_times_are_a_clear_error_not_an_overflow(tmp_path: Path, flag: str, value: str) -> None:
    dump, _ = healthy(tmp_path, "d")
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), flag, value])
    assert r.exit_code == 2, r.output
    assert "outside 1970..2199" in r.stderr or "not an RFC3339" in r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_clock_warnings_are_said_once(tmp_path: Path) -> None:
    evil = pod("evil", "research", NOW - timedelta(hours=1), node="gpu-2")
    evil["metadata"]["creationTimestamp"] = "9999-12-31T23:59:59Z"
    dump, last = healthy(tmp_path, "d", [evil])
    _, _, err = run_explain(dump, "--captured-at", ts(last + timedelta(seconds=30)))
    assert err.count("9999-12-31") == 1


def test_a_node_clock_running_ahead_is_read_on_the_clusters_clock(tmp_path: Path) -> None:
    """gpu-1's clock runs 4 minutes ahead: its kubelet stamps its Lease, its heartbeat and its pods'
    log lines 4 minutes late. Three nodes' Leases say which clock is off. Its run stalled 6 minutes
    before the capture (its last line looks 2 minutes old, inside its 4m36s window); the run on a
    right clock, last step a minute before the capture, stays verified (judged on gpu-1's clock it
    would look 5 minutes stale)."""
    from tests.dumpkit import node_lease

    captured = NOW
    ahead = timedelta(minutes=4)
    stalled_log, _ = megatron_log(captured - timedelta(minutes=6) - timedelta(seconds=3 * 87) + ahead)
    healthy_log, _ = megatron_log(captured - timedelta(seconds=3 * 87 + 60))
    objs = []
    for name, node_name in (("llm", "gpu-1"), ("ok", "gpu-2")):
        objs.append(taurun(name, "research", "Running", NOW - timedelta(hours=1), workers=1))
        objs.append(pod(f"{name}-w0", "research", NOW - timedelta(hours=1), node=node_name, gpus=8,
                        labels={"taugrid.io/run": name}))
    objs += [node("gpu-1", captured, heartbeat=captured + ahead), node("gpu-2", captured), node("gpu-3", captured)]
    objs += [node_lease("gpu-1", captured + ahead), node_lease("gpu-2", captured), node_lease("gpu-3", captured)]
    dump = write_dump(tmp_path / "d", objs, logs={("research", "llm-w0"): stalled_log,
                                                  ("research", "ok-w0"): healthy_log},
                      captured=captured, nodes=False, leases=False)
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    assert out["evaluated_at"] == ts(captured)
    assert claim_of(out, "ok", "progressing")["verdict"] == "verified", claim_of(out, "ok", "progressing")
    p = claim_of(out, "llm", "progressing")
    assert p["observed"] == "false" and p["reason"].startswith("STALLED 6m"), p


def test_a_node_hours_ahead_in_a_dump_without_leases_does_not_stall_every_run(tmp_path: Path) -> None:
    """A bare `kubectl cluster-info dump` (no node Leases): gpu-9's clock runs two hours ahead, so its
    heartbeat and its pod's status times are stamped two hours late. Taken as the capture time, they
    made every run of the dump look stalled for two hours. Against the median of three Ready nodes'
    heartbeats it stands further out than a heartbeat period: its stamps set no clock and its pods'
    log lines are placed nowhere."""
    captured = NOW
    ahead = timedelta(hours=2)
    ok_log, _ = megatron_log(captured - timedelta(seconds=3 * 87 + 60))
    far_log, _ = megatron_log(captured - timedelta(seconds=3 * 87 + 60) + ahead)
    objs = []
    for name, node_name in (("ok", "gpu-2"), ("far", "gpu-9")):
        objs.append(taurun(name, "research", "Running", NOW - timedelta(hours=1), workers=1))
        objs.append(pod(f"{name}-w0", "research", NOW - timedelta(hours=1) + (ahead if name == "far" else
                                                                               timedelta(0)),
                        node=node_name, gpus=8, labels={"taugrid.io/run": name}))
    objs += [node("gpu-2", captured), node("gpu-3", captured - timedelta(minutes=2)),
             node("gpu-9", captured, heartbeat=captured + ahead)]
    dump = write_dump(tmp_path / "d", objs, logs={("research", "ok-w0"): ok_log, ("research", "far-w0"): far_log},
                      captured=captured, nodes=False, leases=False)
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    assert out["evaluated_at"] == ts(captured)  # gpu-2's heartbeat, not gpu-9's
    ok = claim_of(out, "ok", "progressing")
    assert ok["observed"] != "false" and not ok["reason"].startswith("STALLED"), ok["reason"]
    far = claim_of(out, "far", "progressing")
    assert far["observed"] == "unknown" and "gpu-9's clock is not measured yet" in far["reason"], far["reason"]


def _kubelet_event(name: str, about: dict[str, Any], created: datetime, off: timedelta) -> dict[str, Any]:
    """An Event the kubelet of `about`'s node reported: the API server stamped its creation at `created`,
    the kubelet its first time on its own clock, `off` from the cluster's."""
    from tests.dumpkit import event

    ev = event(name, about["metadata"]["namespace"], about, "Started", "Started container main", created)
    ev["firstTimestamp"] = ev["lastTimestamp"] = ts(created + off)
    return ev


def test_a_node_minutes_ahead_in_a_bare_dump_is_measured_by_its_kubelets_events(tmp_path: Path) -> None:
    """A bare `kubectl cluster-info dump` (no Leases): gpu-1's clock runs 4 minutes ahead, less than a
    heartbeat period, so its heartbeat alone cannot say it is off; taken as the capture time it closed
    the stall window of the run on gpu-2, stepping a minute before the capture (judged 5 minutes
    stale: STALLED). Its kubelet's Events, first stamped on its clock and created on the API server's,
    show the 4 minutes: the capture's lower bound comes from gpu-2, gpu-1's stamps are not placed."""
    from collector.sources.dump import load_dump

    captured, ahead = NOW, timedelta(minutes=4)
    ok_log, _ = megatron_log(captured - timedelta(seconds=3 * 87 + 60))
    fast_log, _ = megatron_log(captured - timedelta(seconds=3 * 87 + 60) + ahead)
    objs: list[dict[str, Any]] = []
    pods = {}
    for name, node_name in (("ok", "gpu-2"), ("fast", "gpu-1")):
        objs.append(taurun(name, "research", "Running", NOW - timedelta(hours=1), workers=1))
        pods[name] = pod(f"{name}-w0", "research", NOW - timedelta(hours=1), node=node_name, gpus=8,
                         labels={"taugrid.io/run": name})
        objs.append(pods[name])
    objs += [_kubelet_event("fast-started", pods["fast"], NOW - timedelta(minutes=50), ahead),
             _kubelet_event("ok-started", pods["ok"], NOW - timedelta(minutes=50), timedelta(seconds=1))]
    objs += [node("gpu-1", captured, heartbeat=captured + ahead), node("gpu-2", captured),
             node("gpu-3", captured - timedelta(minutes=2))]
    dump = write_dump(tmp_path / "d", objs, logs={("research", "ok-w0"): ok_log, ("research", "fast-w0"): fast_log},
                      captured=captured, nodes=False, leases=False)
    d = load_dump(dump)
    assert d.event_clocks() == {"gpu-1": ahead} and d.unplaced_nodes() == {"gpu-1"}
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    assert out["evaluated_at"] == ts(captured)  # gpu-2's heartbeat, not gpu-1's
    ok = claim_of(out, "ok", "progressing")
    assert ok["observed"] != "false" and not ok["reason"].startswith("STALLED"), ok["reason"]
    fast = claim_of(out, "fast", "progressing")
    assert fast["observed"] == "unknown" and "gpu-1's clock" in fast["reason"], fast["reason"]


def test_a_node_clock_behind_its_lease_cannot_show_is_unknown_not_stalled(tmp_path: Path) -> None:
    """gpu-1's clock runs 5 minutes behind: its Lease looks 5 minutes unrenewed (as a kubelet gone quiet
    would) and its pod's steps 5 minutes older than they are, so its steady run looked STALLED. Its
    kubelet's Events (first time 5 minutes before the API server created them) show the clock: its
    stamps are not placed, and the run is unknown. A forged Event can do no more than that: it takes a
    node's stamps away, it never moves a step later."""
    from tests.dumpkit import node_lease

    captured, behind = NOW, timedelta(minutes=5)
    slow_log, _ = megatron_log(captured - timedelta(seconds=3 * 87 + 60) - behind)
    objs: list[dict[str, Any]] = [taurun("slow", "research", "Running", NOW - timedelta(hours=1), workers=1)]
    p = pod("slow-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "slow"})
    objs += [p, _kubelet_event("slow-started", p, NOW - timedelta(minutes=50), -behind)]
    objs += [node("gpu-1", captured - behind), node("gpu-2", captured), node("gpu-3", captured)]
    objs += [node_lease("gpu-1", captured - behind), node_lease("gpu-2", captured), node_lease("gpu-3", captured)]
    dump = write_dump(tmp_path / "d", objs, logs={("research", "slow-w0"): slow_log},
                      captured=captured, nodes=False, leases=False)
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    slow = claim_of(out, "slow", "progressing")
    assert slow["observed"] == "unknown" and "gpu-1's clock" in slow["reason"], slow["reason"]


_OFFSETS = st.sampled_from([None, -7200, -600, -90, -20, 0, 20, 90, 240, 7200])
_FORGED = st.lists(st.tuples(st.integers(min_value=0, max_value=2), st.integers(min_value=-3600, max_value=0),
                             st.integers(min_value=-10_800, max_value=10_800)), max_size=4)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ages=st.lists(st.integers(min_value=0, max_value=900), min_size=3, max_size=3),
       beats=st.lists(st.integers(min_value=-600, max_value=0), min_size=3, max_size=3),
       leases=st.lists(st.booleans(), min_size=3, max_size=3), forged=_FORGED,
       real=st.lists(_OFFSETS, min_size=3, max_size=3))
# a tenant's Event says gpu-1, the node with the newest heartbeat, runs far behind: taking that
# heartbeat out of the capture's upper bound made r1's step look inside its window at every instant
@example(ages=[600, 30, 600], beats=[0, -300, -300], leases=[False] * 3, forged=[(0, -60, -10_800)],
         real=[None] * 3)
def test_kubelet_events_never_make_a_claim_true(tmp_path: Path, ages: list[int], beats: list[int], leases: list[bool],
                                               forged: list[tuple[int, int, int]], real: list[int | None]) -> None:
    """Events are tenant-writable: whatever kubelet Events a dump holds (a node's real offset or forged
    ones, any first time, any creation), a claim `true` with them is `true` without them. They may only
    take stamps away or move the capture's lower bound earlier."""
    from tests.dumpkit import node_lease

    captured = NOW
    objs: list[dict[str, Any]] = []
    logs: dict[tuple[str, str], str] = {}
    pods = []
    for i in range(3):
        name, node_name = f"r{i}", f"gpu-{i + 1}"
        log, _ = megatron_log(captured - timedelta(seconds=3 * 87 + ages[i]))
        logs[("research", f"{name}-w0")] = log
        objs.append(taurun(name, "research", "Running", NOW - timedelta(hours=1), workers=1))
        pods.append(pod(f"{name}-w0", "research", NOW - timedelta(hours=1), node=node_name, gpus=8,
                        labels={"taugrid.io/run": name}))
        objs.append(pods[-1])
        objs.append(node(node_name, captured, heartbeat=captured + timedelta(seconds=beats[i])))
        if leases[i]:
            objs.append(node_lease(node_name, captured + timedelta(seconds=beats[i] // 30)))
    events = [_kubelet_event(f"real-{i}", p, captured - timedelta(minutes=30), timedelta(seconds=off))
              for i, (p, off) in enumerate(zip(pods, real, strict=True)) if off is not None]
    events += [_kubelet_event(f"forged-{j}", pods[i], captured + timedelta(seconds=created), timedelta(seconds=off))
               for j, (i, created, off) in enumerate(forged)]
    root = tmp_path / f"case-{len(list(tmp_path.iterdir()))}"
    with_ev = write_dump(root / "with", objs + events, logs=logs, captured=captured, nodes=False, leases=False)
    without = write_dump(root / "without", objs, logs=logs, captured=captured, nodes=False, leases=False)
    (_, out1, e1), (_, out2, e2) = run_explain(with_ev), run_explain(without)
    assert out1 is not None and out2 is not None, (e1, e2)
    before = {(r["name"], n): c["observed"] for r in out2["runs"] for n, c in r["claims"].items()}
    for r in out1["runs"]:
        for n, c in r["claims"].items():
            if c["observed"] == "true":
                assert before[(r["name"], n)] == "true", (r["name"], n, c["reason"])
