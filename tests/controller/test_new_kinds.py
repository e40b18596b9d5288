"""DRA ResourceClaims, Kueue AdmissionChecks and Karpenter NodeClaims: watched when served, absent otherwise.

The live controller and `explain` on a dump of the same objects name the same owner for each wait.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from collector.cli import main
from collector.controller import Controller
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.registry import DEFAULT_RESOURCES, ResourceType
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, Clock, ensure_namespaces, server_side, settings, wait_until
from tests.dumpkit import event, meta, owner_of, pod, ts, write_dump

_EXTRA = (
    ResourceType(group="resource.k8s.io", version="v1", plural="resourceclaims", kind="ResourceClaim"),
    ResourceType(group="kueue.x-k8s.io", version="v1beta1", plural="admissionchecks", kind="AdmissionCheck",
                 namespaced=False),
    ResourceType(group="karpenter.sh", version="v1", plural="nodeclaims", kind="NodeClaim", namespaced=False),
)


_NEW = {(t.group, t.plural) for t in _EXTRA}
# The simulator may come to serve these itself: add what it lacks, or take them all away.
WITH_NEW = (*DEFAULT_RESOURCES, *(t for t in _EXTRA if (t.group, t.plural) not in
                                  {(d.group, d.plural) for d in DEFAULT_RESOURCES}))
WITHOUT_NEW = tuple(t for t in DEFAULT_RESOURCES if (t.group, t.plural) not in _NEW)


def objects() -> list[dict[str, Any]]:
    t = T0 - timedelta(minutes=8)

    def job(name: str, suspend: bool = False) -> dict[str, Any]:
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": meta(name, "team-a", f"uid-{name}", t, labels={"kueue.x-k8s.io/queue-name": "team-a"}),
                "spec": {"parallelism": 1, "suspend": suspend, "template": {"spec": {"containers": []}}},
                "status": {} if suspend else {"active": 1}}

    def workload(owner: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                "metadata": meta(f"job-{owner['metadata']['name']}", "team-a", "w" + owner["metadata"]["name"], t,
                                 owner=owner_of(owner)),
                "spec": {"queueName": "team-a", "podSets": [{"name": "main", "count": 1}]}, "status": status}

    admitted = {"admission": {"clusterQueue": "gpu"}, "conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved in "
         "ClusterQueue gpu", "lastTransitionTime": ts(t)},
        {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted",
         "lastTransitionTime": ts(t)}]}
    dra_job = job("dra")
    dra_pod = pod("dra-0", "team-a", t, node=None, phase="Pending", gpus=0, owner=owner_of(dra_job))
    dra_pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "dra-gpu"}]
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": meta("dra-gpu", "team-a", "c1", t),
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
             "status": {}}
    prov_job = job("prov", suspend=True)
    pending_check = {"admission": {"clusterQueue": "gpu"},
                     "admissionChecks": [{"name": "dws-prov", "state": "Pending", "message": "",
                                          "lastTransitionTime": ts(t)}],
                     "conditions": [admitted["conditions"][0]]}
    check = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
             "metadata": meta("dws-prov", "", "ac1", t),
             "spec": {"controllerName": "kueue.x-k8s.io/provisioning-request"}}
    karp_job = job("karp")
    karp_pod = pod("karp-0", "team-a", t, node=None, phase="Pending", gpus=8, owner=owner_of(karp_job))
    nominated = event("karp-0.n", "team-a", karp_pod, "Nominated", "Pod should schedule on: nodeclaim/gpu-ljvhl",
                      T0 - timedelta(minutes=7), component="karpenter")
    nodeclaim = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                 "metadata": meta("gpu-ljvhl", "", "nc1", t, labels={"karpenter.sh/nodepool": "gpu"}),
                 "spec": {}, "status": {"conditions": [
                     {"type": "Launched", "status": "True", "reason": "Launched", "lastTransitionTime": ts(t)},
                     {"type": "Registered", "status": "Unknown", "reason": "AwaitingReconciliation",
                      "message": "object is awaiting reconciliation", "lastTransitionTime": ts(t)}]}}
    return [dra_job, workload(dra_job, admitted), dra_pod, claim, prov_job, workload(prov_job, pending_check), check,
            karp_job, workload(karp_job, admitted), karp_pod, nominated, nodeclaim]


def stages(runs: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    return {name: (r["blocked"] or {}).get("stage") for name, r in runs.items()}


def test_new_kinds_are_watched_when_served_and_agree_with_a_dump(tmp_path: Path) -> None:
    clock = Clock(T0)
    objs = objects()
    with Simulator(resources=WITH_NEW, settings=FAST, watch_window=50) as sim:
        sim.start()
        ensure_namespaces(sim, "team-a", "default")
        for o in objs:
            sim.apply(server_side(o))
        c = Controller(KubeApi(api_client_for(sim.base_url)), settings(), clock.now)
        c.open()
        try:
            wait_until(c.ready.is_set, what="controller ready")
            assert {"ResourceClaim", "AdmissionCheck", "NodeClaim"} <= {r.kind for r in c.resources}
            want = {"team-a/dra": "device-allocation", "team-a/prov": "node-scaling", "team-a/karp": "node-scaling"}

            def live() -> dict[str, dict[str, Any]]:
                c.evaluate(full=True)
                return {f"{r.ref.namespace}/{r.ref.name}": r.to_json() for r in c.claims.values()}

            wait_until(lambda: stages(live()) == want, what="owners")
            runs = live()
        finally:
            c.close()
    assert "NodeClaim gpu-ljvhl (NodePool gpu) Registered Unknown" in runs["team-a/karp"]["blocked"]["reason"]
    result = CliRunner().invoke(main, ["explain", "--from-dump", str(write_dump(tmp_path / "d", objs)),
                                       "--at", ts(T0), "-o", "json"])
    assert result.exit_code == 0, result.stderr
    offline = {f"{r['namespace']}/{r['name']}": r for r in json.loads(result.stdout)["runs"]}
    assert stages(offline) == stages(runs)
    for name in runs:
        assert offline[name]["blocked"]["reason"] == runs[name]["blocked"]["reason"], name


def test_absent_apis_are_optional(tmp_path: Path) -> None:
    clock = Clock(T0)
    with Simulator(resources=WITHOUT_NEW, settings=FAST, watch_window=50) as sim:  # no DRA, checks, Karpenter
        sim.start()
        c = Controller(KubeApi(api_client_for(sim.base_url)), settings(), clock.now)
        c.open()
        try:
            wait_until(c.ready.is_set, what="controller ready")
            assert not {"ResourceClaim", "AdmissionCheck", "NodeClaim"} & {r.kind for r in c.resources}
        finally:
            c.close()
