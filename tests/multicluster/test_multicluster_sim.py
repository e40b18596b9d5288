"""The multi-cluster simulator: a MultiKueue manager and two workers read through the official client,
and the environment check over all three, with skew introduced mid-scenario."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from collector.sources.inventory import read_environment
from collector.sources.kube_api import KubeApi, load_api_client
from kubesim.multicluster import (
    MULTIKUEUE_MANAGED_BY,
    ORIGIN_LABEL,
    ORIGIN_UID_ANNOTATION,
    PREBUILT_LABEL,
    MultiClusterSimulation,
    load_multicluster,
    multikueue_scenario_path,
)
from kubesim.scenario import ScenarioError


@pytest.fixture
def mc() -> Iterator[MultiClusterSimulation]:
    with MultiClusterSimulation(load_multicluster(multikueue_scenario_path())) as sim:
        yield sim


def _api(kubeconfig: Path, context: str) -> k8s.ApiClient:
    return k8s_config.new_client_from_config(config_file=str(kubeconfig), context=context)


def _workloads(api: k8s.ApiClient, ns: str = "ml") -> dict[str, dict[str, Any]]:
    out = k8s.CustomObjectsApi(api).list_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", ns, "workloads")
    return {w["metadata"]["name"]: w for w in out["items"]}


def _pods(api: k8s.ApiClient, ns: str = "ml") -> list[str]:
    return sorted(p.metadata.name for p in k8s.CoreV1Api(api).list_namespaced_pod(ns).items)


def test_dispatch_loss_and_skew(mc: MultiClusterSimulation, tmp_path: Path) -> None:
    configs = mc.write_kubeconfigs(tmp_path)
    apis = {n: _api(p, n) for n, p in configs.items()}
    wl = mc.workload_name(next(r for r in mc.scenario.runs if r.name == "dispatched"))

    mc.step_to(0)
    manager = _workloads(apis["manager"])
    assert len(manager) == 3
    assert manager[wl]["status"]["admissionChecks"][0]["state"] == "Pending"
    assert "clusterName" not in manager[wl]["status"]
    job = k8s.BatchV1Api(apis["manager"]).read_namespaced_job("dispatched", "ml")
    assert job.spec.managed_by == MULTIKUEUE_MANAGED_BY
    for w in ("worker-1", "worker-2"):
        copy = _workloads(apis[w])[wl]
        assert copy["metadata"]["labels"][ORIGIN_LABEL] == "multikueue"
        assert copy["metadata"]["annotations"][ORIGIN_UID_ANNOTATION] == manager[wl]["metadata"]["uid"]
        assert k8s.BatchV1Api(apis[w]).read_namespaced_job("dispatched", "ml").metadata.labels[PREBUILT_LABEL] == wl

    mc.step_to(60)
    manager = _workloads(apis["manager"])
    assert manager[wl]["status"]["clusterName"] == "worker-1"
    assert manager[wl]["status"]["admissionChecks"][0]["state"] == "Ready"
    assert _pods(apis["worker-1"]) == ["dispatched-0", "dispatched-1"]
    assert _pods(apis["manager"]) == [] and _pods(apis["worker-2"]) == []
    assert wl not in _workloads(apis["worker-2"])  # the losing copy is gone
    other = mc.workload_name(next(r for r in mc.scenario.runs if r.name == "not-admitted-there"))
    assert manager[other]["status"]["clusterName"] == "worker-2"
    admitted = {c["type"]: c["status"] for c in _workloads(apis["worker-2"])[other]["status"]["conditions"]}
    assert admitted == {"QuotaReserved": "True", "Admitted": "False"}

    kube = [(n, KubeApi(load_api_client(str(p), n))) for n, p in configs.items()]
    report, errors = read_environment(kube)
    assert errors == () and report.supported, report.violations

    mc.step_to(130)  # worker-2 upgraded at 90; worker-1 lost the run at 120
    manager = _workloads(apis["manager"])
    assert "clusterName" not in manager[wl]["status"]
    assert manager[wl]["status"]["admissionChecks"][0]["state"] == "Retry"
    assert _pods(apis["worker-1"]) == []
    assert k8s.VersionApi(apis["worker-2"]).get_code().git_version == "v1.32.1"
    report, errors = read_environment(kube)
    assert [(v.cluster, v.check.value, v.reason.value) for v in report.violations] == [
        ("worker-2", "kubernetes", "skew")]


def test_bad_scenarios_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: [{name: m}, {name: w}]\nruns: [{name: r, timeline: [{at: 0, do: admit, worker: m}]}]\n")
    with pytest.raises(ScenarioError, match=r"bad.yaml: runs\[0\].timeline\[0\].worker"):
        load_multicluster(bad)
    bad.write_text("clusters: [{name: m}]\n")
    with pytest.raises(ScenarioError, match="a manager and at least one worker"):
        load_multicluster(bad)
