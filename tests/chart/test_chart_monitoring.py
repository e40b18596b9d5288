"""The chart's monitoring side and its place in a cluster, rendered by Helm itself: ServiceMonitor
scrape settings and limits (checked by `promtool check config`), PrometheusRule overrides (checked by
`promtool check rules`), the dashboards as Grafana sidecar ConfigMaps, the agent's priority class and
the notes on its node selector, and the chart as a subchart with `global` values."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.chart.test_chart import CHART, CUSTOM, KUBE, REQUIRED, ROOT, by_kind, notes, render


def _scrape_config(mon: dict[str, Any]) -> dict[str, Any]:
    """The scrape settings of a rendered ServiceMonitor in Prometheus's own configuration keys (as
    the operator writes them), so that `promtool check config` judges the values users set."""
    spec, [ep] = mon["spec"], mon["spec"]["endpoints"]
    cfg: dict[str, Any] = {"job_name": mon["metadata"]["name"], "honor_labels": ep["honorLabels"],
                           "scrape_interval": ep["interval"], "static_configs": [{"targets": ["127.0.0.1:1"]}]}
    for key, name in (("sampleLimit", "sample_limit"), ("targetLimit", "target_limit"), ("labelLimit", "label_limit"),
                      ("labelNameLengthLimit", "label_name_length_limit"),
                      ("labelValueLengthLimit", "label_value_length_limit"), ("bodySizeLimit", "body_size_limit")):
        if key in spec:
            cfg[name] = spec[key]
    if "scrapeTimeout" in ep:
        cfg["scrape_timeout"] = ep["scrapeTimeout"]

    def relabel(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
        keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
        return [{keys.get(k, k): (v.lower() if k == "action" else v) for k, v in r.items()} for r in rules]
    cfg["relabel_configs"] = relabel(ep.get("relabelings", []))
    cfg["metric_relabel_configs"] = relabel(ep.get("metricRelabelings", []))
    return cfg


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: apt-get install -y --no-install-recommends prometheus", pytrace=False)
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)


def test_service_monitor_scrape_settings_and_limits(tmp_path: Path) -> None:
    # Defaults: no limit, Prometheus's own timeout, the run's namespace label kept.
    for mon in by_kind(render(REQUIRED), "ServiceMonitor"):
        assert not {"sampleLimit", "targetLimit", "labelLimit", "labelNameLengthLimit", "labelValueLengthLimit",
                    "bodySizeLimit"} & set(mon["spec"])
        [ep] = mon["spec"]["endpoints"]
        assert "scrapeTimeout" not in ep and "metricRelabelings" not in ep and ep["honorLabels"] is True
    user_relabel = {"action": "replace", "targetLabel": "team", "replacement": "ml-platform"}
    values = {**CUSTOM, "serviceMonitor": {**CUSTOM["serviceMonitor"], "relabelings": [user_relabel],
                                           "targetLimit": 10, "labelNameLengthLimit": 128,
                                           "labelValueLengthLimit": 512,
                                           "controller": {"honorLabels": False, "scrapeTimeout": "20s"}}}
    helm.Chart.load(CHART).validate_schema(values)
    mons = {m["metadata"]["name"].rsplit("-", 1)[-1]: m for m in by_kind(render(values), "ServiceMonitor")}
    ctl, agent = mons["controller"], mons["agent"]
    # shared settings on both; the component's own win where it sets them (false included)
    assert ctl["spec"]["sampleLimit"] == 200_000 and ctl["spec"]["bodySizeLimit"] == "64MB"
    assert agent["spec"]["sampleLimit"] == 5_000 and agent["spec"]["bodySizeLimit"] == "4MB"
    for m in (ctl, agent):
        assert m["spec"]["labelLimit"] == 64 and m["spec"]["targetLimit"] == 10
        assert m["spec"]["labelNameLengthLimit"] == 128 and m["spec"]["labelValueLengthLimit"] == 512
        assert m["spec"]["endpoints"][0]["metricRelabelings"] == CUSTOM["serviceMonitor"]["metricRelabelings"]
    [cep], [aep] = ctl["spec"]["endpoints"], agent["spec"]["endpoints"]
    assert cep["honorLabels"] is False and cep["scrapeTimeout"] == "20s"
    assert aep["honorLabels"] is True and aep["scrapeTimeout"] == "25s"
    # the user's relabelings follow the chart's own
    assert ctl["spec"]["endpoints"][0]["relabelings"] == [user_relabel]
    assert agent["spec"]["endpoints"][0]["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}, user_relabel]
    # The token and TLS still ride along, and Prometheus accepts every value as configuration.
    assert ctl["spec"]["endpoints"][0]["authorization"]["credentials"]["key"] == "token"
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [_scrape_config(m) for m in mons.values()]}))
    result = _promtool("check", "config", "--syntax-only", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    # ... and refuses a timeout above the interval (the check has teeth).
    bad = _scrape_config(ctl) | {"scrape_timeout": "60s"}
    config.write_text(yaml.safe_dump({"scrape_configs": [bad]}))
    assert _promtool("check", "config", "--syntax-only", str(config)).returncode != 0


def _alerts(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    [rule] = by_kind(objs, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}


BASE = "https://git.example/taugrid-evidence/blob/v0.1.0/docs/runbooks.md"


def test_prometheus_rule_overrides(tmp_path: Path) -> None:
    files = {r["alert"]: r for f in sorted((CHART / "rules").glob("*.rules.yaml"))
             for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r}
    default = _alerts(render(REQUIRED))
    assert set(default) == set(files)
    headings = {line[3:].strip().lower() for line in (ROOT / "docs" / "runbooks.md").read_text().splitlines()
                if line.startswith("## ")}
    for name, r in default.items():
        # no base URL by default: no link rather than one that resolves nowhere
        assert "runbook_url" not in r["annotations"] and files[name]["annotations"]["runbook_url"]
    for name, r in _alerts(render({**REQUIRED, "prometheusRule": {"runbookBaseUrl": BASE}})).items():
        url = r["annotations"]["runbook_url"]
        assert url == f"{BASE}#{name.lower()}", url
        assert url.rpartition("#")[2] in headings
    objs = render(CUSTOM)
    custom = _alerts(objs)
    assert "TaugridRunSlowedDown" not in custom and set(custom) == set(files) - {"TaugridRunSlowedDown"}
    blocked = custom["TaugridRunBlockedTooLong"]
    assert blocked["for"] == "15m" and blocked["labels"] == {"severity": "critical", "team": "ml"}
    for name, r in custom.items():
        # expressions untouched; every alert carries the global label, its own severity otherwise
        assert r["expr"] == files[name]["expr"]
        assert r["labels"]["team"] == "ml"
        if name != "TaugridRunBlockedTooLong":
            assert r["labels"]["severity"] == files[name]["labels"]["severity"]
            assert r.get("for") == files[name].get("for")
        assert r["annotations"]["runbook_url"] == f"https://wiki.example/taugrid/runbooks#{name.lower()}"
    # The recording rules stay whatever is disabled, and an alert's own labels beat the global ones.
    [rule] = by_kind(objs, "PrometheusRule")
    assert any("record" in r for g in rule["spec"]["groups"] for r in g["rules"])
    own = _alerts(render({**REQUIRED, "prometheusRule": {
        "additionalAlertLabels": {"severity": "info", "team": "ml"},
        "alerts": {"TaugridGpuLost": {"labels": {"team": "hw", "pager": "gpu"}},
                   "TaugridGpuXidCritical": {"for": "2m", "severity": "warning"}}}}))
    assert own["TaugridRunStalled"]["labels"] == {"severity": "critical", "team": "ml"}
    assert own["TaugridGpuLost"]["labels"] == {"severity": "critical", "team": "hw", "pager": "gpu"}
    assert "for" not in files["TaugridGpuXidCritical"]  # a `for:` where the file has none
    assert own["TaugridGpuXidCritical"]["for"] == "2m"
    assert own["TaugridGpuXidCritical"]["labels"] == {"severity": "warning", "team": "ml"}
    # A group whose alerts are all disabled goes; promtool accepts what remains.
    gone = {a: True for a in files if a.startswith("TaugridAgent")}
    [rule] = by_kind(render({**REQUIRED, "prometheusRule": {"disabled": gone}}), "PrometheusRule")
    assert "taugrid-evidence-agent" not in {g["name"] for g in rule["spec"]["groups"]}
    out = tmp_path / "rendered.rules.yaml"
    out.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = _promtool("check", "rules", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    # A misspelt name fails the render instead of changing nothing; agent alerts may be named
    # with the agent off (values shared across clusters).
    for key in ("disabled", "alerts"):
        with pytest.raises(helm.HelmError, match='no alert named "TaugridRunStaled"'):
            render({**REQUIRED, "prometheusRule": {key: {"TaugridRunStaled": {} if key == "alerts" else True}}})
    assert "TaugridAgentDown" not in _alerts(render({**REQUIRED, "agent": {"enabled": False},
                                                     "prometheusRule": {"disabled": {"TaugridAgentDown": True}}}))


def test_grafana_dashboards_as_sidecar_config_maps() -> None:
    assert not [c for c in by_kind(render(REQUIRED), "ConfigMap") if "-dashboard-" in c["metadata"]["name"]]
    objs = render({**REQUIRED, "grafanaDashboards": {"enabled": True}})
    maps = {c["metadata"]["name"]: c for c in by_kind(objs, "ConfigMap") if "-dashboard-" in c["metadata"]["name"]}
    sources = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert {name.rpartition("-dashboard-")[2] + ".json" for name in maps} == set(sources) - {"fleet-adx.json"}
    for cm in maps.values():
        assert cm["metadata"]["namespace"] == "observability"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "TauGrid"}
        [(key, text)] = cm["data"].items()
        assert json.loads(text) == json.loads(sources[key])  # the dashboard as built, byte for byte in JSON
        # under the 256 KiB of kubectl's last-applied annotation (client-side apply, GitOps tools)
        assert len(json.dumps(cm)) < 256 * 1024
        kubernetes_validate.validate(cm, KUBE, strict=True)
    # Another sidecar convention, another namespace, the ADX dashboard opted in.
    objs = render({**REQUIRED, "grafanaDashboards": {
        "enabled": True, "adx": True, "namespace": "monitoring", "label": "grafana-dashboard", "labelValue": "true",
        "folder": "GPU/TauGrid", "folderAnnotation": "k8s-sidecar-target-directory", "labels": {"team": "ml"}}})
    maps = {c["metadata"]["name"]: c for c in by_kind(objs, "ConfigMap") if "-dashboard-" in c["metadata"]["name"]}
    assert "taugrid-evidence-dashboard-fleet-adx" in maps and len(maps) == len(sources)
    for cm in maps.values():
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["labels"]["grafana-dashboard"] == "true" and cm["metadata"]["labels"]["team"] == "ml"
        assert cm["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "GPU/TauGrid"}
        kubernetes_validate.validate(cm, KUBE, strict=True)


def test_agent_priority_class_and_the_notes_on_its_node_selector() -> None:
    [ds] = by_kind(render(REQUIRED), "DaemonSet")
    assert ds["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    [ds] = by_kind(render({**REQUIRED, "agent": {"priorityClassName": "gpu-node-agents"}}), "DaemonSet")
    assert ds["spec"]["template"]["spec"]["priorityClassName"] == "gpu-node-agents"
    [ds] = by_kind(render({**REQUIRED, "agent": {"priorityClassName": ""}}), "DaemonSet")
    assert "priorityClassName" not in ds["spec"]["template"]["spec"]
    # Offline (`lookup` finds nothing), the notes say the match is unchecked and how to check it,
    # never that no node matches.
    text = notes(REQUIRED)
    assert "set prometheusRule.runbookBaseUrl" in text
    assert "runbookBaseUrl" not in notes({**REQUIRED, "prometheusRule": {"runbookBaseUrl": BASE}})
    assert "kubectl get nodes -l nvidia.com/gpu.present=true" in text and "unchecked" in text
    assert "WARNING" not in text
    text = notes({**REQUIRED, "agent": {"nodeSelector": {"nvidia.com/gpu.present": None, "pool": "a100"}}})
    assert "kubectl get nodes -l pool=a100" in text
    assert "Node agent" not in notes({**REQUIRED, "agent": {"enabled": False}})


PARENT_TEMPLATE = """\
{{- $nodes := .Values.nodes }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: probe
data:
  gpu: {{ include "te.matchingNodes" (dict "nodes" $nodes "selector" (dict "nvidia.com/gpu.present" "true")) | quote }}
  pool: {{ include "te.matchingNodes" (dict "nodes" $nodes "selector" (dict "pool" "a100" "zone" "1")) | quote }}
  none: {{ include "te.matchingNodes" (dict "nodes" (dict) "selector" (dict "pool" "a100")) | quote }}
"""


def test_as_a_subchart_with_global_values_and_the_node_match_the_notes_use(tmp_path: Path) -> None:
    """An umbrella chart holding this one, with `global` values (Helm passes them to every
    subchart, so the schema must accept them); its template calls the helper NOTES.txt applies to
    `lookup`'s NodeList, on a NodeList of its own."""
    parent = tmp_path / "umbrella"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "taugrid-evidence")
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    (parent / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "umbrella", "version": "1.0.0",
        "dependencies": [{"name": "taugrid-evidence", "version": version}]}))
    (parent / "templates" / "probe.yaml").write_text(PARENT_TEMPLATE)

    def node(**labels: str) -> dict[str, Any]:
        return {"metadata": {"name": "n", "labels": labels}}
    values = {"global": {"imageRegistry": "acr.example.io", "clusterDomain": "cluster.local"},
              "taugrid-evidence": REQUIRED,
              "nodes": {"items": [node(**{"nvidia.com/gpu.present": "true", "pool": "a100"}),
                                  node(**{"nvidia.com/gpu.present": "false", "pool": "a100", "zone": "1"}),
                                  node(pool="a100", zone="2"), {"metadata": {"name": "bare"}}]}}
    chart = helm.Chart.load(parent)
    chart.validate_schema(values)
    manifests = chart.render(values, name="umbrella", namespace="observability")
    objs = [d for path, text in manifests.items() if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]
    [probe] = [o for o in objs if o["metadata"]["name"] == "probe"]
    assert probe["data"] == {"gpu": "1", "pool": "1", "none": "0"}
    assert {"Deployment", "DaemonSet", "ServiceMonitor", "PrometheusRule"} <= {o["kind"] for o in objs}
    report = helm.lint(parent, values, strict=True, kube_version=f"v{KUBE}.0")
    assert [m for m in report["messages"] if m["severity"] >= 2] + report["errors"] == []


def test_agent_reads_resource_slices_only_when_asked() -> None:
    from collector.agent.command import agent as agent_command

    def daemonset(objs: list[dict[str, Any]]) -> dict[str, Any]:
        [ds] = by_kind(objs, "DaemonSet")
        return ds["spec"]["template"]["spec"]

    off = render(REQUIRED)
    spec = daemonset(off)
    assert spec["automountServiceAccountToken"] is False  # no API access by default
    assert not any(a.startswith(("--resource-slices", "--dra-driver")) for a in spec["containers"][0]["command"])
    assert not [r for r in by_kind(off, "ClusterRole") if "resourceslices" in json.dumps(r)]

    on = render({**REQUIRED, "agent": {"dra": {"drivers": ["gpu.example.com"], "resourceSlices": True}}})
    spec = daemonset(on)
    assert spec["automountServiceAccountToken"] is True
    flags = [a for a in spec["containers"][0]["command"] if a.startswith(("--resource-slices", "--dra-driver"))]
    assert flags == ["--dra-driver=gpu.example.com", "--resource-slices"]
    # the agent's own command line accepts them
    ctx = agent_command.make_context("agent", list(flags))
    assert ctx.params["resource_slices"] is True and ctx.params["dra_drivers"] == ("gpu.example.com",)
    [role] = [r for r in by_kind(on, "ClusterRole") if r["metadata"]["name"].endswith("-agent-resourceslices")]
    assert role["rules"] == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                              "verbs": ["get", "list"]}]
    [binding] = [b for b in by_kind(on, "ClusterRoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert [s["name"] for s in binding["subjects"]] == [spec["serviceAccountName"]]
    for obj in (role, binding):
        kubernetes_validate.validate(obj, KUBE, strict=True)
    with pytest.raises(helm.HelmError, match="agent/dra/drivers"):  # a driver name that is no DNS subdomain
        render({**REQUIRED, "agent": {"dra": {"drivers": ["GPU Driver"]}}})
