"""Invariants of the claim engine over generated runs (hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.claims import evaluate
from collector.correlate import Signal, build_index
from collector.kube import normalize, parse_time
from collector.model import Observed, Ref, Verdict, verdict_for
from collector.progress import scan_text
from collector.settings import ClaimSettings

BASE = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
S = ClaimSettings()


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_verdict_table_is_exhaustive() -> None:
    table = {
        (True, Observed.TRUE): Verdict.VERIFIED,
        (True, Observed.FALSE): Verdict.CONTRADICTED,
        (True, Observed.UNKNOWN): Verdict.UNCONFIRMED,
        (False, Observed.TRUE): Verdict.AHEAD,
        (False, Observed.FALSE): Verdict.PENDING,
        (False, Observed.UNKNOWN): Verdict.PENDING,
        (None, Observed.TRUE): Verdict.UNASSERTED,
        (None, Observed.FALSE): Verdict.UNASSERTED,
        (None, Observed.UNKNOWN): Verdict.UNASSERTED,
    }
    for (asserted, observed), verdict in table.items():
        assert verdict_for(asserted, observed) is verdict


container_states = st.sampled_from([
    {"running": {"startedAt": ts(BASE - timedelta(hours=1))}},
    {"waiting": {"reason": "CrashLoopBackOff"}},
    {"waiting": {"reason": "ImagePullBackOff"}},
    {"waiting": {"reason": "ContainerCreating"}},
    {"terminated": {"reason": "Completed", "exitCode": 0}},
    {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
    {},
])


@st.composite
def pods(draw: st.DrawFn, run: str) -> dict[str, Any]:
    i = draw(st.integers(0, 10_000))
    bound = draw(st.booleans())
    phase = draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown", "Weird", None]))
    restarts = draw(st.integers(0, 20))
    last_finished = BASE - timedelta(seconds=draw(st.integers(0, 7200)))
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": draw(st.sampled_from(["True", "False", "Unknown"])),
                        "lastTransitionTime": ts(BASE - timedelta(minutes=30))}],
        "containerStatuses": [{"name": "main", "ready": draw(st.booleans()), "restartCount": restarts,
                               "state": draw(container_states),
                               "lastState": {"terminated": {"reason": "Error", "exitCode": 1,
                                                            "finishedAt": ts(last_finished)}} if restarts else {}}],
    }
    if phase is not None:
        status["phase"] = phase
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if bound:
        spec["nodeName"] = "node-1"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{run}-{i}", "namespace": "ns", "uid": f"p{i}", "labels": {"taugrid.io/run": run},
                         "creationTimestamp": ts(BASE - timedelta(hours=2))},
            "spec": spec, "status": status}


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[dict[str, Any]], str]:
    phase = draw(st.sampled_from(["Pending", "Admitted", "Scheduled", "Running", "Succeeded", "Failed", "",
                                  "Mystery"]))
    workers = draw(st.one_of(st.none(), st.integers(0, 4)))  # None: the resolved profile says
    objs: list[dict[str, Any]] = [{
        "apiVersion": "taugrid.io/v1alpha1", "kind": "TauRun",
        "metadata": {"name": "r", "namespace": "ns", "uid": "r", "creationTimestamp": ts(BASE - timedelta(hours=3))},
        "spec": {"profile": "p", "gpusPerWorker": 8, **({} if workers is None else {"workers": workers})},
        "status": {"phase": phase},
    }]
    if draw(st.booleans()):
        generation = draw(st.integers(1, 3))
        objs.append({
            "apiVersion": "taugrid.io/v1alpha1", "kind": "TauCluster",
            "metadata": {"name": "cluster", "uid": "tc", "generation": generation,
                         "creationTimestamp": ts(BASE - timedelta(days=1))},
            "status": {"observedGeneration": draw(st.integers(1, generation)),
                       "lastResolvedTime": ts(BASE - timedelta(minutes=draw(st.integers(0, 120)))),
                       "conditions": [{"type": "Ready", "status": draw(st.sampled_from(["True", "False", "Unknown"]))}],
                       "resolvedProfiles": [{"name": "p", "workers": draw(st.integers(1, 4)), "gpusPerWorker": 8}]},
        })
    objs += draw(st.lists(pods("r"), max_size=5, unique_by=lambda p: p["metadata"]["name"]))
    steps = draw(st.lists(st.tuples(st.integers(0, 3600), st.integers(0, 500),
                                    st.sampled_from(["2.5", "nan", "inf", "1.0"])), max_size=12))
    log = "".join(
        f"{ts(BASE - timedelta(seconds=age))} iteration {step:8d}/ 1000 | lm loss: {loss} |\n"
        for age, step, loss in steps
    )
    return objs, log


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs(), sync_age=st.integers(0, 3600), log_age=st.integers(0, 3600), root_age=st.integers(0, 3600))
def test_claim_invariants(run: tuple[list[dict[str, Any]], str], sync_age: int, log_age: int,
                          root_age: int) -> None:
    objs, log = run
    records = [n.record for n in (normalize(o) for o in objs) if n.record is not None]
    index = build_index(records)
    synced_at = BASE - timedelta(seconds=sync_age)
    index.synced.update({k: synced_at for k in ("Pod", "Workload", "Event", "RayJob", "RayCluster", "Node")})
    index.synced["TauRun"] = BASE - timedelta(seconds=root_age)
    for pod in [r for r in records if r.ref.kind == "Pod"][:1]:
        index.set_signal(Signal(pod.ref, "main", scan_text(log, source="t"), BASE - timedelta(seconds=log_age)))
    [ev] = index.all_evidence()
    out = evaluate(ev, BASE, S)
    again = evaluate(index.evidence(Ref("TauRun", "ns", "r")), BASE, S)
    assert out == again, "evaluation must be a pure function of evidence and clock"
    # The order objects arrived in (watch order, file order) must not change a word of the claims.
    other = build_index(reversed(records))
    other.synced.update(index.synced)
    for pod in [r for r in records if r.ref.kind == "Pod"][:1]:
        other.set_signal(Signal(pod.ref, "main", scan_text(log, source="t"), BASE - timedelta(seconds=log_age)))
    assert evaluate(other.evidence(Ref("TauRun", "ns", "r")), BASE, S) == out

    for c in out.claims.values():
        assert c.verdict is verdict_for(c.asserted, c.observed)
        assert c.reason
        assert c.evidence and c.evidence[0].plane.value == "taugrid"
    stale_pods = timedelta(seconds=sync_age) > S.evidence_max_age
    if stale_pods:
        # Fail closed: nothing observed from stale sources is ever true.
        assert out.scheduled.observed is Observed.UNKNOWN
        assert out.running.observed is Observed.UNKNOWN
        assert out.progressing.observed is not Observed.TRUE
        assert out.blocked is None
    if timedelta(seconds=log_age) > S.evidence_max_age:
        assert out.progressing.observed is not Observed.TRUE
    if timedelta(seconds=root_age) > S.evidence_max_age:
        # A stale status asserts nothing, so it is never "contradicted" (nor "verified").
        assert all(c.asserted is None and c.verdict is Verdict.UNASSERTED for c in out.claims.values())
    tc = next((o for o in objs if o["kind"] == "TauCluster"), None)
    workers_declared = "workers" in objs[0]["spec"]
    if not workers_declared:
        trusted = tc is not None and tc["status"]["observedGeneration"] == tc["metadata"]["generation"] and \
            tc["status"]["conditions"][0]["status"] == "True" and \
            BASE - parse_time(tc["status"]["lastResolvedTime"]) <= S.taucluster_max_age
        if not trusted:
            # Counts from an untrusted TauCluster: never a "true" built on as many pods as exist.
            assert out.scheduled.observed is not Observed.TRUE
            assert out.running.observed is not Observed.TRUE
    if out.progressing.observed is Observed.TRUE:
        assert out.running.observed is Observed.TRUE
    # Progressing false always says why (ADX's StallCause reads only this, not the running claim).
    if out.progressing.observed is Observed.FALSE:
        assert out.progressing.cause in ("stalled", "hung", "replaying", "skipped-steps", "invalid-steps",
                                         "not-running", "finished")
    else:
        assert out.progressing.cause == ""
    if out.running.observed is Observed.FALSE:
        assert out.progressing.observed is Observed.FALSE
        assert out.progressing.cause in ("not-running", "finished")
    if out.running.observed is Observed.TRUE:
        assert out.scheduled.observed is Observed.TRUE
    if out.blocked is not None:
        assert out.scheduled.observed is not Observed.TRUE and not out.finished
    g = out.goodput
    assert g is not None
    assert all(v >= 0 for v in g.badput_s.values()) and g.productive_s >= 0
    if g.allocated_s > 0:
        inside = g.productive_s + sum(v for k, v in g.badput_s.items() if k != "queued")
        assert abs(inside - g.allocated_s) < 1e-6, "allocated time is fully accounted for"
        assert g.ratio is None or 0 <= g.ratio <= 1


def test_events_per_object_are_bounded_newest_kept() -> None:
    from collector.correlate import EVENTS_PER_OBJECT

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": {}}
    records = [normalize(pod).record]
    for i in range(EVENTS_PER_OBJECT + 10):
        ev = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"p.{i}", "namespace": "ns"},
              "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns"}, "reason": "BackOff",
              "message": str(i), "type": "Warning"}
        if i % 3:  # some carry no time at all: they go first
            ev["lastTimestamp"] = ts(BASE + timedelta(seconds=i))
        records.append(normalize(ev).record)
    index = build_index(r for r in records if r is not None)
    kept = sorted(int(r.ref.name.split(".")[1]) for r in index.objects() if r.ref.kind == "Event")
    assert len(kept) == EVENTS_PER_OBJECT
    dated = {i for i in range(EVENTS_PER_OBJECT + 10) if i % 3}
    assert dated <= set(kept), "undated events are dropped before any dated one"


@st.composite
def ray_runs(draw: st.DrawFn) -> tuple[list[dict[str, Any]], int, int]:
    """A RayJob (K8sJobMode) with head, GPU workers and the submitter pod, each bound or not."""
    workers = draw(st.integers(1, 3))
    hosts = draw(st.integers(1, 2))
    created = ts(BASE - timedelta(hours=1))
    rj: dict[str, Any] = {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": "rj", "namespace": "ns", "uid": "rj", "creationTimestamp": created},
        "spec": {"submissionMode": "K8sJobMode", "rayClusterSpec": {"workerGroupSpecs": [
            {"groupName": "gpu", "replicas": workers, "numOfHosts": hosts}]}},
        "status": {"jobDeploymentStatus": draw(st.sampled_from(["Running", "Initializing", ""])),
                   "jobStatus": draw(st.sampled_from(["RUNNING", "PENDING", ""])), "rayClusterName": "rc"},
    }
    objs = [rj, {"apiVersion": "ray.io/v1", "kind": "RayCluster",
                 "metadata": {"name": "rc", "namespace": "ns", "uid": "rc", "creationTimestamp": created,
                              "ownerReferences": [{"kind": "RayJob", "name": "rj", "controller": True}]},
                 "spec": rj["spec"]["rayClusterSpec"], "status": {"state": "ready"}},
            {"apiVersion": "batch/v1", "kind": "Job",
             "metadata": {"name": "rj", "namespace": "ns", "uid": "sj", "creationTimestamp": created,
                          "ownerReferences": [{"kind": "RayJob", "name": "rj", "controller": True}]},
             "spec": {"parallelism": 1}, "status": {"active": 1, "ready": 1}}]
    bound_work = 0
    roles = ["head"] + ["worker"] * draw(st.integers(0, workers * hosts + 1))
    all_bound = True
    for i, role in enumerate(roles):
        bound = draw(st.booleans())
        bound_work += bound
        all_bound = all_bound and bound
        objs.append(_ray_pod(f"rc-{role}-{i}", bound, {"ray.io/cluster": "rc", "ray.io/node-type": role},
                             {"kind": "RayCluster", "name": "rc", "controller": True}))
    # The submitter: bound and Ready, a batch Job's pod. It must never fill a worker's place.
    objs.append(_ray_pod("rj-submit", True, {"batch.kubernetes.io/job-name": "rj"},
                         {"kind": "Job", "name": "rj", "controller": True}))
    return objs, 1 + workers * hosts, bound_work if all_bound else -1


def _ray_pod(name: str, bound: bool, labels: dict[str, str], owner: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if bound:
        spec["nodeName"] = "n1"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "labels": labels, "ownerReferences": [owner],
                         "creationTimestamp": ts(BASE - timedelta(hours=1))},
            "spec": spec,
            "status": {"phase": "Running" if bound else "Pending",
                       "conditions": [{"type": "Ready", "status": "True" if bound else "False"}],
                       "containerStatuses": [{"name": "main", "ready": bound, "restartCount": 0,
                                              "state": {"running": {}} if bound else {"waiting": {}}}]}}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=ray_runs())
def test_helper_pods_never_fill_a_workers_place(run: tuple[list[dict[str, Any]], int, int]) -> None:
    objs, expected, bound_work = run  # bound_work is -1 when some work pod waits unbound
    index = build_index(n.record for n in (normalize(o) for o in objs) if n.record is not None)
    index.synced.update(dict.fromkeys(("Pod", "RayJob", "RayCluster", "Job", "Node", "Event"), BASE))
    [ev] = index.all_evidence()
    out = evaluate(ev, BASE, S)
    assert (out.scheduled.observed is Observed.TRUE) == (bound_work >= expected)
    if out.running.observed is Observed.TRUE:
        assert out.scheduled.observed is Observed.TRUE
