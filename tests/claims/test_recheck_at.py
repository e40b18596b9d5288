"""`RunClaims.recheck_at`: the earliest instant at which a run's claims could change by the clock alone.

For each kind of evidence that ages (a source's sync, a log read, the stall window, a restart window,
the root's own status, the TauCluster's resolution, the event horizon, a Ray head's answer, node
agents' GPU readings, lines stamped ahead of the clock), the reported instant is exactly when the
claims change: evaluated just before it they are the same, just after it they differ. Over generated
runs, claims evaluated at any instant before `recheck_at` are those evaluated now.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import event as statistic
from hypothesis import strategies as st

from collector.claims import evaluate
from collector.claims.common import Clock
from collector.claims.gpu import apply_gpu
from collector.correlate import RayRuntime, RunEvidence, Signal, build_index
from collector.gpu import GpuDevice, PodGpuEvidence
from collector.kube import normalize
from collector.model import Ref, RunClaims
from collector.progress import scan_text
from collector.settings import ClaimSettings

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
S = ClaimSettings()  # evidence 5 min, TauCluster 30 min, restart window 10 min, stall floor 60 s + 15 s scrape
EPS = timedelta(milliseconds=1)
KINDS = ("Pod", "TauRun", "TauCluster", "Workload", "Event", "Node", "Job", "RayJob", "RayCluster")


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def taurun(*, workers: int | None = 1, phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {"profile": "p", "gpusPerWorker": 8}
    if workers is not None:
        spec["workers"] = workers
    return {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun",
            "metadata": {"name": "r", "namespace": "ns", "uid": "r", "creationTimestamp": ts(NOW - timedelta(hours=3))},
            "spec": spec, "status": {"phase": phase}}


def taucluster(resolved_ago: timedelta, *, ready: str = "True", workers: int = 1) -> dict[str, Any]:
    return {"apiVersion": "taugrid.io/v1alpha1", "kind": "TauCluster",
            "metadata": {"name": "cluster", "uid": "tc", "generation": 1,
                         "creationTimestamp": ts(NOW - timedelta(days=1))},
            "status": {"observedGeneration": 1, "lastResolvedTime": ts(NOW - resolved_ago),
                       "conditions": [{"type": "Ready", "status": ready}],
                       "resolvedProfiles": [{"name": "p", "workers": workers, "gpusPerWorker": 8}]}}


def pod(name: str = "r-0", *, bound: bool = True, phase: str = "Running", ready: bool = True,
        restarted_ago: timedelta | None = None, gpus: int = 8) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "ready": ready, "restartCount": 0,
                                 "state": {"running": {"startedAt": ts(NOW - timedelta(hours=2))}}
                                 if phase == "Running" else {"waiting": {"reason": "ContainerCreating"}}}
    if restarted_ago is not None:
        container["restartCount"] = 1
        container["lastState"] = {"terminated": {"reason": "Error", "exitCode": 1,
                                                 "finishedAt": ts(NOW - restarted_ago)}}
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if bound:
        spec["nodeName"] = f"node-{name}"
    conds = [{"type": "PodScheduled", "status": "True" if bound else "False",
              "lastTransitionTime": ts(NOW - timedelta(hours=2, minutes=50))}]
    if bound:
        conds.append({"type": "Ready", "status": "True" if ready else "False",
                      "lastTransitionTime": ts(NOW - timedelta(hours=2))})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"taugrid.io/run": "r"},
                         "creationTimestamp": ts(NOW - timedelta(hours=3))},
            "spec": spec, "status": {"phase": phase, "conditions": conds, "containerStatuses": [container]}}


def event(name: str, reason: str, message: str, ago: timedelta, *, about: str = "r-0") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "ns", "uid": name, "creationTimestamp": ts(NOW - ago)},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": about, "namespace": "ns", "uid": about},
            "reason": reason, "message": message, "type": "Normal", "source": {"component": "x"},
            "firstTimestamp": ts(NOW - ago), "lastTimestamp": ts(NOW - ago), "count": 1}


def steps(*ages_s: float, first: int = 100, hang_at: float | None = None) -> str:
    """Megatron lines stamped NOW - age (a negative age: ahead of the clock), one step each."""
    lines = [f"{ts(NOW - timedelta(seconds=a))} iteration {first + i:8d}/ 100000 | lm loss: 2.5 |\n"
             for i, a in enumerate(sorted(ages_s, reverse=True))]
    if hang_at is not None:
        lines.append(f"{ts(NOW - timedelta(seconds=hang_at))} [rank0]:[E ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog "
                     "caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=600000) "
                     "ran for 600060 milliseconds before timing out.\n")
    return "".join(lines)


def evidence(objs: list[dict[str, Any]], *, synced: dict[str, datetime] | None = None, log: str = "",
             read_at: datetime = NOW) -> RunEvidence:
    # every bound pod's node, Ready (a pod on a node the evidence does not hold has unknown health)
    nodes = {o["spec"]["nodeName"] for o in objs if o["kind"] == "Pod" and o["spec"].get("nodeName")}
    have = {o["metadata"]["name"] for o in objs if o["kind"] == "Node"}
    objs = objs + [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}} for n in sorted(nodes - have)]
    records = [n.record for n in map(normalize, objs) if n.record is not None]
    index = build_index(records)
    index.synced.update(dict.fromkeys(KINDS, NOW))
    index.synced.update(synced or {})
    if log:
        first_pod = next(r for r in records if r.ref.kind == "Pod")
        index.set_signal(Signal(first_pod.ref, "main", scan_text(log, source="t"), read_at))
    return index.evidence(Ref("TauRun", "ns", "r"))


def shape(rc: RunClaims) -> tuple[Any, ...]:
    """What a clock-driven change is about: each claim's asserted, observed, verdict and since, the
    blocked stage. (Reasons say ages, and goodput grows with the clock: those change continuously.)"""
    claims = tuple((k, c.asserted, c.observed, c.verdict, c.since) for k, c in rc.claims.items())
    blocked = (rc.blocked.stage, rc.blocked.since) if rc.blocked is not None else None
    return claims, blocked, rc.finished


def assert_flips_at(ev: RunEvidence, expected: datetime, s: ClaimSettings = S) -> tuple[RunClaims, RunClaims]:
    """The reported instant is `expected`, and it is when the claims change: (before, after)."""
    rc = evaluate(ev, NOW, s)
    assert rc.recheck_at == expected
    before, after = evaluate(ev, expected - EPS, s), evaluate(ev, expected + EPS, s)
    assert shape(before) == shape(rc)
    assert shape(after) != shape(rc)
    return before, after


# --- each kind of ageing evidence --------------------------------------------------------------------


def test_stall_window_closing() -> None:
    # steps every 10 s, the last 30 s ago: window max(3 × 10 s, 60 s) + 15 s = 75 s
    ev = evidence([taurun(), pod()], log=steps(*range(120, 20, -10)))
    closed = NOW + timedelta(seconds=45)
    before, after = assert_flips_at(ev, closed)
    assert before.progressing.observed.value == "true"
    # the read came before the window closed: it cannot show a step after it, so not STALLED yet
    assert after.progressing.observed.value == "unknown" and "a stall is judged on a read after the window" \
        in after.progressing.reason
    # read again after the window closed, still no new step: now it is a stall
    reread = evidence([taurun(), pod()], log=steps(*range(120, 20, -10)), read_at=closed + EPS)
    stalled = evaluate(reread, closed + EPS, S)
    assert stalled.progressing.observed.value == "false" and stalled.progressing.reason.startswith("STALLED")


def test_a_stall_waits_only_for_the_sources_that_print_progress() -> None:
    """Every source that prints progress must be read after the window closed; a sidecar that never
    printed any, or a replaced pod's last read, does not hold a stall back."""
    closed = NOW + timedelta(seconds=45)  # steps every 10 s, the last 30 s ago (as above)
    log = steps(*range(120, 20, -10))

    def judged(extra: list[Signal], main_read: datetime) -> RunClaims:
        ev = evidence([taurun(), pod()], log=log, read_at=main_read)
        return evaluate(replace(ev, signals=[*ev.signals, *extra]), closed + EPS, S)

    pod_ref = evidence([taurun(), pod()], log=log).signals[0].ref
    sidecar = Signal(pod_ref, "fluentbit", scan_text("shipping logs\n", source="t"), NOW)
    retired = Signal(Ref("Pod", "ns", "r-0-old", "old"), "main", scan_text(log, source="t"), NOW, retired=True)
    rc = judged([sidecar, retired], closed + EPS)
    assert rc.progressing.observed.value == "false" and rc.progressing.reason.startswith("STALLED"), \
        rc.progressing.reason
    # a second printing container read before the close holds it back: it may have printed since
    rank1 = Signal(pod_ref, "rank1", scan_text(log, source="t"), NOW)
    rc = judged([rank1], closed + EPS)
    assert rc.progressing.observed.value == "unknown" and "r-0/rank1 was last read at 12:00:00" in \
        rc.progressing.reason


def test_a_hang_after_the_last_step_needs_no_read_after_the_window() -> None:
    """A collective timeout printed after the last step is positive evidence: stalled (hung) at the
    close, whenever the log was read."""
    ev = evidence([taurun(), pod()], log=steps(*range(120, 20, -10), hang_at=25))
    rc = evaluate(ev, NOW + timedelta(seconds=46), S)
    assert rc.progressing.observed.value == "false", rc.progressing.reason


def test_progress_read_ageing_past_its_freshness() -> None:
    long = replace(S, stall_floor=timedelta(hours=1))  # the window stays open: only the read ages
    ev = evidence([taurun(), pod()], synced={"Pod": NOW + timedelta(minutes=2)}, log=steps(*range(160, 60, -10)),
                  read_at=NOW - timedelta(minutes=1))
    before, after = assert_flips_at(ev, NOW + timedelta(minutes=4), long)
    assert before.progressing.observed.value == "true"
    assert after.progressing.observed.value == "unknown" and "data stale" in after.progressing.reason


def test_pod_source_ageing_past_its_freshness() -> None:
    ev = evidence([taurun(), pod()], synced={"Pod": NOW - timedelta(minutes=1)})
    before, after = assert_flips_at(ev, NOW + timedelta(minutes=4))
    assert before.scheduled.observed.value == "true" and before.running.observed.value == "true"
    assert after.scheduled.observed.value == "unknown" and after.running.observed.value == "unknown"


def test_root_status_ageing_past_its_freshness() -> None:
    ev = evidence([taurun(), pod()], synced={"TauRun": NOW - timedelta(minutes=3)})
    before, after = assert_flips_at(ev, NOW + timedelta(minutes=2))
    assert before.running.verdict.value == "verified"
    assert after.running.asserted is None and after.running.verdict.value == "unasserted"


def test_restart_window_passing() -> None:
    ev = evidence([taurun(), pod(restarted_ago=timedelta(minutes=9))])
    before, after = assert_flips_at(ev, NOW + timedelta(minutes=1))
    assert before.running.observed.value == "false" and "restarted" in before.running.reason
    assert after.running.observed.value == "true"


def test_taucluster_resolution_ageing_past_its_trust_bound() -> None:
    ev = evidence([taurun(workers=None), taucluster(timedelta(minutes=29)), pod()])
    before, after = assert_flips_at(ev, NOW + timedelta(minutes=1))
    assert before.scheduled.observed.value == "true"  # 1/1 from the resolved profile
    assert after.scheduled.observed.value == "unknown" and "TauCluster" in after.scheduled.reason


def test_scale_up_event_leaving_the_event_horizon() -> None:
    ev = evidence([taurun(), pod(bound=False, phase="Pending", ready=False),
                   event("up", "TriggeredScaleUp", "pod triggered scale-up: [{gpu-pool 1->2 (max: 8)}]",
                         timedelta(minutes=50))])
    # sources trusted for longer than the event has left, so that the event is what ages first
    before, after = assert_flips_at(ev, NOW + timedelta(minutes=10), replace(S, evidence_max_age=timedelta(hours=1)))
    assert before.blocked is not None and before.blocked.stage.value == "node-scaling"
    assert after.blocked is not None and after.blocked.stage.value == "pod-scheduling"


def test_ray_head_answer_ageing_past_its_freshness() -> None:
    ev = evidence([taurun(), pod()])
    ev.ray["rc"] = RayRuntime(alive_nodes=None, job_status="FAILED", job_message="boom",
                              read_at=NOW - timedelta(minutes=2))
    before, after = assert_flips_at(ev, NOW + timedelta(minutes=3))
    assert before.running.observed.value == "false" and "Ray head says the job is FAILED" in before.running.reason
    assert after.running.observed.value == "true"


def test_step_stamped_ahead_of_the_clock_counts_once_reached() -> None:
    # stalled (last step 5 min ago), but the trainer's clock is ahead: its next line is stamped NOW + 20 s
    ev = evidence([taurun(), pod()], log=steps(320, 310, 300, -20))
    before, after = assert_flips_at(ev, NOW + timedelta(seconds=20))
    assert before.progressing.observed.value == "false"
    assert after.progressing.observed.value == "true"


def test_hang_stamped_ahead_of_the_clock_counts_once_reached() -> None:
    ev = evidence([taurun(), pod()], log=steps(*range(60, 0, -10), hang_at=-5))
    before, after = assert_flips_at(ev, NOW + timedelta(seconds=5))
    assert before.progressing.observed.value == "true"
    assert after.progressing.observed.value == "false" and "HUNG" not in before.progressing.reason


def test_gpu_agent_readings_ageing_past_their_freshness() -> None:
    # bound 10 min ago, still Pending, the node's agent sees 4 of its 8 GPUs: device allocation blocks
    ev = evidence([taurun(), pod(phase="Pending", ready=False)])
    rc = evaluate(ev, NOW, S)
    read = NOW - timedelta(minutes=1)
    gpus = {("ns", "r-0"): PodGpuEvidence("ns", "r-0", "node-r-0", "agent", read,
                                          tuple(GpuDevice(f"GPU-{i}", i) for i in range(4)))}
    nodes = {"node-r-0": read}

    def at(t: datetime) -> RunClaims:
        return apply_gpu(evaluate(ev, t, S), ev, gpus, nodes, t, S)

    out = apply_gpu(rc, ev, gpus, nodes, NOW, S)
    assert out.scheduled.observed.value == "false" and "4/8 GPUs" in out.scheduled.reason
    deadline = read + S.evidence_max_age
    assert out.recheck_at == deadline and (rc.recheck_at is None or rc.recheck_at > deadline)
    assert shape(at(deadline - EPS)) == shape(out)
    assert shape(at(deadline + EPS)) != shape(out)


def test_nothing_ageing_reports_no_instant() -> None:
    # A finished run, its pods gone: no source is read, no window is open.
    ev = evidence([taurun(phase="Succeeded")], synced={k: NOW - timedelta(hours=1) for k in KINDS})
    assert evaluate(ev, NOW, S).recheck_at is None


def test_clock_never_reports_an_instant_before_now_and_survives_the_end_of_time() -> None:
    c = Clock(NOW)
    assert not c.within(NOW - timedelta(minutes=10), timedelta(minutes=5)) and c.recheck_at is None
    # a stamp from the end of time is not fresh forever: past the skew allowance it is untrusted
    assert not c.within(datetime.max.replace(tzinfo=UTC), timedelta(minutes=5)) and c.recheck_at is None
    assert not c.within(NOW + timedelta(minutes=6), timedelta(hours=1)) and c.recheck_at is None
    assert c.recent(datetime.max.replace(tzinfo=UTC), timedelta(minutes=5)) and c.recheck_at is None
    assert c.within(NOW, timedelta(0)) and c.recheck_at == NOW  # holds at the bound itself, not after
    assert c.reached(NOW) and not c.reached(NOW + timedelta(seconds=3))
    c.expires(NOW - timedelta(seconds=1))
    assert c.recheck_at == NOW


# --- over generated runs: nothing changes before recheck_at ------------------------------------------

ages = st.integers(-120, 7200).map(lambda s: timedelta(seconds=s))  # evidence stamped up to 2 min ahead
recent = st.integers(-30, 400).map(lambda s: timedelta(seconds=s))  # reads and syncs, around the 5 min bound


@st.composite
def runs(draw: st.DrawFn) -> tuple[RunEvidence, dict[str, Any]]:
    n = draw(st.integers(0, 3))
    healthy = draw(st.booleans())  # most random pods are not all Running and Ready: half the runs are
    workers = n if healthy and n else draw(st.one_of(st.none(), st.integers(1, 3)))
    objs: list[dict[str, Any]] = [taurun(workers=workers, phase="Running" if healthy else draw(st.sampled_from(
        ["Running", "Pending", "Scheduled", "Succeeded"])))]
    if draw(st.booleans()):
        objs.append(taucluster(draw(ages), ready=draw(st.sampled_from(["True", "False"])),
                               workers=draw(st.integers(1, 3))))
    for i in range(n):
        bound = healthy or draw(st.booleans())
        objs.append(pod(f"r-{i}", bound=bound,
                        phase="Running" if bound and (healthy or draw(st.booleans())) else "Pending",
                        ready=healthy or draw(st.booleans()),
                        restarted_ago=draw(st.one_of(st.none(), st.integers(0, 1200).map(
                            lambda s: timedelta(seconds=s)))) if not healthy or draw(st.booleans()) else None))
    reasons = [("TriggeredScaleUp", "pod triggered scale-up"), ("Nominated", "Pod should schedule on: nodeclaim/x"),
               ("FailedScheduling", "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")]
    for j in range(draw(st.integers(0, 3)) if n else 0):
        reason, msg = draw(st.sampled_from(reasons))
        objs.append(event(f"e{j}", reason, msg, draw(ages), about=f"r-{draw(st.integers(0, n - 1))}"))
    synced = {k: NOW - draw(recent) for k in ("Pod", "TauRun")}
    log = ""
    if n and draw(st.booleans()):
        cadence = draw(st.integers(1, 60))
        last = draw(st.integers(-90, 900))
        count = draw(st.integers(1, 12))
        hang = draw(st.one_of(st.none(), st.integers(-90, 900)))
        log = steps(*(last + cadence * k for k in range(count)), hang_at=hang)
    ev = evidence(objs, synced=synced, log=log, read_at=NOW - draw(recent))
    if draw(st.booleans()):
        ev.ray["rc"] = RayRuntime(alive_nodes=None, job_status=draw(st.sampled_from(["RUNNING", "FAILED"])),
                                  job_message="", read_at=NOW - draw(recent))
    gpu: dict[str, Any] = {}
    if n and draw(st.booleans()):
        read = NOW - draw(recent)
        gpu = {"gpus": {("ns", "r-0"): PodGpuEvidence("ns", "r-0", "node-r-0", "agent", read, tuple(
            GpuDevice(f"GPU-{i}", i, lost=draw(st.booleans())) for i in range(draw(st.integers(0, 8)))))},
            "nodes": {"node-r-0": NOW - draw(recent)}}
    return ev, gpu


def claims_at(ev: RunEvidence, gpu: dict[str, Any], t: datetime) -> RunClaims:
    rc = evaluate(ev, t, S)
    return apply_gpu(rc, ev, gpu["gpus"], gpu["nodes"], t, S) if gpu else rc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs(), frac=st.floats(0.0, 1.0, exclude_max=True))
def test_claims_hold_until_recheck_at(run: tuple[RunEvidence, dict[str, Any]], frac: float) -> None:
    ev, gpu = run
    rc = claims_at(ev, gpu, NOW)
    end = rc.recheck_at
    if end is None:
        end = NOW + timedelta(days=2)  # nothing ages: the same much later
    assert end >= NOW
    for t in {NOW + (end - NOW) * frac, max(NOW, end - EPS)}:
        if t < end:
            later = claims_at(ev, gpu, t)
            assert shape(later) == shape(rc), f"claims changed at {t}, before recheck_at {rc.recheck_at}"


@st.composite
def progressing_runs(draw: st.DrawFn) -> tuple[RunEvidence, dict[str, Any]]:
    """Runs training on one log (a step every few seconds, the last inside its window), with the
    evidence that ages around it drawn: syncs, reads, restarts, events, the TauCluster, Ray, GPUs."""
    n = draw(st.integers(1, 3))
    objs: list[dict[str, Any]] = [taurun(workers=n)]
    if draw(st.booleans()):
        objs.append(taucluster(draw(ages), workers=n))
    for i in range(n):
        restarted = draw(st.integers(0, 1200)) if draw(st.integers(0, 3)) == 0 else None
        objs.append(pod(f"r-{i}", restarted_ago=None if restarted is None else timedelta(seconds=restarted)))
    reasons = [("TriggeredScaleUp", "pod triggered scale-up"), ("Nominated", "Pod should schedule on: nodeclaim/x")]
    for j in range(draw(st.integers(0, 2))):
        reason, msg = draw(st.sampled_from(reasons))
        objs.append(event(f"e{j}", reason, msg, draw(ages), about=f"r-{draw(st.integers(0, n - 1))}"))
    synced = {k: NOW - draw(st.integers(0, 290).map(lambda s: timedelta(seconds=s))) for k in ("Pod", "TauRun")}
    cadence = draw(st.integers(1, 20))
    last = draw(st.integers(0, 60))
    log = steps(*(last + cadence * k for k in range(draw(st.integers(3, 12)))))
    ev = evidence(objs, synced=synced, log=log, read_at=NOW - timedelta(seconds=draw(st.integers(0, last + 1))))
    if draw(st.booleans()):
        ev.ray["rc"] = RayRuntime(alive_nodes=None, job_status="RUNNING", job_message="",
                                  read_at=NOW - draw(st.integers(0, 290).map(lambda s: timedelta(seconds=s))))
    gpu: dict[str, Any] = {}
    if draw(st.booleans()):
        read = NOW - draw(st.integers(0, 290).map(lambda s: timedelta(seconds=s)))
        gpu = {"gpus": {("ns", "r-0"): PodGpuEvidence("ns", "r-0", "node-r-0", "agent", read, tuple(
            GpuDevice(f"GPU-{i}", i) for i in range(draw(st.integers(0, 8)))))},
            "nodes": {"node-r-0": NOW - draw(st.integers(0, 290).map(lambda s: timedelta(seconds=s)))}}
    return ev, gpu


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=progressing_runs(), read=st.integers(0, 120), gap=st.integers(1, 75),
       frac=st.floats(0.0, 1.0, exclude_max=True))
def test_a_newer_step_holds_the_claims_until_recheck_other(run: tuple[RunEvidence, dict[str, Any]], read: int,
                                                           gap: int, frac: float) -> None:
    """`recheck_other`: the deadlines a newer step does not move. A run whose claims confirm its one
    progress log (`planes.signals.confirms`), whose log then shows newer steps no more than the window's
    floor apart, read before its claims came due: its claims stand until the earliest of
    `recheck_other`, the newest step's floor window and the refresh interval (what the loop defers to,
    collector/changes.py `_deferred`), whatever deadlines of the old newest step passed meanwhile."""
    from collector.planes.signals import confirms
    ev, gpu = run
    rc = claims_at(ev, gpu, NOW)
    new_read = NOW + timedelta(seconds=read)
    if len(ev.signals) != 1 or ev.signals[0].scan.hangs or rc.recheck_at is None or new_read >= rc.recheck_at:
        return
    sig = ev.signals[0]
    last = sig.scan.samples[-1] if sig.scan.samples else None
    if last is None or last.at is None or last.step is None or last.at > NOW:
        return
    floor = S.stall_floor + S.scrape_interval
    times, t = [], last.at + timedelta(seconds=gap)
    while t < new_read:
        times.append(t)
        t += timedelta(seconds=gap)
    times.append(new_read)
    if times[0] - last.at > floor:
        return
    text = "".join(f"{ts(s.at)} iteration {s.step:8d}/ 100000 | lm loss: 2.5 |\n" for s in sig.scan.samples
                   if s.at is not None and s.step is not None)
    text += "".join(f"{ts(a)} iteration {last.step + 1 + k:8d}/ 100000 | lm loss: 2.5 |\n" for k, a in enumerate(times))
    newer = Signal(sig.ref, sig.source, scan_text(text, source="t"), new_read)
    if not confirms(rc, newer, new_read):
        return
    ev2 = replace(ev, signals=[newer])
    end = min(new_read + floor, NOW + S.confirm_refresh)
    if rc.recheck_other is not None:
        end = min(end, rc.recheck_other)
    if end <= new_read:
        return
    statistic("past the old window" if end > rc.recheck_at else "inside the old window")
    for t in {new_read + (end - new_read) * frac, end - EPS}:
        if t >= new_read:
            later = claims_at(ev2, gpu, t)
            assert shape(later) == shape(rc), f"claims changed at {t}, before {end} (recheck_other " \
                f"{rc.recheck_other}, the old window {rc.recheck_at})"
