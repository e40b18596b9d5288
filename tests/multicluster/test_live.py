"""The environment check read live: a manager and two workers, each a simulator on loopback, set up
and read through the official Kubernetes client; a worker's Kubernetes version skews mid-test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from envobjects import supported_objects
from kubernetes import client as k8s
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.sources.inventory import read_environment
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.prometheus import new_registry
from exporters.prometheus_envcontract import EnvironmentExporter
from kubesim import ManualClock, Simulator, SimulatorSettings

T0 = datetime(2026, 1, 10, 10, 0, 0, tzinfo=UTC)
NAMES = ("manager", "worker-a", "worker-b")


def _load(api: k8s.ApiClient, objects: list[dict[str, Any]]) -> None:
    ext, apps, core = k8s.ApiextensionsV1Api(api), k8s.AppsV1Api(api), k8s.CoreV1Api(api)
    namespaces: set[str] = set()
    for obj in objects:
        if obj["kind"] == "CustomResourceDefinition":
            ext.create_custom_resource_definition(body=obj, _preload_content=False)
        else:
            ns = obj["metadata"]["namespace"]
            if ns not in namespaces:
                core.create_namespace(body={"metadata": {"name": ns}}, _preload_content=False)
                namespaces.add(ns)
            apps.create_namespaced_deployment(ns, body=obj, _preload_content=False)


@pytest.fixture
def clusters() -> Iterator[dict[str, Simulator]]:
    sims: dict[str, Simulator] = {}
    try:
        for name in NAMES:
            sim = Simulator(clock=ManualClock(T0), settings=SimulatorSettings(git_version="v1.31.4"))
            sim.start("127.0.0.1:0")
            sims[name] = sim
            cfg = k8s.Configuration()
            cfg.host = sim.base_url
            with k8s.ApiClient(cfg) as api:
                _load(api, supported_objects())
        yield sims
    finally:
        for sim in sims.values():
            sim.close()


def _metrics(exporter_registry: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(exporter_registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_manager_and_workers_read_live_then_a_worker_skews(clusters: dict[str, Simulator]) -> None:
    apis = [(n, KubeApi(api_client_for(s.base_url))) for n, s in clusters.items()]
    report, errors = read_environment(apis)
    assert errors == ()
    assert report.supported, report.violations
    assert [c.cluster for c in report.clusters] == list(NAMES)
    assert report.clusters[1].crds["workloads.kueue.x-k8s.io"].storage == "v1beta1"
    registry = new_registry()
    exporter = EnvironmentExporter(registry)
    exporter.update(report, T0)
    assert _metrics(registry)[("taugrid_environment_supported", ())] == 1.0

    # Mid-run, worker-b is upgraded to another minor and its Kueue to another release.
    sim = clusters["worker-b"]
    sim.settings = replace(sim.settings, git_version="v1.32.1")
    cfg = k8s.Configuration()
    cfg.host = sim.base_url
    with k8s.ApiClient(cfg) as api:
        k8s.AppsV1Api(api).patch_namespaced_deployment(
            "kueue-controller-manager", "kueue-system",
            {"spec": {"template": {"spec": {"containers": [{"name": "manager",
                                                             "image": "registry.k8s.io/kueue/kueue:v0.19.0"}]}}}},
            _preload_content=False,
        )
    report, errors = read_environment(apis)
    assert not report.supported
    assert {(v.cluster, v.check.value, v.reason.value) for v in report.violations} == {
        ("worker-b", "kubernetes", "skew"), ("worker-b", "kueue", "unsupported"), ("worker-b", "kueue", "skew"),
    }
    exporter.update(report, T0)
    m = _metrics(registry)
    assert m[("taugrid_environment_supported", ())] == 0.0
    violations = {
        dict(k[1])["check"] + "/" + dict(k[1])["reason"] for k in m if k[0] == "taugrid_environment_violation"
    }
    assert violations == {"kubernetes/skew", "kueue/unsupported", "kueue/skew"}


def test_a_worker_that_cannot_be_read_fails_closed(clusters: dict[str, Simulator]) -> None:
    apis = [(n, KubeApi(api_client_for(s.base_url), request_timeout=2.0)) for n, s in clusters.items()]
    clusters["worker-a"].close()
    report, errors = read_environment(apis)
    assert not report.supported
    assert errors and all(e.startswith("worker-a:") for e in errors)
    found = {(v.cluster, v.check.value, v.reason.value) for v in report.violations}
    assert ("worker-a", "kubernetes", "unknown") in found
