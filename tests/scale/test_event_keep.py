"""A live index keeps only the Events a claim can read: the blocking ones stay, the superseded Normal
ones of a fleet (kubelet's Scheduled, Pulling, Pulled, Created, Started) are not kept, and the
claims read exactly as with every Event kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from collector.claims import blocked, evaluate
from collector.correlate import CLAIM_EVENT_KINDS, CLAIM_EVENT_REASONS, RunIndex, build_index
from collector.kube import normalize
from collector.model import ObjectRecord, Ref
from collector.settings import ClaimSettings
from tests.dumpkit import event, pod
from tests.test_explain_fixtures import taurun

NOW = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
NS = "research"


def _rec(obj: dict[str, Any]) -> ObjectRecord:
    n = normalize(orjson.loads(orjson.dumps(obj)))
    assert n.record is not None and not n.problems, n.problems
    return n.record


def _cluster() -> tuple[list[dict[str, Any]], dict[str, str]]:
    """A run with a worker waiting to be scheduled, one crash-looping and one waiting on a volume,
    and the Events a fleet records. Returns the objects and, per Event name, kept or dropped."""
    t = NOW - timedelta(minutes=20)
    run = taurun("llm", NS, "Pending", t, workers=3)
    labels = {"taugrid.io/run": "llm"}
    unbound = pod("llm-w0", NS, t, node=None, phase="Pending", gpus=8, labels=labels)
    crashing = pod("llm-w1", NS, t, node="gpu-1", gpus=8, labels=labels, ready=False, containers=[
        {"name": "main", "ready": False, "restartCount": 3,
         "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}}])
    mounting = pod("llm-w2", NS, t, node="gpu-2", phase="Pending", gpus=8, labels=labels, ready=False,
                   containers=[{"name": "main", "ready": False, "restartCount": 0,
                                "state": {"waiting": {"reason": "ContainerCreating"}}}])
    wl = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
          "metadata": {"name": "llm-wl", "namespace": NS, "uid": "uid-wl", "creationTimestamp": "2026-12-01T07:40:00Z",
                       "labels": labels},
          "spec": {"queueName": "a100"},
          "status": {"conditions": [{"type": t_, "status": "True", "reason": t_, "message": "",
                                     "lastTransitionTime": "2026-12-01T07:41:00Z"}
                                    for t_ in ("QuotaReserved", "Admitted")]}}
    at = t + timedelta(minutes=1)
    events = {
        # what the claims read, or what explains a wait: kept
        "llm-w0.fs": ("kept", event("llm-w0.fs", NS, unbound, "FailedScheduling",
                                    "0/8 nodes are available: 8 Insufficient nvidia.com/gpu.", at,
                                    type_="Warning", component="default-scheduler")),
        "llm-w0.up": ("kept", event("llm-w0.up", NS, unbound, "TriggeredScaleUp",
                                    "pod triggered scale-up: [{gpu-pool 2->3 (max: 10)}]", at,
                                    component="cluster-autoscaler")),
        "llm-w0.nom": ("kept", event("llm-w0.nom", NS, unbound, "Nominated",
                                     "Pod should schedule on: nodeclaim/gpu-pool-x1", at, component="karpenter")),
        "llm-w1.bo": ("kept", event("llm-w1.bo", NS, crashing, "BackOff", "Back-off restarting failed container",
                                    at, type_="Warning", count=7)),
        "llm-w2.fm": ("kept", event("llm-w2.fm", NS, mounting, "FailedMount",
                                    'MountVolume.SetUp failed for volume "data"', at, type_="Warning")),
        "llm-wl.qr": ("kept", event("llm-wl.qr", NS, wl, "Pending", "couldn't assign flavors", at,
                                    component="kueue-admission")),
        "llm-wl.n": ("kept", event("llm-wl.n", NS, wl, "QuotaReserved", "Quota reserved in ClusterQueue gpu", at,
                                   component="kueue-admission")),
        # superseded Normal ones: the pod is past them, no claim reads them
        "llm-w1.sch": ("dropped", event("llm-w1.sch", NS, crashing, "Scheduled", "Successfully assigned", at,
                                        component="default-scheduler")),
        "llm-w1.pulling": ("dropped", event("llm-w1.pulling", NS, crashing, "Pulling", "Pulling image", at)),
        "llm-w1.pulled": ("dropped", event("llm-w1.pulled", NS, crashing, "Pulled", "Successfully pulled", at)),
        "llm-w1.created": ("dropped", event("llm-w1.created", NS, crashing, "Created", "Created container", at)),
        "llm-w1.started": ("dropped", event("llm-w1.started", NS, crashing, "Started", "Started container", at)),
        "llm.run": ("dropped", event("llm.run", NS, run, "Scheduled", "all pods bound", at,
                                     component="taugrid-controller")),
    }
    objs = [run, unbound, crashing, mounting, wl, *(e for _, e in events.values())]
    return objs, {name: what for name, (what, _) in events.items()}


def test_blocking_events_are_kept_and_superseded_normal_ones_dropped() -> None:
    objs, expect = _cluster()
    live = RunIndex()
    for o in objs:
        live.upsert(_rec(o))
    kept = {k[2] for k in live.keys_of_kind("Event")}
    assert kept == {n for n, what in expect.items() if what == "kept"}
    (root,) = live.roots()
    assert {e.ref.name for e in live.evidence(root).events} == kept
    # a dump's index keeps them all
    full = build_index([_rec(o) for o in objs])
    assert {k[2] for k in full.keys_of_kind("Event")} == set(expect)


def test_claims_read_the_same_with_or_without_the_dropped_events() -> None:
    objs, _ = _cluster()
    recs = [_rec(o) for o in objs]
    live, full = RunIndex(), build_index(recs)
    for r in recs:
        live.upsert(r)
    for idx in (live, full):
        idx.synced.update(dict.fromkeys(("Pod", "Event", "Workload", "TauRun", "Node", "TauCluster"), NOW))
    s = ClaimSettings()
    (root,) = live.roots()
    a, b = evaluate(live.evidence(root), NOW, s), evaluate(full.evidence(root), NOW, s)
    assert a == b
    assert a.scheduled.observed.value == "false"
    # the kept FailedScheduling and TriggeredScaleUp are what the blocked stage names
    assert a.blocked is not None and a.blocked.stage.value == "node-scaling"
    assert "scale-up" in a.blocked.reason and "Insufficient nvidia.com/gpu" in a.blocked.reason, a.blocked.reason


def test_an_event_that_turns_uninformative_is_let_go() -> None:
    objs, _ = _cluster()
    live = RunIndex()
    for o in objs:
        live.upsert(_rec(o))
    nom = next(o for o in objs if o["metadata"]["name"] == "llm-w0.nom")
    live.upsert(_rec({**nom, "reason": "Noted", "message": "nothing to see"}))
    assert live.get("Event", NS, "llm-w0.nom") is None
    assert Ref("Event", NS, "llm-w0.nom").key not in live.keys_of_kind("Event")


def test_the_kept_sets_cover_what_the_claims_read() -> None:
    # blocked.py filters Events by these; a reason added there must be kept here too.
    read = blocked.AUTOSCALER_REASONS | blocked.DEVICE_REASONS | {"FailedScheduling"}
    assert read <= CLAIM_EVENT_REASONS
    assert {"Workload", "NodeClaim"} == CLAIM_EVENT_KINDS


class _Sink:
    """An EvidenceSink that records the Events it is handed (as the ADX exporter would row them)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def open(self) -> None: ...
    def claims(self, runs: Any) -> None: ...
    def track(self, runs: Any, *, led_until: Any = None) -> None: ...
    def signal(self, *a: Any) -> None: ...
    def gpu(self, *a: Any, **kw: Any) -> None: ...
    def close(self) -> None: ...

    def event(self, rec: ObjectRecord, run: str) -> None:
        self.events.append((rec.ref.name, run))


def test_the_controller_exports_the_events_it_does_not_keep() -> None:
    """The index of a live controller holds only the kept Events, with or without an exporter (without
    one, the relist passes the others to the loop in batches instead of holding them); with one,
    every Event is exported, and one that arrives by watch names its run."""
    import time
    from dataclasses import replace

    from collector.controller import Controller
    from collector.settings import ControllerSettings, Settings
    from collector.sources.kube_api import KubeApi, api_client_for
    from kubesim.clock import ManualClock
    from kubesim.server import Simulator, SimulatorSettings

    objs, expect = _cluster()
    kept = {n for n, w in expect.items() if w == "kept"}
    clock = ManualClock(NOW)
    cfg = replace(ControllerSettings(), tick=timedelta(seconds=0.2), leader_election=False,
                  log_poll_interval=timedelta(0), ray_poll_interval=timedelta(0), watch_timeout_s=5)

    def wait(pred: Any, what: str) -> None:
        deadline = time.monotonic() + 20
        while not pred():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    with Simulator(clock=clock, settings=SimulatorSettings(bookmark_interval_s=0.5)) as sim:
        sim.start()
        sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        for o in objs:  # as a client sends them: the server assigns uid and resourceVersion
            meta = {k: v for k, v in o["metadata"].items() if k not in ("uid", "resourceVersion")}
            sim.apply({**o, "metadata": meta})
        for sink in (None, _Sink()):
            c = Controller(KubeApi(api_client_for(sim.base_url)), Settings(controller=cfg), clock.now, sink=sink)
            ops: list[str] = []
            put = c.put
            c.put = lambda ch, put=put, ops=ops: (ops.append(ch.op), put(ch))[1]  # type: ignore[method-assign]
            c.open()
            try:
                wait(lambda c=c: c.ready.is_set() and len(c.claims) == 1, "controller ready")
                assert {k[2] for k in c.index.keys_of_kind("Event")} == kept
                # without an exporter the relist passed the dropped Events on in batches; with one, not
                assert ("listed" in ops) is (sink is None), ops
                if sink is None:
                    continue
                assert {name for name, _ in sink.events} == set(expect)  # the relist exported every one
                pulled = next(o for o in objs if o["metadata"]["name"] == "llm-w1.pulled")
                sim.apply({**pulled, "metadata": {"name": "llm-w1.pulled-again", "namespace": NS}})  # a watch event
                wait(lambda sink=sink: ("llm-w1.pulled-again", "llm") in sink.events,
                     f"watched Event not exported: {sink.events}")
                time.sleep(0.3)
                assert {k[2] for k in c.index.keys_of_kind("Event")} == kept
            finally:
                c.close()
