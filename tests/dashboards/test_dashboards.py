"""The Grafana dashboards: built from dashboards/build.py, valid against a JSON schema generated from
npm `@grafana/schema` (Grafana 11.6), and every PromQL query answered with data by a real Prometheus
that scraped the live controller while the simulator played its default scenario (and one run with a
straggler, for the straggler panel)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from collector.agent import Agent, AgentSettings, HangSettings, LogSettings
from collector.controller import Controller
from collector.settings import Settings
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.run import start_simulation
from kubesim.scenario import default_scenario_path
from tests.agent.fake_nvml import FakeDevice, FakeNvml
from tests.agent.kubelet import PodResourcesServer
from tests.promserver import PromServer

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
RULES = sorted((ROOT / "charts" / "taugrid-evidence" / "rules").glob("*.rules.yaml"))
NPM_DIR = ROOT / ".cache" / "grafana-schema"
NPM_HINT = ("npm install --prefix .cache/grafana-schema --no-audit --no-fund "
            "@grafana/schema@11.6.0 ts-json-schema-generator@2.4.0   (.ci/run does this)")
# Families the node agent exports; no agent runs in this test yet, so these queries are not
# evaluated here (they are listed in the report of the chart issue).
AGENT_ONLY = re.compile(r"\btaugrid_gpu_\w+|\btaugrid_agent_\w+|taugrid-evidence-agent")
SPEED = 20.0


def load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboards_build", DASHBOARDS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    out = [(f"{dash['uid']}/{p['title']}/{t['refId']}", t["expr"])
           for p in dash["panels"] for t in p.get("targets", []) if "expr" in t]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
            assert m, f"{dash['uid']} variable {v['name']}: only label_values(selector, label) is used"
            out.append((f"{dash['uid']}/${v['name']}", f"count by ({m.group(2)}) ({m.group(1)})"))
    return out


def test_json_files_are_what_build_py_builds() -> None:
    build = load_build()
    assert set(dashboards()) == set(build.DASHBOARDS)
    assert build.main(["--check"]) == 0, "run: python dashboards/build.py"


def test_dashboards_cover_the_issue() -> None:
    titles = {d["uid"]: {p["title"] for p in d["panels"]} for d in dashboards().values()}
    assert {"taugrid-fleet", "taugrid-run", "taugrid-gpu", "taugrid-collector", "taugrid-fleet-adx"} == set(titles)
    assert {"Runs by claim and verdict", "Blocked runs by owner", "Fleet goodput"} <= titles["taugrid-fleet"]
    assert {"Claims: verdict", "Step rate", "GPU utilization per pod", "Claim changes"} <= titles["taugrid-run"]
    assert {"XIDs by node, GPU and code (1h)", "Throttle reasons active", "Lost GPUs"} <= titles["taugrid-gpu"]
    for d in dashboards().values():
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))


def test_adx_panels_run_the_checked_queries_verbatim() -> None:
    """Every ADX panel is one queries/*.kql file as written, and every file has a panel: tests/adx
    checks those files with Microsoft's KQL parser and runs each on duckdb-kql with asserted results."""
    files = {p.read_text(): p.name for p in sorted((ROOT / "queries").glob("*.kql"))}
    seen = []
    for d in dashboards().values():
        for p in d["panels"]:
            for t in p.get("targets", []):
                if t["datasource"]["type"] == "grafana-azure-data-explorer-datasource":
                    assert t["query"] in files, f"{d['uid']}/{p['title']}: not a queries/*.kql file"
                    assert t["queryType"] == "KQL" and t["database"] == "${database}"
                    seen.append(files[t["query"]])
                else:
                    assert "expr" in t, f"{d['uid']}/{p['title']}: a target that is neither PromQL nor KQL"
    assert sorted(seen) == sorted(files.values())


# --- schema from @grafana/schema ---------------------------------------------------------------

@pytest.fixture(scope="module")
def grafana_schema() -> Path:
    """The Dashboard type of @grafana/schema as JSON schema (ts-json-schema-generator), cached."""
    gen = NPM_DIR / "node_modules" / ".bin" / "ts-json-schema-generator"
    types = NPM_DIR / "node_modules" / "@grafana" / "schema" / "dist" / "esm" / "raw" / "dashboard" / "x" / \
        "dashboard_types.gen.d.ts"
    if not gen.exists() or not types.exists():
        pytest.fail(f"@grafana/schema toolchain missing: {NPM_HINT}", pytrace=False)
    version = json.loads((NPM_DIR / "node_modules" / "@grafana" / "schema" / "package.json").read_text())["version"]
    out = NPM_DIR / f"dashboard-{version}.schema.json"
    if not out.exists():
        result = subprocess.run([str(gen), "--path", str(types), "--type", "Dashboard", "--additional-properties",
                                 "-o", str(out)], capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, result.stderr[-2000:]
    return out


def check_jsonschema(schema: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run([str(exe), "--schemafile", str(schema), *map(str, files)],
                          capture_output=True, text=True, timeout=120)


def test_dashboards_validate_against_the_grafana_schema(grafana_schema: Path, tmp_path: Path) -> None:
    result = check_jsonschema(grafana_schema, *sorted(DASHBOARDS.glob("*.json")))
    assert result.returncode == 0, result.stdout + result.stderr
    # The schema has teeth: a panel without its grid height and a string schemaVersion are refused.
    broken = json.loads((DASHBOARDS / "fleet-overview.json").read_text())
    del broken["panels"][0]["gridPos"]["h"]
    broken["schemaVersion"] = "39"
    bad = tmp_path / "broken.json"
    bad.write_text(json.dumps(broken))
    result = check_jsonschema(grafana_schema, bad)
    assert result.returncode == 1
    assert "'h' is a required property" in result.stdout and "schemaVersion" in result.stdout


# --- every query against a real Prometheus -----------------------------------------------------

def _prometheus_config(target: str, agent: str) -> str:
    return json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in RULES],
        # `cluster` as a multi-cluster setup sets it (here a target label; Thanos/Mimir: external)
        "scrape_configs": [{"job_name": "taugrid-evidence-controller", "honor_labels": True,
                            "static_configs": [{"targets": [target], "labels": {"cluster": CLUSTER}}]},
                           # the chart's agent ServiceMonitor copies the pod's node name into `node`
                           {"job_name": "taugrid-evidence-agent", "honor_labels": True,
                            "static_configs": [{"targets": [agent], "labels": {"node": "aks-a100-0",
                                                                                 "cluster": CLUSTER}}]}],
    })


CLUSTER = "aks-prod-westeurope"
GPUS = [f"GPU-5d2c7a10-0000-0000-0000-00000000000{i}" for i in range(3)]


def with_a_straggler(out: Path) -> Path:
    """The default scenario and one more run that the straggler panel has something to show for: four
    workers on nodes and quota of their own (the default runs' quota stays as it is), one of them 40 %
    slower per step from its third minute."""
    doc = yaml.safe_load(default_scenario_path().read_text())
    cluster = doc["cluster"]
    cluster["namespaces"].append("team-s")
    cluster["nodes"].append({"name": "aks-a100s", "count": 4, "pool": "gpua100", "gpus": 8,
                             "gpuProduct": "NVIDIA-A100-SXM4-80GB", "cpu": "96", "memory": "1800Gi"})
    cluster["clusterQueues"].append({"name": "gpu-s", "flavor": "a100", "gpus": 32})
    cluster["localQueues"].append({"name": "s", "namespace": "team-s", "clusterQueue": "gpu-s"})
    cluster["profiles"].append({"name": "s-4x8", "localQueue": "s", "clusterQueue": "gpu-s", "flavors": ["a100"],
                                "workers": 4, "gpusPerWorker": 8})
    doc["runs"].append({
        "name": "slow-rank", "namespace": "team-s", "kind": "Job", "profile": "s-4x8", "queue": "s",
        "image": "nvcr.io/nvidia/pytorch:24.05-py3", "at": "3s",
        "timeline": [{"at": "2s", "admit": {}}, {"at": "4s", "schedule": {}}, {"at": "5s", "pull": {}},
                     {"at": "40s", "start": {}},
                     {"at": "45s", "train": {"every": "5s", "iterations": 250000, "pods": "workers",
                                             "checkpointEvery": 0, "rankJitter": 0.02, "jitter": 0.02,
                                             "straggler": 2, "slower": 0.4, "slowFrom": "120s"}}]})
    path = out / "default-with-a-straggler.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    """The default scenario at 20x, the controller scraped as the chart's ServiceMonitor would, with
    the chart's rules loaded."""
    session = start_simulation(with_a_straggler(tmp_path_factory.mktemp("scenario")), "127.0.0.1:0", SPEED)
    base = Settings()
    settings = replace(base, controller=replace(base.controller, leader_election=False, tick=timedelta(seconds=1),
                                                log_poll_interval=timedelta(seconds=0.5)))
    ctl = Controller(KubeApi(api_client_for(session.base_url)), settings, session.engine.clock.now)
    # A node agent on one of the scenario's GPU nodes: NVML scripted at the pynvml boundary (no GPU
    # here), a real gRPC pod-resources server attributing two GPUs to a pod of the llm-pretrain run.
    devs = [FakeDevice(uuid=GPUS[i], pci=f"00000000:{0x1b + i:02X}:00.0") for i in range(3)]
    devs[0].util, devs[0].power_mw = 100, 60_000  # busy and cold: the hang hint
    nv = FakeNvml(devs)
    agent_dir = tmp_path_factory.mktemp("agent")
    pods = [("research", "llm-pretrain-worker-0", [("trainer", "nvidia.com/gpu", [GPUS[0], GPUS[1]])])]
    try:
        port = ctl.serve("127.0.0.1", 0)
        ctl.open()
        target = f"127.0.0.1:{port}"
        with PodResourcesServer(pods) as kubelet, \
                Agent(AgentSettings(node="aks-a100-0", sample_interval_s=0.2, podresources_socket=kubelet.socket,
                                    podresources_interval_s=0.5, kmsg_path=agent_dir / "kmsg",
                                    state_dir=agent_dir / "state", hang=HangSettings(sustain_s=0.5),
                                    logs=LogSettings(root=agent_dir / "pods", poll_s=0.5)), nv=nv) as agent, \
                PromServer.start([target], tmp_path_factory.mktemp("prom")) as prom:
            agent_target = f"127.0.0.1:{agent.serve('127.0.0.1', 0)}"
            prom.config.write_text(_prometheus_config(target, agent_target))
            with urllib.request.urlopen(urllib.request.Request(f"{prom.url}/-/reload", method="POST"), timeout=10):
                pass
            nv.inject_xid(devs[2], 48)
            # the XID counter must rise while Prometheus scrapes it to show as an increase
            deadline = time.monotonic() + 30
            while not prom.query('taugrid_gpu_xid_errors_total{job="taugrid-evidence-agent"}'):
                assert time.monotonic() < deadline, "the agent was never scraped"
                time.sleep(0.5)
            nv.inject_xid(devs[2], 48)
            devs[1].lost = True
            yield prom
    finally:
        ctl.close()
        session.close()


def _substitutions(prom: PromServer) -> list[dict[str, str]]:
    runs = prom.query("taugrid_run_finished")
    pairs = sorted({(s["metric"]["namespace"], s["metric"]["run"]) for s in runs})
    return [{"$namespace": ns, "$run": run} for ns, run in pairs] or [{}]


def _expand(expr: str, subs: dict[str, str], cluster: str = CLUSTER) -> str:
    expr = expr.replace("$__rate_interval", "1m").replace('=~"$node"', '=~".*"')  # the variable's All
    expr = expr.replace("$cluster", cluster)
    for k, v in subs.items():
        expr = expr.replace(k, v)
    return expr


def _answers(prom: PromServer, expr: str, subs_list: list[dict[str, str]]) -> bool:
    """True when the query returns at least one sample (for some run, when it has $run)."""
    candidates = subs_list if "$run" in expr or "$namespace" in expr else [{}]
    return any(prom.query(_expand(expr, subs)) for subs in candidates)


def test_every_prometheus_query_returns_data(live: PromServer) -> None:
    prom = live
    checked = [q for d in dashboards().values() for q in queries(d)]
    agent = [w for w, e in checked if AGENT_ONLY.search(e)]
    assert len(checked) - len(agent) >= 35 and len(agent) >= 15  # controller and agent queries, all evaluated
    deadline = time.monotonic() + 90
    missing = checked
    while missing and time.monotonic() < deadline:
        subs = _substitutions(prom)
        # One bad query (a syntax or type error) raises at once with Prometheus's own message.
        missing = [(w, e) for w, e in missing if not _answers(prom, e, subs)]
        if missing:
            time.sleep(1.0)
    assert missing == [], "queries with no data after the scenario played:\n" + "\n".join(
        f"  {w}: {e}" for w, e in missing)


def test_chart_rules_evaluate_cleanly_on_live_data(live: PromServer) -> None:
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(f"{live.url}/api/v1/rules", timeout=10) as r:
            groups = json.load(r)["data"]["groups"]
        rules = [rule for g in groups for rule in g["rules"]]
        if rules and all(rule["health"] == "ok" for rule in rules) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(rules) == sum(Path(p).read_text().count("- alert:") + Path(p).read_text().count("- record:")
                             for p in RULES)
    assert [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    # The scenario's stalled and crash-looping (contradicted) runs reach the alert rules, as pending
    # alerts (`for:` is not met in a short test); Prometheus's ALERTS series remember each one.
    seen: set[str] = set()
    want = {"TaugridRunStalled", "TaugridRunContradicted"}
    deadline = time.monotonic() + 60
    while not want <= seen and time.monotonic() < deadline:
        seen |= {s["metric"]["alertname"] for s in live.query("max_over_time(ALERTS[10m])")}
        time.sleep(0.5)
    assert want <= seen, seen


def test_the_prometheus_binary_is_real() -> None:
    assert shutil.which("prometheus"), "apt-get install -y --no-install-recommends prometheus"


def test_every_query_filters_by_the_cluster_variable(live: PromServer) -> None:
    """Semantically, on the same Prometheus: with `$cluster` naming a cluster it does not hold, no
    query finds a series (`... or vector(0)` answers a bare 0); the cluster variable lists ours."""
    prom = live
    subs = _substitutions(prom)
    leaks = []
    for d in dashboards().values():
        for where, expr in queries(d):
            if where.endswith("/$cluster"):
                continue
            for s in (subs if "$run" in expr or "$namespace" in expr else [{}]):
                found = prom.query(_expand(expr, s, cluster="aks-other-cluster"))
                if [r for r in found if r["metric"] or float(r["value"][1]) != 0]:
                    leaks.append(f"{where}: {expr}")
                    break
    assert leaks == [], "queries that show another cluster's series:\n" + "\n".join(leaks)
    [cluster_var] = [e for d in dashboards().values() for w, e in queries(d) if w == "taugrid-fleet/$cluster"]
    assert {r["metric"]["cluster"] for r in prom.query(cluster_var)} == {CLUSTER}
