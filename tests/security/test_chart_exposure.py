"""What the chart exposes by default (issue 26): who can reach the agents' and the controller's
ports, what they need to read them, and what the controller's ServiceAccount may do.

Rendered by Helm itself (tests/chart has the full render, lint and schema checks)."""

from __future__ import annotations

from typing import Any

from tests.chart.test_chart import REQUIRED, by_kind, render

MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def _ingress_from(objs: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    [pol] = [p for p in by_kind(objs, "NetworkPolicy") if p["metadata"]["name"].endswith(f"-{component}")]
    return [peer for rule in pol["spec"]["ingress"] for peer in rule["from"]]


def test_only_the_controller_and_the_monitoring_namespace_reach_the_agents() -> None:
    objs = render(REQUIRED)
    controller = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "taugrid-evidence",
                                                  "app.kubernetes.io/instance": "taugrid-evidence",
                                                  "app.kubernetes.io/component": "controller"}}}
    assert _ingress_from(objs, "agent") == [controller, MONITORING]
    assert _ingress_from(objs, "controller") == [MONITORING]
    for component in ("agent", "controller"):  # never "every namespace" ({}) by default
        assert all(peer.get("namespaceSelector") != {} for peer in _ingress_from(objs, component))


def test_the_agents_and_the_controller_require_the_token_by_default() -> None:
    objs = render(REQUIRED)
    [ds] = by_kind(objs, "DaemonSet")
    [agent] = ds["spec"]["template"]["spec"]["containers"]
    assert "--token-file=/etc/taugrid-evidence/auth/token" in agent["command"]
    assert "--allow-unauthenticated" not in agent["command"]
    [dep] = by_kind(objs, "Deployment")
    [ctl] = dep["spec"]["template"]["spec"]["containers"]
    assert "--metrics-token-file=/etc/taugrid-evidence/auth/token" in ctl["args"]
    assert all("authorization" in m["spec"]["endpoints"][0] for m in by_kind(objs, "ServiceMonitor"))


def test_the_controller_may_write_one_lease_and_read_deployments_only_where_controllers_run() -> None:
    objs = render(REQUIRED)
    [lease] = [r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    named = [rule for rule in lease["rules"] if rule.get("resourceNames")]
    unnamed = [rule for rule in lease["rules"] if not rule.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["taugrid-evidence-controller"], "verbs": ["get", "update"]}]
    assert [rule["verbs"] for rule in unnamed] == [["create"]]  # RBAC cannot name what a create makes
    [cluster_role] = by_kind(objs, "ClusterRole")
    assert not [rule for rule in cluster_role["rules"] if "deployments" in rule["resources"]]
