"""Ray scraping cannot be pointed at other hosts or forged by look-alike pods (issue 8).

A tenant writes RayJob status (`dashboardURL`) and can create pods carrying any labels. Only the
RayCluster's own head service is asked, and only worker pods the RayCluster owns are scraped.
"""

from __future__ import annotations

from typing import Any

import pytest

from collector.controller import Controller
from collector.kube import normalize
from collector.model import Ref
from collector.sources.kube_api import KubeApi, api_client_for
from collector.sources.ray import dashboard_url_for
from tests.controller.test_controller import T0, settings

HEAD = "http://rc-head-svc.ns.svc.cluster.local:8265"


def worker(name: str, ip: str, *, owner: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                            "labels": {"ray.io/cluster": "rc", "ray.io/node-type": "worker"}}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "ray.io/v1", "controller": True, **owner}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": "n"},
            "status": {"phase": "Running", "podIP": ip}}


def targets(dashboard_url: str, pods: list[dict[str, Any]]) -> Any:
    c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")), settings(), lambda: T0)
    rj = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj", "namespace": "ns", "uid": "uid-rj"},
          "spec": {}, "status": {"rayClusterName": "rc", "jobId": "rj-abc", "dashboardURL": dashboard_url}}
    rcl = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
           "metadata": {"name": "rc", "namespace": "ns", "uid": "uid-rc",
                        "ownerReferences": [{"kind": "RayJob", "name": "rj", "uid": "uid-rj"}]},
           "spec": {}, "status": {"head": {"serviceName": "rc-head-svc"}, "endpoints": {"metrics": "8080"}}}
    for obj in (rj, rcl, *pods):
        rec = normalize(obj).record
        assert rec is not None
        c.index.upsert(rec)
    [(_, target)] = c._ray_targets_of(c.index.evidence(Ref("RayJob", "ns", "rj")))
    return target


def test_only_pods_the_raycluster_owns_are_scraped() -> None:
    t = targets("rc-head-svc.ns.svc.cluster.local:8265", [
        worker("rc-worker-0", "10.1.0.1", owner={"kind": "RayCluster", "name": "rc", "uid": "uid-rc"}),
        worker("lookalike", "10.9.9.9", owner=None),  # labelled like a worker of rc, owned by nobody
        worker("other", "10.9.9.8", owner={"kind": "RayCluster", "name": "other-rc", "uid": "uid-x"}),
        worker("by-job", "10.9.9.6", owner={"kind": "Job", "name": "rc", "uid": "uid-j"}),
    ])
    assert t.worker_metrics_urls == ("http://10.1.0.1:8080/metrics",)


@pytest.mark.parametrize("url", [
    "169.254.169.254:80",  # cloud instance metadata
    "http://169.254.169.254/metadata/identity/oauth2/token",
    "kubernetes.default.svc:443",  # the API server
    "127.0.0.1:8265",
    "rc-head-svc.other-ns.svc.cluster.local:8265",  # a head service, of another namespace
    "attacker-svc.ns.svc.cluster.local:8265",  # another service in the run's namespace
    "rc-head-svc.ns.svc.cluster.local.attacker.example:8265",
    "http://user:pw@rc-head-svc.ns.svc.cluster.local:8265",
])
def test_a_dashboard_url_naming_another_host_is_refused(url: str) -> None:
    t = targets(url, [])
    assert t.dashboard_url == HEAD  # the run's own head service, from the RayCluster's status
    assert dashboard_url_for("ns", "rc", rayjob_dashboard_url=url) is None  # nothing else to fall back on


def test_the_head_service_in_its_usual_forms_is_accepted() -> None:
    for url in ("rc-head-svc.ns.svc.cluster.local:8265", "rc-head-svc.ns.svc:8265", "rc-head-svc.ns:8265",
                "http://rc-head-svc.ns.svc.cluster.local:8265/"):
        assert dashboard_url_for("ns", "rc", rayjob_dashboard_url=url) == HEAD
    assert dashboard_url_for("ns", "rc", rayjob_dashboard_url="rc-head-svc.ns.svc.cluster.local:9000") == \
        "http://rc-head-svc.ns.svc.cluster.local:9000"
