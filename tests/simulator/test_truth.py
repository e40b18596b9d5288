"""The generated classes as the simulator plays them: real shapes served, and a truth that says what each class is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from kubesim import ManualClock, ScenarioEngine, Simulator, SimulatorSettings
from kubesim.generate import CLASSES, DESCRIPTIONS, Generated, generate
from kubesim.truth import RunTruth

# class → (scheduled, running, progressing, stage) at the judging instant
EXPECTED: dict[str, tuple[bool, bool, bool, str | None]] = {
    "healthy": (True, True, True, None),
    "stall": (True, True, False, None),
    "hang-with-steps": (True, True, False, None),
    "hang-no-steps": (True, True, False, None),
    "hang-steps-out-of-tail": (True, True, False, None),
    "crash-loop": (True, False, False, None),
    "quota-wait": (False, False, False, "queue-admission"),
    "quota-wait-tiered": (False, False, False, "queue-admission"),
    "preempted-requeued": (False, False, False, "queue-admission"),
    "admission-check-kueue": (False, False, False, "queue-admission"),
    "admission-check-provisioning": (False, False, False, "node-scaling"),
    "dra-wait": (False, False, False, "device-allocation"),
    "karpenter-nominated": (False, False, False, "node-scaling"),
    "karpenter-limits": (False, False, False, "node-scaling"),
    "autoscaler-scale-up": (False, False, False, "node-scaling"),
    "autoscaler-no-scale-up": (False, False, False, "node-scaling"),
    "unschedulable-affinity": (False, False, False, "pod-scheduling"),
    "partially-scheduled": (False, False, False, "pod-scheduling"),
    "submitter-worker-pending": (False, False, False, "pod-scheduling"),
    "unschedulable-no-events": (False, False, False, "pod-scheduling"),
    "topology-placement-failed": (False, False, False, "queue-admission"),
    "device-unhealthy": (False, False, False, "device-allocation"),
    "hf-loss-dicts": (True, True, True, None),
    "profile-unresolved": (False, False, False, "target-resolution"),
    "replay-recent-restart": (True, True, False, None),
    "replay-old-restart": (True, True, False, None),
    "restart-recovered": (True, True, True, None),
    "lagging-ranks": (True, True, True, None),
    "eval-bars": (True, True, True, None),
    "deepspeed-skipped-all": (True, True, False, None),
    "deepspeed-skipped-most": (True, True, False, None),
    "deepspeed-healthy": (True, True, True, None),
    "multikueue-dispatched": (True, True, True, None),
    "node-loss": (True, False, False, None),
}


@pytest.fixture(scope="module")
def played() -> Iterator[tuple[Generated, Simulator, dict[tuple[str, str], RunTruth], str]]:
    gen = generate(5, 2 * len(CLASSES), balanced=True, stale_taucluster=True)
    clock = ManualClock(gen.scenario.start)
    with Simulator(clock=clock, settings=SimulatorSettings(seed=5, bookmark_interval_s=0.5)) as sim:
        url = sim.start("127.0.0.1:0")
        engine = ScenarioEngine(gen.scenario, url, clock=clock)
        engine.step_to(gen.eval_at)
        assert engine.errors == []
        yield gen, sim, engine.truth(), url
        engine.stop()


def _runs(gen: Generated, cls: str) -> list[tuple[str, str]]:
    return sorted(k for k, c in gen.classes.items() if c == cls)


def _list(sim: Simulator, api_version: str, kind: str, namespace: str = "") -> list[dict[str, Any]]:
    return list(sim.store.list_page(sim.resource(api_version, kind), namespace).items)


def _events(sim: Simulator, ns: str, prefix: str) -> list[dict[str, Any]]:
    return [e for e in _list(sim, "v1", "Event", ns) if e["involvedObject"]["name"].startswith(prefix)]


def test_every_class_has_the_truth_it_stands_for(played: Any) -> None:
    gen, _, truth, _ = played
    assert set(EXPECTED) == set(CLASSES) == set(DESCRIPTIONS)
    for key, cls in gen.classes.items():
        t = truth[key]
        assert (t.scheduled, t.running, t.progressing, t.stage) == EXPECTED[cls], (cls, key, t)


def test_new_kinds_are_served_to_the_official_client(played: Any) -> None:
    gen, _, _, url = played
    api = k8s.ApiClient(k8s.Configuration(host=url))
    co = k8s.CustomObjectsApi(api)
    claims = co.list_cluster_custom_object("resource.k8s.io", "v1", "resourceclaims")["items"]
    nodeclaims = co.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims")["items"]
    checks = co.list_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "admissionchecks")["items"]
    assert claims and all("allocation" not in (c.get("status") or {}) for c in claims)
    assert all(c["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com" for c in claims)
    assert nodeclaims and all(n["metadata"]["labels"]["karpenter.sh/nodepool"] == "gpu" for n in nodeclaims)
    controllers = {c["metadata"]["name"]: c["spec"]["controllerName"] for c in checks}
    assert controllers["multikueue"] == "kueue.x-k8s.io/multikueue"
    assert "kueue.x-k8s.io/provisioning-request" in controllers.values()
    assert "example.com/budget-approval" in controllers.values()
    # Watchable like any type: a watch from "0" starts with the existing objects.
    events = list(watch.Watch().stream(co.list_cluster_custom_object, "karpenter.sh", "v1", "nodeclaims",
                                       resource_version="0", timeout_seconds=1))
    assert {e["type"] for e in events} == {"ADDED"} and len(events) == len(nodeclaims)
    api.close()


def test_waits_carry_the_upstream_texts(played: Any) -> None:
    gen, sim, _, _ = played
    ns, run = _runs(gen, "dra-wait")[0]
    texts = [e["message"] for e in _events(sim, ns, run) if e["reason"] == "FailedScheduling"]
    assert texts and all("cannot allocate all claims" in t for t in texts)
    pods = [p for p in _list(sim, "v1", "Pod", ns) if p["metadata"]["name"].startswith(run) and
            not p["spec"].get("nodeName") and p["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")]
    assert pods and all(p["status"]["resourceClaimStatuses"][0]["resourceClaimName"] for p in pods)
    ns, run = _runs(gen, "karpenter-nominated")[0]
    assert any(e["reason"] == "Nominated" and e["message"].startswith("Pod should schedule on: nodeclaim/gpu-")
               and e["source"]["component"] == "karpenter" for e in _events(sim, ns, run))
    ns, run = _runs(gen, "karpenter-limits")[0]
    assert any(e["source"]["component"] == "karpenter" and "exceed limits for nodepool" in e["message"]
               for e in _events(sim, ns, run))
    wls = {w["metadata"]["labels"].get("kueue.x-k8s.io/job-uid"): w for w in _list(sim, "kueue.x-k8s.io/v1beta1",
                                                                                  "Workload")}
    for cls, state in (("admission-check-kueue", "Pending"), ("admission-check-provisioning", "Pending"),
                       ("multikueue-dispatched", "Ready")):
        ns, run = _runs(gen, cls)[0]
        root = next(o for kind in (("ray.io/v1", "RayJob"), ("batch/v1", "Job")) for o in _list(sim, *kind, ns)
                    if o["metadata"]["name"] == run)
        wl = wls[root["metadata"]["uid"]]
        assert wl["status"]["admissionChecks"][0]["state"] == state
        if cls == "multikueue-dispatched":
            assert wl["status"]["clusterName"].startswith("worker-")
            assert root["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"
            assert not [p for p in _list(sim, "v1", "Pod", ns) if p["metadata"]["name"].startswith(run + "-")]
    ns, run = _runs(gen, "quota-wait-tiered")[0]
    reasons = {next(c["reason"] for c in w["status"]["conditions"] if c["type"] == "QuotaReserved")
               for w in wls.values() if w["metadata"]["name"].split("-", 1)[1].startswith(run + "-")}
    assert reasons and reasons <= {"WaitingForQuota", "ExceedsMaxQuota"}


def test_stale_taucluster_and_unresolved_profile(played: Any) -> None:
    gen, sim, _, _ = played
    tc = _list(sim, "taugrid.io/v1alpha1", "TauCluster")[0]
    assert tc["status"]["observedGeneration"] < tc["metadata"]["generation"]
    resolved = {p["name"]: p["workers"] for p in tc["status"]["resolvedProfiles"]}
    assert resolved["a100-4x8"] == 2 and "h200-8x8" not in resolved
    ns, run = _runs(gen, "profile-unresolved")[0]
    assert not [o for o in _list(sim, "ray.io/v1", "RayJob", ns) if o["metadata"]["name"] == run]


def test_progress_lines_in_each_trainer_format(played: Any) -> None:
    gen, sim, _, _ = played

    def log_of(cls: str) -> str:
        ns, run = _runs(gen, cls)[0]
        out = []
        for p in _list(sim, "v1", "Pod", ns):
            if p["metadata"]["name"].startswith(run + "-") and p["spec"].get("nodeName"):
                c = p["spec"]["containers"][0]["name"]
                out.append(sim.store.read_log(ns, p["metadata"]["name"], c)[0].decode())
        return "\n".join(out)

    assert "[Rank 0] step=" in log_of("deepspeed-skipped-all") and "OVERFLOW! Rank 0 Skipping step" in \
        log_of("deepspeed-skipped-all")
    bars = log_of("eval-bars")
    assert "Validation DataLoader 0:" in bars and "\r" in bars and "v_num=" in bars
    assert "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=" in log_of("hang-no-steps")
    assert "submitted successfully" in log_of("submitter-worker-pending")
    assert "{'loss': " in log_of("hf-loss-dicts") and "step" not in log_of("hf-loss-dicts").split("{'loss'", 1)[1]
    lag = log_of("lagging-ranks")
    assert "[rank0]: [" in lag and "[rank1]: [" in lag
