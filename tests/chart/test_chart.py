"""The Helm chart, rendered by Helm itself (helm-python-sdk embeds Helm v4), linted, its values
checked against values.schema.json, and every core object validated against Kubernetes 1.30."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from collector.agent.command import agent as agent_command
from collector.cli import controller as cli_controller
from collector.config import load_settings
from collector.settings import ControllerSettings
from collector.sources.inventory import DEPLOYMENTS, ENVIRONMENT_READS
from collector.sources.kube_api import DEFAULT_RESOURCES
from collector.sources.visibility import CQ_RESOURCE
from collector.sources.visibility import GROUP as VISIBILITY_GROUP

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "taugrid-evidence"
KUBE = "1.30"
REQUIRED = {"image": {"repository": "registry.example/taugrid-evidence"}}
# Everything a user may change, changed at once.
CUSTOM: dict[str, Any] = {
    "image": {"repository": "acr.example.io/te", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "acr"}],
    "azureWorkloadIdentity": {"clientId": "00000000-1111-2222-3333-444444444444",
                              "tenantId": "55555555-6666-7777-8888-999999999999"},
    "controller": {"replicas": 3, "metricsPort": 9000, "logLevel": "debug", "priorityClassName": "system",
                   "runSeries": "unhealthy", "streamLists": True,
                   "nodeSelector": {"pool": "system"},
                   "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                   "config": {"claims": {"evidence_max_age": "3m", "stall_multiplier": 4},
                              "controller": {"ray_counter_by_profile": {"llm": "ray_llm_steps_total"},
                                             "retention": "30m", "lease_name": "te-lease"}}},
    "agent": {"metricsPort": 9500, "kmsg": False, "runtimeClassName": "nvidia",
              "nodeSelector": {"accelerator": "nvidia"}, "tolerations": []},
    "serviceMonitor": {"interval": "30s", "scrapeTimeout": "25s", "labels": {"release": "kube-prometheus-stack"},
                       "sampleLimit": 200_000, "bodySizeLimit": "64MB", "labelLimit": 64,
                       "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"],
                                              "regex": "taugrid_run_evidence_age_seconds"}],
                       "agent": {"sampleLimit": 5_000, "bodySizeLimit": "4MB"}},
    "prometheusRule": {"labels": {"release": "kube-prometheus-stack"}, "additionalAlertLabels": {"team": "ml"},
                       "runbookBaseUrl": "https://wiki.example/taugrid/runbooks",
                       "disabled": {"TaugridRunSlowedDown": True},
                       "alerts": {"TaugridRunBlockedTooLong": {"for": "15m", "severity": "critical"}}},
    "adxMon": {"enabled": True},
    "grafanaDashboards": {"enabled": True, "labels": {"team": "ml"}},
    "networkPolicy": {"egressCIDRs": ["10.0.0.1/32"], "prometheusNamespaceSelector":
                      {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
}
NO_EXTRAS: dict[str, Any] = {
    **REQUIRED, "agent": {"enabled": False}, "controller": {"replicas": 1}, "serviceMonitor": {"enabled": False},
    "prometheusRule": {"enabled": False}, "networkPolicy": {"enabled": False},
}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}  # kubernetes-validate has no CRD schemas
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate", "*"}


def mounted(args: list[str], tmp: Path) -> list[str]:
    """Rendered arguments with the mount points of Secret files (token, TLS) mapped to files in
    `tmp`, so that the commands' own parsers (which check that the files exist) read them."""
    for name in ("token", "tls.crt", "tls.key"):
        (tmp / name).write_text("stands in for the mounted Secret file\n")
    return [a.replace("/etc/taugrid-evidence/auth/", f"{tmp}/").replace("/etc/taugrid-evidence/tls/", f"{tmp}/")
            for a in args]


def render(values: dict[str, Any], namespace: str = "observability") -> list[dict[str, Any]]:
    manifests = helm.Chart.load(CHART).render(values, name="taugrid-evidence", namespace=namespace)
    return [d for path, text in manifests.items() if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def notes(values: dict[str, Any]) -> str:
    manifests = helm.Chart.load(CHART).render(values, name="taugrid-evidence", namespace="observability")
    return manifests["taugrid-evidence/templates/NOTES.txt"]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


@pytest.fixture(scope="module", params=["default", "custom", "minimal"])
def case(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    values = {"default": REQUIRED, "custom": CUSTOM, "minimal": NO_EXTRAS}[request.param]
    return request.param, values, render(values)


def test_values_validate_against_the_schema(case: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    helm.Chart.load(CHART).validate_schema(case[1])


@pytest.mark.parametrize("bad, where", [
    ({"controler": {}}, "controler"),
    ({"controller": {"metricsPort": 70000}}, "metricsPort"),
    ({"controller": {"config": {"claims": {"evidence_max_age": "soon"}}}}, "evidence_max_age"),
    ({"controller": {"config": {"controller": {"no_such_setting": 1}}}}, "no_such_setting"),
    ({"agent": {"podResourcesPath": "relative/dir"}}, "podResourcesPath"),
    ({"agent": {"logScope": "heads"}}, "logScope"),
    ({"controller": {"runSeries": "healthy"}}, "runSeries"),
    ({"controller": {"config": {"controller": {"log_pass_max_gets": -1}}}}, "log_pass_max_gets"),
    ({"controller": {"config": {"controller": {"log_pass_max_bytes": "64MiB"}}}}, "log_pass_max_bytes"),
    ({"controller": {"config": {"controller": {"run_series": "all"}}}}, "run_series"),  # one knob: runSeries
    ({"controller": {"config": {"controller": {"stream_lists": True}}}}, "stream_lists"),  # one knob: streamLists
    ({"controller": {"streamLists": "yes"}}, "streamLists"),
    ({"azureWorkloadIdentity": {"clientId": "not-a-guid"}}, "clientId"),
    ({"auth": {"existingSecret": "Not_A_Secret_Name"}}, "existingSecret"),
    ({"auth": {"enabled": "yes"}}, "enabled"),
    ({"environmentCheck": {"namespaces": ["Kueue System"]}}, "namespaces"),
    ({"controller": {"tls": {"secretName": "te-tls", "caFile": "/x"}}}, "caFile"),
    ({"agent": {"tls": {"serverName": "bad name"}}}, "serverName"),
    ({"serviceMonitor": {"scrapeTimeout": "ten seconds"}}, "scrapeTimeout"),
    ({"serviceMonitor": {"sampleLimit": -1}}, "sampleLimit"),
    ({"serviceMonitor": {"bodySizeLimit": "10 MiB"}}, "bodySizeLimit"),
    ({"serviceMonitor": {"relabelings": [{"action": "rename"}]}}, "action"),
    ({"serviceMonitor": {"agent": {"sampleLimits": 5}}}, "sampleLimits"),
    ({"prometheusRule": {"runbookBaseUrl": "docs/runbooks.md"}}, "runbookBaseUrl"),
    ({"prometheusRule": {"alerts": {"TaugridRunStalled": {"severity": "page"}}}}, "severity"),
    ({"prometheusRule": {"alerts": {"TaugridRunStalled": {"for": "5 minutes"}}}}, "for"),
    ({"prometheusRule": {"additionalAlertLabels": {"bad-label": "x"}}}, "bad-label"),
    ({"grafanaDashboards": {"namespace": "Monitoring"}}, "namespace"),
])
def test_the_schema_refuses_bad_values_naming_them(bad: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmError) as e:
        helm.Chart.load(CHART).validate_schema({**REQUIRED, **bad})
    assert where in str(e.value)


def test_a_missing_image_repository_is_named() -> None:
    with pytest.raises(helm.HelmError, match="image.repository is required"):
        helm.Chart.load(CHART).render({}, name="x", namespace="y")


@pytest.mark.parametrize("values", [REQUIRED, CUSTOM, NO_EXTRAS], ids=["default", "custom", "minimal"])
def test_lint_is_clean(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE}.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert problems == []


def test_every_core_object_is_valid_kubernetes(case: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    name, _, objs = case
    core = [o for o in objs if o["kind"] not in CRD_KINDS]
    kinds = sorted(o["kind"] for o in core)
    expect = ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Role", "RoleBinding",
              "Service", "ServiceAccount", "Secret"]
    expect += ["Role", "RoleBinding"] * 3  # the environment check's Deployment read, per namespace
    expect += ["Role", "RoleBinding"]  # node Leases, read in kube-node-lease
    if name != "minimal":
        expect += ["DaemonSet", "NetworkPolicy", "NetworkPolicy", "Service", "ServiceAccount",
                   "PodDisruptionBudget"]
    if name == "custom":
        expect += ["ConfigMap"] * 4  # the Prometheus dashboards for Grafana's sidecar
    assert kinds == sorted(expect)
    for obj in core:
        try:
            kubernetes_validate.validate(obj, KUBE, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e}")


def test_cluster_role_is_read_only_and_never_touches_secrets(
        case: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    _, _, objs = case
    [role] = by_kind(objs, "ClusterRole")
    for rule in role["rules"]:
        assert not WRITE_VERBS & set(rule["verbs"]), rule
        assert "secrets" not in rule["resources"] and "*" not in rule["resources"], rule
        assert "*" not in rule["apiGroups"] and not rule.get("nonResourceURLs"), rule
    # Exactly what the collector watches (collector/sources/kube_api.py), plus log tails.
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    used = {(res.group, res.plural, v) for res in DEFAULT_RESOURCES if not res.namespace for v in ("list", "watch")}
    deployments = {(DEPLOYMENTS.group, DEPLOYMENTS.plural, "list")}
    # The environment check's Deployment read is namespaced (a Role where the controllers run):
    # the ClusterRole grants no cluster-wide Deployment read.
    visibility = {(VISIBILITY_GROUP, CQ_RESOURCE.removesuffix(f".{VISIBILITY_GROUP}"), "get")}  # what it reads
    assert granted == used | {("", "pods/log", "get")} | visibility | (ENVIRONMENT_READS - deployments)
    roles = by_kind(objs, "Role")
    env = [r for r in roles if r["metadata"]["name"].endswith("-environment")]
    assert {r["metadata"]["namespace"] for r in env} == {"kueue-system", "ray-system", "taugrid-system"}
    for r in env:
        assert r["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list"]}]
    # Resources watched in one namespace (node Leases) are granted there alone, read-only.
    in_ns = [r for r in roles if r["metadata"]["name"].endswith("-node-leases")]
    assert {(r["metadata"]["namespace"], rule["apiGroups"][0], rule["resources"][0], tuple(rule["verbs"]))
            for r in in_ns for rule in r["rules"]} == \
        {(res.namespace, res.group, res.plural, ("list", "watch")) for res in DEFAULT_RESOURCES if res.namespace}
    # The one write is the Lease, in the release namespace only: get and update name it; create
    # (which RBAC cannot check by name) is the only verb without resourceNames.
    [lease] = [r for r in roles if r not in env and r not in in_ns]
    assert lease["metadata"]["namespace"] == "observability"
    lease_name = load_settings(None).controller.lease_name
    if case[0] == "custom":
        lease_name = CUSTOM["controller"]["config"]["controller"]["lease_name"]
    assert lease["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease_name],
         "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    assert {b["roleRef"]["name"] for b in by_kind(objs, "ClusterRoleBinding")} == {role["metadata"]["name"]}
    for b in by_kind(objs, "RoleBinding"):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "taugrid-evidence-controller",
                                  "namespace": "observability"}]


def test_without_environment_namespaces_deployments_are_read_cluster_wide() -> None:
    objs = render({**REQUIRED, "environmentCheck": {"namespaces": []}})
    [role] = by_kind(objs, "ClusterRole")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert granted >= ENVIRONMENT_READS
    assert not [r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-environment")]
    [cm] = by_kind(objs, "ConfigMap")
    assert "environment_namespaces" not in cm["data"]["config.yaml"]


def test_controller_runs_the_rendered_config(case: tuple[str, dict[str, Any], list[dict[str, Any]]],
                                             tmp_path: Path) -> None:
    name, values, objs = case
    [cm] = [c for c in by_kind(objs, "ConfigMap") if "-dashboard-" not in c["metadata"]["name"]]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    settings = load_settings(path)  # the collector's own parser: unknown keys and bad durations fail
    assert settings.controller.lease_namespace == "observability"
    assert settings.controller.run_series == ("unhealthy" if name == "custom" else "all")
    assert settings.controller.stream_lists is (name == "custom")
    # the API log pass's ceiling, as the chart states it (the same as the collector's own default)
    assert (settings.controller.log_pass_max_gets, settings.controller.log_pass_max_bytes) == (
        ControllerSettings().log_pass_max_gets, ControllerSettings().log_pass_max_bytes) == (2000, 64 << 20)
    # the controller polls the agents on the port the DaemonSet serves (the chart's, not the command's default)
    [ds] = by_kind(objs, "DaemonSet") or [None]
    if ds is not None:
        [agent] = ds["spec"]["template"]["spec"]["containers"]
        assert settings.controller.agents.port == agent["ports"][0]["containerPort"]
    if name == "custom":
        assert settings.claims.evidence_max_age.total_seconds() == 180
        assert settings.controller.ray_counter_by_profile == {"llm": "ray_llm_steps_total"}
    [dep] = by_kind(objs, "Deployment")
    assert dep["spec"]["replicas"] == values.get("controller", {}).get("replicas", 2)
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    [c] = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert "--config=/etc/taugrid-evidence/config.yaml" in c["args"]
    # The real CLI parses the rendered arguments (the config path swapped for the rendered file).
    args = mounted([a if not a.startswith("--config=") else f"--config={path}" for a in c["args"]], tmp_path)
    assert args[0] == "controller"
    ctx = cli_controller.make_context("controller", args[1:])
    assert ctx.params["metrics_address"] == f"0.0.0.0:{values.get('controller', {}).get('metricsPort', 9464)}"
    assert c["image"].startswith(values["image"]["repository"] + ":")


def test_agent_daemonset_reads_the_node_read_only(tmp_path: Path) -> None:
    objs = render(REQUIRED)
    [ds] = by_kind(objs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    [c] = pod["containers"]
    assert c["command"] == ["taugrid-evidence", "agent", "--address=$(POD_IP):9465", "--node=$(NODE_NAME)",
                            "--log-scope=all", "--token-file=/etc/taugrid-evidence/auth/token"]
    # The agent's own CLI parses what the DaemonSet runs (the env references as the kubelet expands them).
    ctx = agent_command.make_context("agent", [a.replace("$(POD_IP)", "10.0.0.7").replace("$(NODE_NAME)", "n1")
                                               for a in mounted(c["command"][2:], tmp_path)])
    assert ctx.params["address"] == "10.0.0.7:9465" and ctx.params["node"] == "n1"
    assert {e["name"] for e in c["env"]} >= {"POD_IP", "NODE_NAME"}
    assert {p["containerPort"] for p in c["ports"]} == {9465}
    assert c["image"].endswith("-agent")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for path in ("/var/lib/kubelet/pod-resources", "/var/log/pods", "/dev/kmsg"):
        assert mounts[path]["readOnly"] is True
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert pod["automountServiceAccountToken"] is False
    # Without the kernel log: no /dev/kmsg, no capability at all.
    [ds] = by_kind(render({**REQUIRED, "agent": {"kmsg": False}}), "DaemonSet")
    [c] = ds["spec"]["template"]["spec"]["containers"]
    assert "/dev/kmsg" not in {m["mountPath"] for m in c["volumeMounts"]}
    # not followed either
    assert agent_command.make_context("agent", mounted(c["command"][2:], tmp_path)).params["kmsg"] == ""
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # By default every pod's logs (the Ray heads' too); only GPU pods' on request: flags the agent accepts.
    assert agent_command.make_context("agent", mounted(c["command"][2:], tmp_path)).params["log_scope"] == "all"
    [ds] = by_kind(render({**REQUIRED, "agent": {"logScope": "gpu"}}), "DaemonSet")
    [c] = ds["spec"]["template"]["spec"]["containers"]
    assert "--log-scope=gpu" in c["command"]
    assert agent_command.make_context("agent", mounted(c["command"][2:], tmp_path)).params["log_scope"] == "gpu"


def test_workload_identity_and_adx_mon_annotations() -> None:
    objs = render(CUSTOM)
    for sa in by_kind(objs, "ServiceAccount"):
        assert sa["metadata"]["annotations"]["azure.workload.identity/client-id"] == CUSTOM[
            "azureWorkloadIdentity"]["clientId"]
    for w in by_kind(objs, "Deployment") + by_kind(objs, "DaemonSet"):
        meta = w["spec"]["template"]["metadata"]
        assert meta["labels"]["azure.workload.identity/use"] == "true"
        port = w["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        assert meta["annotations"]["adx-mon/scrape"] == "true"
        assert meta["annotations"]["adx-mon/port"] == str(port)
    plain = render(REQUIRED)
    for sa in by_kind(plain, "ServiceAccount"):
        assert "annotations" not in sa["metadata"]
    for w in by_kind(plain, "Deployment"):
        assert "adx-mon/scrape" not in w["spec"]["template"]["metadata"]["annotations"]


def test_network_policy_lets_the_controller_reach_ray_and_agents() -> None:
    objs = render(REQUIRED)
    pols = {p["metadata"]["name"].rsplit("-", 1)[-1]: p for p in by_kind(objs, "NetworkPolicy")}
    egress = pols["controller"]["spec"]["egress"]
    ray = [e for e in egress if any("podSelector" in t and "namespaceSelector" in t for t in e.get("to", []))]
    assert ray and ray[0]["to"][0]["podSelector"]["matchExpressions"][0]["key"] == "ray.io/node-type"
    assert {p["port"] for p in ray[0]["ports"]} == {8265, 8080}
    agent = [e for e in egress if any(t.get("podSelector", {}).get("matchLabels", {}).get(
        "app.kubernetes.io/component") == "agent" for t in e.get("to", []))]
    assert [p["port"] for p in agent[0]["ports"]] == [9465]
    ingress = pols["agent"]["spec"]["ingress"][0]["from"]
    assert ingress[0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "controller"


def test_service_monitors_honor_the_runs_namespace_label() -> None:
    objs = render(REQUIRED)
    mons = by_kind(objs, "ServiceMonitor")
    assert len(mons) == 2
    for m in mons:
        assert m["spec"]["endpoints"][0]["honorLabels"] is True
        svc = [s for s in by_kind(objs, "Service")
               if s["metadata"]["labels"]["app.kubernetes.io/component"]
               == m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]]
        assert svc and svc[0]["spec"]["ports"][0]["name"] == m["spec"]["endpoints"][0]["port"]
    [agent] = [m for m in mons if m["metadata"]["name"].endswith("-agent")]
    assert agent["spec"]["endpoints"][0]["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]


def test_prometheus_rule_carries_the_rule_files_and_promtool_accepts_it(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: apt-get install -y --no-install-recommends prometheus", pytrace=False)
    files = sorted((CHART / "rules").glob("*.rules.yaml"))
    want = [g for f in files for g in yaml.safe_load(f.read_text())["groups"]]
    # as written, but for the runbook links, left out without a base URL (the default)
    assert yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookBaseUrl"] == ""
    for r in (r for g in want for r in g["rules"] if "alert" in r):
        del r["annotations"]["runbook_url"]
    for values, expect in ((REQUIRED, want), ({**REQUIRED, "agent": {"enabled": False}}, None)):
        [rule] = by_kind(render(values), "PrometheusRule")
        groups = rule["spec"]["groups"]
        if expect is not None:
            assert sorted(json.dumps(g, sort_keys=True) for g in groups) == sorted(
                json.dumps(g, sort_keys=True) for g in expect)
        else:  # without agents, no GPU or agent alerts that could only misfire
            assert not any("Agent" in r.get("alert", "") or "Gpu" in r.get("alert", "")
                           for g in groups for r in g["rules"])
        out = tmp_path / "rendered.rules.yaml"
        out.write_text(yaml.safe_dump({"groups": groups}))
        result = subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def _container(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [w] = by_kind(objs, kind)
    [c] = w["spec"]["template"]["spec"]["containers"]
    return dict(c)


def _volumes(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    [w] = by_kind(objs, kind)
    return {v["name"]: v for v in w["spec"]["template"]["spec"]["volumes"]}


def test_one_token_guards_the_controller_and_the_agents_and_prometheus_sends_it(tmp_path: Path) -> None:
    objs = render(REQUIRED)
    [secret] = by_kind(objs, "Secret")
    assert secret["metadata"]["name"] == "taugrid-evidence-token"
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 48 and token.isalnum()
    ctl, agent = _container(objs, "Deployment"), _container(objs, "DaemonSet")
    assert "--metrics-token-file=/etc/taugrid-evidence/auth/token" in ctl["args"]
    assert "--token-file=/etc/taugrid-evidence/auth/token" in agent["command"]
    for kind, c in (("Deployment", ctl), ("DaemonSet", agent)):
        assert {"name": "token", "mountPath": "/etc/taugrid-evidence/auth", "readOnly": True} in c["volumeMounts"]
        assert _volumes(objs, kind)["token"]["secret"] == {"secretName": "taugrid-evidence-token",
                                                          "items": [{"key": "token", "path": "token"}]}
    # The controller's agent reader sends the same file's token.
    [cm] = by_kind(objs, "ConfigMap")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    agents = load_settings(tmp_path / "config.yaml").controller.agents
    assert agents.token_file == "/etc/taugrid-evidence/auth/token" and agents.ca_file == ""
    for mon in by_kind(objs, "ServiceMonitor"):
        [ep] = mon["spec"]["endpoints"]
        assert ep["authorization"] == {"type": "Bearer", "credentials": {"name": "taugrid-evidence-token",
                                                                          "key": "token"}}
        assert "scheme" not in ep and "tlsConfig" not in ep
    # The user's own Secret: the chart makes none and names theirs everywhere.
    objs = render({**REQUIRED, "auth": {"existingSecret": "from-vault"}})
    assert not by_kind(objs, "Secret")
    assert _volumes(objs, "DaemonSet")["token"]["secret"]["secretName"] == "from-vault"
    assert _volumes(objs, "Deployment")["token"]["secret"]["secretName"] == "from-vault"
    assert {m["spec"]["endpoints"][0]["authorization"]["credentials"]["name"]
            for m in by_kind(objs, "ServiceMonitor")} == {"from-vault"}
    # Turned off: the agent must be told it serves without a token (it refuses otherwise).
    objs = render({**REQUIRED, "auth": {"enabled": False}})
    assert not by_kind(objs, "Secret")
    agent = _container(objs, "DaemonSet")
    assert "--allow-unauthenticated" in agent["command"] and not [a for a in agent["command"] if "token" in a]
    assert agent_command.make_context("agent", [a.replace("$(POD_IP)", "10.0.0.7") for a in agent["command"][2:]]
                                      ).params["allow_unauthenticated"] is True
    assert not [a for a in _container(objs, "Deployment")["args"] if "token" in a]


def test_tls_for_the_controller_and_the_agents(tmp_path: Path) -> None:
    values = {**REQUIRED, "controller": {"tls": {"secretName": "controller-tls"}},
              "agent": {"tls": {"secretName": "agent-tls"}}}
    helm.Chart.load(CHART).validate_schema(values)
    objs = render(values)
    ctl, agent = _container(objs, "Deployment"), _container(objs, "DaemonSet")
    for c, args in ((ctl, ctl["args"]), (agent, agent["command"])):
        assert "--tls-cert-file=/etc/taugrid-evidence/tls/tls.crt" in args
        assert "--tls-private-key-file=/etc/taugrid-evidence/tls/tls.key" in args
        assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert _volumes(objs, "DaemonSet")["tls"]["secret"]["secretName"] == "agent-tls"
    ctl_volumes = _volumes(objs, "Deployment")
    assert ctl_volumes["tls"]["secret"]["secretName"] == "controller-tls"
    # The controller holds the agents' CA, never their key.
    assert ctl_volumes["agent-ca"]["secret"] == {"secretName": "agent-tls", "items": [{"key": "ca.crt",
                                                                                        "path": "ca.crt"}]}
    [cm] = by_kind(objs, "ConfigMap")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    agents = load_settings(tmp_path / "config.yaml").controller.agents
    assert agents.ca_file == "/etc/taugrid-evidence/agent-ca/ca.crt"
    assert agents.server_name == "taugrid-evidence-agent.observability.svc"
    mons = {m["metadata"]["name"].rsplit("-", 1)[-1]: m["spec"]["endpoints"][0]
            for m in by_kind(objs, "ServiceMonitor")}
    for component, secret in (("controller", "controller-tls"), ("agent", "agent-tls")):
        assert mons[component]["scheme"] == "https"
        assert mons[component]["tlsConfig"] == {"ca": {"secret": {"name": secret, "key": "ca.crt"}},
                                                "serverName": f"taugrid-evidence-{component}.observability.svc"}
    # The commands parse what the chart runs.
    args = [a if not a.startswith("--config=") else f"--config={tmp_path / 'config.yaml'}" for a in ctl["args"][1:]]
    params = cli_controller.make_context("controller", mounted(args, tmp_path)).params
    assert params["tls_cert_file"] == tmp_path / "tls.crt" and params["metrics_token_file"] == tmp_path / "token"
    agent_command.make_context("agent", mounted([a.replace("$(POD_IP)", "10.0.0.7") for a in agent["command"][2:]],
                                                tmp_path))
    for obj in objs:
        if obj["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(obj, KUBE, strict=True)


def test_the_environment_check_reads_deployments_only_where_the_chart_grants_it() -> None:
    """Against the simulator: with the chart's namespaces the check still finds every controller,
    and a Deployment elsewhere (a tenant's look-alike) is not read; cluster-wide, it is."""
    from kubernetes import client as k8s

    from collector.sources.inventory import read_cluster
    from collector.sources.kube_api import KubeApi, api_client_for
    from kubesim import Simulator
    from tests.multicluster.envobjects import deployment, supported_objects

    objs = render(REQUIRED)
    [cm] = by_kind(objs, "ConfigMap")
    namespaces = yaml.safe_load(cm["data"]["config.yaml"])["controller"]["environment_namespaces"]
    decoy = deployment("kueue-lookalike", "tenant-a", "registry.k8s.io/kueue/kueue:v0.1.0")
    sim = Simulator()
    sim.start("127.0.0.1:0")
    try:
        cfg = k8s.Configuration()
        cfg.host = sim.base_url
        with k8s.ApiClient(cfg) as api:
            apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
            for ns in {o["metadata"]["namespace"] for o in [*supported_objects(), decoy] if o["kind"] == "Deployment"}:
                core.create_namespace(body={"metadata": {"name": ns}}, _preload_content=False)
            for o in [*supported_objects(), decoy]:
                if o["kind"] == "Deployment":
                    apps.create_namespaced_deployment(o["metadata"]["namespace"], body=o, _preload_content=False)
        kube = KubeApi(api_client_for(sim.base_url))
        scoped = read_cluster("manager", kube, namespaces)
        wide = read_cluster("manager", kube, ())  # an empty list: cluster-wide, as the chart allows
    finally:
        sim.close()
    assert scoped.errors == () and wide.errors == ()
    assert scoped.inventory.images == {"kueue": ("v0.18.2",), "kuberay": ("v1.6.2",), "taugrid": ("0.3.1",)}
    assert wide.inventory.images["kueue"] == ("v0.1.0", "v0.18.2")  # what a cluster-wide read also sees
