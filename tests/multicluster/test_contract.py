"""The supported-environment contract: every row of the admin guide's table is caught."""

from __future__ import annotations

from envobjects import crd, supported_objects, version

from collector.envcontract import Check, Reason, check, inventory
from collector.settings import ControllerSettings

NS = ControllerSettings().environment_namespaces


def _found(report: object) -> set[tuple[str, str, str]]:
    return {(v.cluster, v.check.value, v.reason.value) for v in report.violations}  # type: ignore[attr-defined]


def test_a_matched_supported_set_passes() -> None:
    clusters = [inventory(n, version(), supported_objects(), NS) for n in ("manager", "worker-a", "worker-b")]
    report = check(clusters)
    assert report.violations == ()
    assert report.supported
    assert report.clusters[0].images == {"kueue": ("v0.18.2",), "kuberay": ("v1.6.2",), "taugrid": ("0.3.1",)}
    assert report.clusters[0].taugrid_charts == ("0.3.1",)
    assert "supported (manager, worker-a, worker-b)" in report.summary()


def test_no_clusters_is_not_supported() -> None:
    assert not check([]).supported


def test_each_row_of_the_table_is_caught() -> None:
    cases = {
        "taugrid not 0.3.x": (version(), supported_objects(taugrid="0.4.0", chart="taugrid-0.4.0"),
                              ("m", "taugrid", "unsupported")),
        "taugrid chart and images from two releases": (version(), supported_objects(chart="taugrid-0.3.2"),
                                                       ("m", "taugrid", "release-mismatch")),
        "kubernetes too old": (version("v1.29.9"), supported_objects(), ("m", "kubernetes", "unsupported")),
        "kueue not 0.18.2": (version(), supported_objects(kueue="v0.18.1"), ("m", "kueue", "unsupported")),
        "kuberay not 1.6.2": (version(), supported_objects(kuberay="v1.5.0"), ("m", "kuberay", "unsupported")),
        "kueue tag not a version": (version(), supported_objects(kueue="latest"), ("m", "kueue", "unknown")),
        "no version document": (None, supported_objects(), ("m", "kubernetes", "unknown")),
    }
    for what, (doc, objects, want) in cases.items():
        report = check([inventory("m", doc, objects, NS)])
        assert want in _found(report), what
        assert not report.supported, what
        assert len(report.violations) == 1, (what, report.violations)


def test_missing_controllers_fail_closed() -> None:
    report = check([inventory("m", version(), [], NS)])
    assert {(c, r) for _, c, r in _found(report)} == {
        ("taugrid", "unknown"), ("kueue", "unknown"), ("kuberay", "unknown")
    }


def test_workers_must_match_the_manager() -> None:
    manager = inventory("manager", version("v1.31.4"), supported_objects(), NS)
    same = inventory("worker-a", version("v1.31.9"), supported_objects(), NS)  # patch versions may differ
    k8s = inventory("worker-b", version("v1.32.0"), supported_objects(), NS)
    crds = inventory("worker-c", version("v1.31.4"), supported_objects(workload_versions=("v1beta1", "v1beta2")),
                     NS)
    report = check([manager, same, k8s, crds])
    assert _found(report) == {("worker-b", "kubernetes", "skew"), ("worker-c", "crd", "skew")}
    detail = next(v.detail for v in report.violations if v.check is Check.CRD)
    assert "workloads.kueue.x-k8s.io" in detail and "v1beta2" in detail


def test_a_crd_missing_on_a_worker_is_skew() -> None:
    manager = inventory("manager", version(), supported_objects(), NS)
    worker = inventory("w", version(), [o for o in supported_objects() if o["metadata"]["name"] != "rayjobs.ray.io"],
                       NS)
    report = check([manager, worker])
    assert [(v.check, v.reason) for v in report.violations] == [(Check.CRD, Reason.SKEW)]
    assert "absent on the worker" in report.violations[0].detail


def test_other_groups_crds_and_odd_objects_are_ignored() -> None:
    objs = [*supported_objects(), crd("certificates", "cert-manager.io"), {"kind": "Deployment"}, {"kind": 3}]
    inv = inventory("m", {"serverVersion": version()}, objs, NS)
    assert "certificates.cert-manager.io" not in inv.crds
    assert check([inv]).supported
    assert inv.kubernetes == "v1.31.4"


def test_json_shape() -> None:
    doc = check([inventory("m", version("v1.29.0"), supported_objects(), NS)]).to_json()
    assert doc["supported"] is False
    assert doc["violations"] == [{"cluster": "m", "check": "kubernetes", "reason": "unsupported",
                                  "detail": "Kubernetes v1.29.0, supported 1.30 or newer"}]
    assert doc["clusters"][0]["crds"]["workloads.kueue.x-k8s.io"] == {"served": ["v1beta1"], "storage": "v1beta1"}


def test_a_tenants_deployment_with_a_controllers_image_is_not_that_controller() -> None:
    """Tenants create Deployments in their own namespaces; one running Kueue's image (an old one) is
    not the cluster's Kueue, and must neither fail nor pass the check for it."""
    from tests.multicluster.envobjects import deployment

    tenant = deployment("kueue-controller-manager", "research", "registry.k8s.io/kueue/kueue:v0.1.0")
    base = check([inventory("m", version(), supported_objects(), NS)])
    with_tenant = check([inventory("m", version(), [*supported_objects(), tenant], NS)])
    assert with_tenant.violations == base.violations
    alone = check([inventory("m", version(), [o for o in supported_objects()
                                              if o["metadata"]["name"] != "kueue-controller-manager"] + [tenant], NS)])
    assert any(v.check == Check.KUEUE and v.reason == Reason.UNKNOWN for v in alone.violations), alone.violations
