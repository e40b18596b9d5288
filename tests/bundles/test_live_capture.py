"""Automatic capture by the live controller against the API simulator (official client over HTTP)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collector.capture import EvidenceCapture
from collector.controller import Controller
from collector.settings import BundleSettings, ControllerSettings, Settings
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.bundles.storage import LocalStore
from exporters.bundles.writer import verify
from exporters.otel import STAGES, RunTracer
from kubesim.clock import ManualClock
from kubesim.server import Simulator, SimulatorSettings
from tests.bundles.scenario import LATE_RANK, NOW, NS, RUN, SECRETS, leaks, objects, train_log, write_artifacts
from tests.controller.test_controller import ensure_namespaces, server_side, wait_until
from tests.dumpkit import ts


@pytest.fixture
def sim() -> Iterator[Simulator]:
    s = Simulator(settings=SimulatorSettings(bookmark_interval_s=0.5), watch_window=50)
    s.start()
    try:
        yield s
    finally:
        s.close()


def settings(tmp: Path, **bundles: Any) -> Settings:
    # Logs are not polled: progress stays unknown, so the incidents are exactly the ones the test makes.
    # The capture reads the logs itself.
    ctl = replace(ControllerSettings(), tick=timedelta(seconds=0.2), leader_election=False,
                  log_poll_interval=timedelta(0), ray_poll_interval=timedelta(0),
                  checkpoint_poll_interval=timedelta(0), watch_timeout_s=5)
    b = replace(BundleSettings(directory=str(tmp / "bundles"), tarball=False,
                               min_interval_per_run=timedelta(0)), **bundles)
    return Settings(controller=ctl, bundles=b)


def manifests(store: Path) -> list[dict[str, Any]]:
    """Oldest first: names are <ns>.<run>.<time>[-n] (the test's clock stands still)."""
    dirs = [d for d in store.iterdir() if (d / "manifest.json").is_file()]
    dirs.sort(key=lambda d: (d.name.split(".")[-1].partition("-")[0], int(d.name.partition("Z-")[2] or 1)))
    return [json.loads((d / "manifest.json").read_text()) for d in dirs]


def crash(pod: dict[str, Any]) -> dict[str, Any]:
    pod = json.loads(json.dumps(pod))
    pod["status"]["containerStatuses"] = [{
        "name": "main", "ready": False, "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "finishedAt": ts(NOW - timedelta(minutes=1))}}}]
    for c in pod["status"]["conditions"]:
        if c["type"] == "Ready":
            c["status"] = "False"
    return pod


def test_controller_captures_on_contradiction_deletion_and_cordon(sim: Simulator, tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    ensure_namespaces(sim, NS)
    objs = objects(workers=2)
    pods = [o for o in objs if o["kind"] == "Pod"]
    pods[1]["metadata"]["finalizers"] = ["example.com/keep-logs"]  # graceful: deleting before gone
    for o in objs:
        sim.apply(server_side(o))
    for i in range(2):
        sim.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-node-{i}"},
                   "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                          "capacity": {"nvidia.com/gpu": "8"}}})
        for line in train_log(i, steps=5).splitlines():
            at_text, _, rest = line.partition(" ")
            sim.store.append_log(NS, f"{RUN}-w{i}", "main", [rest], NOW - timedelta(minutes=40))
    # Where the run's profile says it leaves dumps: its NCCL flight-recorder dumps are there.
    write_artifacts(tmp_path / "runs" / NS / RUN)
    s = settings(tmp_path, max_per_hour=3,
                 artifacts_by_profile={"a100-2x8": str(tmp_path / "runs" / "{namespace}" / "{run}")})
    store = tmp_path / "bundles"
    spans = InMemorySpanExporter()
    cap = EvidenceCapture(s.bundles, None, clock.now, store=LocalStore(store), tracer=RunTracer(spans, batch=False))
    c = Controller(KubeApi(api_client_for(sim.base_url)), s, clock.now, capture=cap)
    cap.api = c.api
    c.open()
    try:
        wait_until(c.ready.is_set, what="controller ready")
        wait_until(lambda: any(r.ref.name == RUN and r.running.observed.value == "true" for r in c.claims.values()),
                   what="run running")
        assert len(cap.history) >= 3  # raw objects recorded as the controller saw them
        # 1. A worker crash-loops: running turns contradicted → one bundle, once.
        sim.apply(server_side(crash(pods[0])))
        wait_until(lambda: len(cap.written) == 1, what="bundle on contradiction")
        sim.apply(server_side({**crash(pods[0]), "metadata": {**pods[0]["metadata"],
                                                              "annotations": {"touched": "1"}}}))
        clock.advance(5)
        wait_until(lambda: cap.runs and c.evaluations > 5)
        # 2. The other worker is being deleted (graceful): capture while its logs still exist.
        sim.store.delete(sim.resource("v1", "Pod"), NS, f"{RUN}-w1")
        wait_until(lambda: len(cap.written) == 2, what="bundle on deletion")
        # 3. The first worker's node is cordoned.
        sim.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-0"},
                   "spec": {"unschedulable": True}, "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                                               "capacity": {"nvidia.com/gpu": "8"}}})
        wait_until(lambda: len(cap.written) == 3, what="bundle on cordon")
        # 4. A fourth incident within the hour passes max_per_hour=3: rate-limited, counted.
        sim.store.delete(sim.resource("v1", "Pod"), NS, f"{RUN}-w0")
        wait_until(lambda: cap.skipped >= 1, what="rate limit")
        assert len(cap.written) == 3
    finally:
        c.close()

    ms = manifests(store)
    assert len(ms) == 3
    # The run's lifecycle trace, fed by the same hook: stage spans under the trace the manifests name.
    finished = spans.get_finished_spans()
    assert finished and {sp.name for sp in finished} <= set(STAGES)
    assert "running" in {sp.name for sp in finished}  # progress unknown without polled logs: running
    assert {f"{sp.context.trace_id:032x}" for sp in finished} == {m["trace_id"] for m in ms}
    assert ms[0]["trigger"].startswith("running contradicted")
    assert f"pods being deleted: {RUN}-w1" in ms[1]["trigger"]
    assert ms[2]["trigger"] == "node cordoned: gpu-node-0"
    for m in ms:
        b = store / m["bundle"]
        assert verify(b) == [] and leaks(b) == [], m["bundle"]
        assert m["source"] == "live" and m["run"]["name"] == RUN
    first = store / ms[0]["bundle"]
    hist = json.loads((first / f"objects/Pod/{NS}/{RUN}-w0.json").read_text())
    states = [v["object"]["status"]["containerStatuses"][0].get("state") for v in hist["versions"]]
    assert {"running"} <= {k for s in states for k in s} and {"waiting"} <= {k for s in states for k in s}
    assert hist["versions"][0]["object"]["spec"]["containers"][0]["env"][0]["value"] == "[REDACTED]"
    assert (first / f"logs/{RUN}-w1/main.log").read_text().count("consumed samples") == 5
    assert ms[0]["claims"]["claims"]["running"]["verdict"] == "contradicted"
    assert ms[0]["hang_analysis"]["suspects"] == [{"rank": LATE_RANK, "pod": f"{RUN}-w1", "node": "gpu-node-1",
                                                   "placement": "dump found with this pod"}]
    why = {x["what"]: x["why"] for x in ms[0]["missing"]}
    assert "GPU series and XIDs from NVML" in why
    # Logs of the crashed container: previous requested (restartCount 3); the simulator has none kept.
    assert f"log {RUN}-w0/main (previous)" in why or (first / f"logs/{RUN}-w0/main.previous.log").exists()
    # The timeline lanes carry the transition the controller saw.
    tl = json.loads((first / "timeline.json").read_text())
    running = next(lane for lane in tl["lanes"] if lane["claim"] == "running")
    assert [s["observed"] for s in running["segments"]][-2:] == ["true", "false"]
    second = store / ms[1]["bundle"]
    assert (second / f"logs/{RUN}-w1/main.log").is_file()  # deleting, not gone: logs still there
    assert all(v not in (second / f"logs/{RUN}-w1/main.log").read_text() for v in SECRETS.values())


def test_bundle_on_demand_from_the_live_cluster(sim: Simulator, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from collector.cli import main
    from kubesim.kubeconfig import write_kubeconfig

    ensure_namespaces(sim, NS)
    for o in objects(workers=1):
        sim.apply(server_side(o))
    for line in train_log(0, steps=3).splitlines():
        sim.store.append_log(NS, f"{RUN}-w0", "main", [line.partition(" ")[2]], NOW - timedelta(minutes=30))
    kc = write_kubeconfig(tmp_path / "kubeconfig", sim.base_url)
    res = CliRunner().invoke(main, ["bundle", f"{NS}/{RUN}", "--kubeconfig", str(kc), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    b = Path(res.stdout.strip())
    assert b.parent == tmp_path / "o" and verify(b) == [] and leaks(b) == []
    m = json.loads((b / "manifest.json").read_text())
    assert m["trigger"] == "on demand" and m["source"] == "live"
    assert (b / f"objects/TauRun/{NS}/{RUN}.json").is_file()
    assert (b / f"logs/{RUN}-w0/main.log").read_text().count("consumed samples") == 3
    missing = CliRunner().invoke(main, ["bundle", "nope", "--kubeconfig", str(kc), "--out", str(tmp_path / "o")])
    assert missing.exit_code == 1 and "no run matches nope" in missing.output


def test_controller_config_turns_capture_and_traces_on(tmp_path: Path) -> None:
    from collector.config import ConfigError, load_settings

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"bundles:\n  directory: {tmp_path / 'b'}\n  max_age: 7d\n  min_interval_per_run: 90s\n"
                   "  artifacts_by_profile:\n    a100-2x8: '/mnt/{namespace}/{run}'\n")
    s = load_settings(cfg)
    assert s.bundles.max_age == timedelta(days=7) and s.bundles.min_interval_per_run == timedelta(seconds=90)
    assert s.bundles.artifacts_by_profile == {"a100-2x8": "/mnt/{namespace}/{run}"}
    api = KubeApi(api_client_for("http://127.0.0.1:9"))
    c = Controller(api, s, lambda: NOW)
    assert c.capture is not None and c.capture.auto and isinstance(c.capture.store, LocalStore)
    assert Controller(api, Settings(), lambda: NOW).capture is None  # nothing configured: no hook at all
    traces_only = replace(Settings(), bundles=BundleSettings(otlp_endpoint="http://127.0.0.1:9/v1/traces"))
    t = Controller(api, traces_only, lambda: NOW).capture
    assert t is not None and not t.auto and t.tracer is not None
    t.tracer.close()
    cfg.write_text("bundles:\n  max_per_hour: lots\n")
    with pytest.raises(ConfigError, match="bundles.max_per_hour: expected a number"):
        load_settings(cfg)


def test_pod_deleted_outright_is_captured_from_history(sim: Simulator, tmp_path: Path) -> None:
    """No finalizer, no grace: the pod is gone before capture; its history and the reason stay."""
    clock = ManualClock(NOW)
    ensure_namespaces(sim, NS)
    for o in objects(workers=2):
        sim.apply(server_side(o))
    for i in range(2):  # the pods' nodes, Ready (a pod on a node nobody sees is not known to run)
        sim.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-node-{i}"},
                   "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                          "capacity": {"nvidia.com/gpu": "8"}}})
    s = settings(tmp_path)
    cap = EvidenceCapture(s.bundles, None, clock.now, store=LocalStore(tmp_path / "bundles"))
    c = Controller(KubeApi(api_client_for(sim.base_url)), s, clock.now, capture=cap)
    cap.api = c.api
    c.open()
    try:
        wait_until(lambda: any(r.ref.name == RUN and r.running.observed.value == "true" for r in c.claims.values()),
                   what="run running")
        sim.store.delete(sim.resource("v1", "Pod"), NS, f"{RUN}-w1")
        wait_until(lambda: len(cap.written) == 1, what="bundle on deletion")
    finally:
        c.close()
    b = Path(cap.written[0])
    m = json.loads((b / "manifest.json").read_text())
    assert f"pods deleted: {RUN}-w1" in m["trigger"]
    hist = json.loads((b / f"objects/Pod/{NS}/{RUN}-w1.json").read_text())
    assert [v["op"] for v in hist["versions"]][-1] == "delete"
    why = {x["what"]: x["why"] for x in m["missing"]}
    assert why[f"log {RUN}-w1/*"] == "pod deleted before capture; its logs went with it"
    assert verify(b) == [] and leaks(b) == []
