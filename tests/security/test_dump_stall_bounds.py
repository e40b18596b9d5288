"""A dump's STALLED must hold under every clock and every log the dump allows (docs/accuracy.md, false
stalls in `user` dumps): a restarted container whose current log carries no timestamps, and a node
whose clock may run behind by an amount no kubelet Event measures, leave progress unknown, never
stalled; where the step is old enough under the worst offset the evidence allows, STALLED stands."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.sources.dump import load_dump
from collector.sources.dumpclock import NODE_SKEW_TOLERANCE
from tests.dumpkit import node, node_lease, pod, ts, write_dump
from tests.security.test_dump_clock import claim_of, run_explain
from tests.test_explain_fixtures import NOW, megatron_log, taurun

STEP = 87.0  # megatron_log's interval: a 4m36s window (3 × 87 s + the scrape)


def _restarted_pod(restart: datetime) -> dict[str, Any]:
    status = [{"name": "main", "ready": True, "restartCount": 1,
               "state": {"running": {"startedAt": ts(restart + timedelta(seconds=10))}},
               "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                            "startedAt": ts(NOW - timedelta(hours=1)),
                                            "finishedAt": ts(restart)}}}]
    return pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8,
               labels={"taugrid.io/run": "llm"}, containers=status)


def _restart_dump(tmp_path: Path, current: str) -> Path:
    """llm-w0 printed steps (stamped, `kubectl logs --previous --timestamps`) until its container
    restarted 20 minutes before the capture; `current` is its current log as kubectl cluster-info dump
    writes it (no timestamps)."""
    captured = NOW
    restart = captured - timedelta(minutes=20)
    previous, last = megatron_log(restart - timedelta(seconds=12 * STEP))
    assert last < restart
    objs = [taurun("llm", "research", "Running", NOW - timedelta(hours=1), workers=1), _restarted_pod(restart)]
    return write_dump(tmp_path / "d", objs, logs={("research", "llm-w0"): current},
                      extra_files={"research/llm-w0/main-previous.txt": previous}, captured=captured)


def _unstamped(text: str) -> str:
    return "".join(line.split(" ", 1)[1] + "\n" for line in text.splitlines())


def test_a_restarted_containers_unstamped_current_log_is_no_stall(tmp_path: Path) -> None:
    """Draws 1761 and 4519: the previous incarnation's log is stamped, the current one's (logs.txt) is
    not. Its progress lines since the restart cannot be placed: the last stamped step is the previous
    process's, 20 minutes old, and said nothing about the current one (it was STALLED 20m)."""
    lines, _ = megatron_log(NOW - timedelta(minutes=10))
    dump = _restart_dump(tmp_path, _unstamped(lines))
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    p = claim_of(out, "llm", "progressing")
    assert p["observed"] == "unknown", p["reason"]
    assert "carry no timestamps" in p["reason"] and "llm-w0/main" in p["reason"], p["reason"]


def test_a_restarted_container_that_printed_no_progress_since_is_still_stalled(tmp_path: Path) -> None:
    """The same restart, its current log there but with no progress line in 20 minutes: nothing after the
    last stamped step to place, and the stall stands."""
    dump = _restart_dump(tmp_path, "loading checkpoint\nwaiting for the rendezvous\n")
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    p = claim_of(out, "llm", "progressing")
    assert p["observed"] == "false" and p["reason"].startswith("STALLED"), p["reason"]


def _behind_dump(tmp_path: Path, behind: timedelta, since: timedelta, *, leases: bool = True) -> Path:
    """Run "slow" on gpu-1, whose clock runs `behind` (its Lease, heartbeat and log stamps that much
    early) and whose last real step was `since` before the capture; run "ok" on gpu-2 (a right clock)
    stopped as long ago. No kubelet Event measures any clock (draws 351, 1848, 3339, 2138, 4452)."""
    captured = NOW
    objs: list[dict[str, Any]] = []
    logs = {}
    for name, node_name, off in (("slow", "gpu-1", behind), ("ok", "gpu-2", timedelta(0))):
        log, _ = megatron_log(captured - since - timedelta(seconds=3 * STEP) - off)
        logs[("research", f"{name}-w0")] = log
        objs.append(taurun(name, "research", "Running", NOW - timedelta(hours=1), workers=1))
        p = pod(f"{name}-w0", "research", NOW - timedelta(hours=1), node=node_name, gpus=8,
                labels={"taugrid.io/run": name})
        # a startTime on the API server's clock (as the simulator writes it): no measure of gpu-1's
        p["status"]["startTime"] = ts(captured - timedelta(seconds=30))
        objs.append(p)
    objs += [node("gpu-1", captured, heartbeat=captured - behind), node("gpu-2", captured), node("gpu-3", captured)]
    if leases:
        objs += [node_lease("gpu-1", captured - behind), node_lease("gpu-2", captured),
                 node_lease("gpu-3", captured)]
    return write_dump(tmp_path / "d", objs, logs=logs, captured=captured, nodes=False, leases=False)


def test_a_node_clock_behind_unmeasured_by_events_is_no_stall(tmp_path: Path) -> None:
    """gpu-1's clock runs 90 s behind and no Event measures it: its Lease lags the others' by 90 s (a
    clock behind, or a kubelet gone quiet: either way, nothing says it is not behind). Its run stepped
    3m30s before the capture, inside its 4m36s window; on gpu-1's clock the step looks 5 minutes old
    (it was STALLED). The run on gpu-2, as old on a right clock, is not stalled either way."""
    behind = timedelta(seconds=90)
    dump = _behind_dump(tmp_path, behind, timedelta(seconds=210))
    assert load_dump(dump).node_behind(NOW) == {"gpu-1": behind}
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    slow = claim_of(out, "slow", "progressing")
    assert slow["observed"] == "unknown", slow["reason"]
    assert "node gpu-1" in slow["reason"] and "behind" in slow["reason"], slow["reason"]
    ok = claim_of(out, "ok", "progressing")
    assert not ok["reason"].startswith("STALLED"), ok["reason"]


def test_a_stall_older_than_the_clock_can_hide_stands(tmp_path: Path) -> None:
    """The same node 90 s behind, its run stopped 10 minutes ago: under any offset its Lease allows
    (up to 90 s) the window closed long since, so it is STALLED, as is the run on gpu-2."""
    dump = _behind_dump(tmp_path, timedelta(seconds=90), timedelta(minutes=10))
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    for run in ("slow", "ok"):
        p = claim_of(out, run, "progressing")
        assert p["observed"] == "false" and p["reason"].startswith("STALLED"), (run, p["reason"])


def test_without_leases_or_events_a_heartbeat_bounds_how_far_behind(tmp_path: Path) -> None:
    """No Lease and no Event (draw 4452: ten minutes behind): the node's heartbeat, taken before the
    capture, is all that bounds its clock. A step 3m30s old that looks 13m30s old is unknown."""
    behind = timedelta(minutes=10)
    dump = _behind_dump(tmp_path, behind, timedelta(seconds=210), leases=False)
    bound = load_dump(dump).node_behind(NOW)
    assert bound["gpu-1"] is not None and bound["gpu-1"] >= behind, bound
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    slow = claim_of(out, "slow", "progressing")
    assert slow["observed"] == "unknown" and "node gpu-1" in slow["reason"], slow["reason"]


def test_kubelet_events_that_measure_a_clock_right_leave_stalls_as_they_were(tmp_path: Path) -> None:
    """Full dumps: every node's kubelet Events measure its clock within the tolerance, so no node is taken
    for behind and a stall is judged as before."""
    from tests.security.test_dump_clock import _kubelet_event

    captured = NOW
    log, _ = megatron_log(captured - timedelta(minutes=10) - timedelta(seconds=3 * STEP))
    p = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    objs = [taurun("llm", "research", "Running", NOW - timedelta(hours=1), workers=1), p,
            _kubelet_event("llm-started", p, NOW - timedelta(minutes=50), timedelta(seconds=1))]
    dump = write_dump(tmp_path / "d", objs, logs={("research", "llm-w0"): log}, captured=captured)
    assert load_dump(dump).node_behind(NOW) == {}
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    c = claim_of(out, "llm", "progressing")
    assert c["observed"] == "false" and c["reason"].startswith("STALLED 10m"), c["reason"]


def test_a_restarted_container_whose_current_log_is_absent_is_no_stall(tmp_path: Path) -> None:
    """Only `kubectl logs --previous` of the restarted container is in the dump (its current log was not
    taken): nothing shows what the current process did since, so no stall (it was STALLED 20m)."""
    dump = _restart_dump(tmp_path, "")
    (dump / "research" / "llm-w0" / "logs.txt").unlink()
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    p = claim_of(out, "llm", "progressing")
    assert p["observed"] == "unknown", p["reason"]
    assert "current log" in p["reason"] and "llm-w0/main" in p["reason"], p["reason"]


WINDOW = timedelta(seconds=3 * STEP + 15)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(behind=st.integers(min_value=0, max_value=900), age=st.integers(min_value=0, max_value=1500),
       leases=st.booleans())
def test_no_stall_inside_the_window_whatever_the_unmeasured_clock(tmp_path_factory: pytest.TempPathFactory,
                                                                  behind: int, age: int, leases: bool) -> None:
    """gpu-1's clock `behind` seconds behind, no Event to measure it, its run's last real step `age`
    seconds before the capture: never STALLED while the real step is inside its window (less the
    tolerance §8 takes for a renewal's period everywhere: a lag under it is not a clock behind), never
    true once it is past it; and STALLED once the step is older than the window and the lag together."""
    dump = _behind_dump(tmp_path_factory.mktemp("d"), timedelta(seconds=behind), timedelta(seconds=age),
                        leases=leases)
    code, out, err = run_explain(dump)
    assert code == 0 and out is not None, err
    slow = claim_of(out, "slow", "progressing")
    stalled = slow["observed"] == "false" and slow["reason"].startswith("STALLED")
    real = timedelta(seconds=age)  # since the last step, on a right clock
    if real + NODE_SKEW_TOLERANCE <= WINDOW:
        assert not stalled, slow["reason"]
    else:
        assert slow["observed"] != "true", slow["reason"]
    if real > WINDOW + timedelta(seconds=behind) + timedelta(seconds=1):
        assert stalled, slow["reason"]
