"""Controller side: dcgm-exporter scrapes (real ones), agent discovery through the API simulator, and
a real agent read over HTTP into GPU evidence, log scans and the run's GPU summary."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from collector.agent import Agent
from collector.gpu import GpuDevice, PodGpuEvidence, gpu_summary
from collector.sources.agents import (
    DEFAULT_SELECTOR,
    AgentEndpoint,
    AgentReader,
    AgentReadError,
    discover_agents,
    endpoints_from_pods,
    parse_evidence,
)
from collector.sources.dcgm import DcgmError, parse_dcgm, pod_evidence, read_dcgm, to_device
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.server import Simulator
from tests.agent.fake_nvml import FakeDevice, FakeNvml
from tests.agent.kubelet import PodResourcesServer
from tests.agent.test_agent import settings, wait
from tests.agent.test_logs import Node

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


def test_dcgm_t4_scrape(fixtures: Path) -> None:
    scrape = parse_dcgm((fixtures / "metrics" / "dcgm_datadog_fixture_metrics.txt").read_text())
    by = {(g.uuid, g.pod): g for g in scrape.gpus}
    t4 = by[("GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "")]
    assert t4.host == "424773df46e0" and t4.model == "Tesla T4" and t4.gpu == "0"
    assert t4.get("DCGM_FI_DEV_POWER_USAGE") == 8.969 and t4.get("DCGM_FI_DEV_SM_CLOCK") == 300
    d = to_device(t4)
    assert d.utilization == 0.0 and d.power_w == 8.969 and d.xids == () and d.index == 0
    a10 = by[("GPU-abc", "ray-1111111")]
    assert (a10.namespace, a10.container) == ("ray-llm", "ray-worker")
    # unlabelled series (the fixture's dummy lines) are named, not fatal
    assert any("without a GPU UUID" in p for p in scrape.problems)
    ev = pod_evidence(scrape, node="n1", read_at=NOW)
    assert [(e.namespace, e.pod, e.containers, e.source) for e in ev] == [
        ("ray-llm", "ray-1111111", ("ray-worker",), "dcgm")]


def test_dcgm_mig_lowercase_old_labels_and_empty_pods(fixtures: Path) -> None:
    scrape = parse_dcgm((fixtures / "metrics" / "dcgm_exporter_mig_pod_name_labels_a100_dcgm_exporter_272.txt")
                        .read_text())
    assert not scrape.problems
    mig, whole = sorted(scrape.gpus, key=lambda g: g.gpu)
    assert (mig.mig_profile, mig.mig_instance, mig.pod) == ("4g.40gb", "1", "")  # attribution off: empty
    assert (whole.pod, whole.namespace, whole.container) == ("d85np-t6mdg", "ai-1", "-grpc-pod")
    assert whole.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE") == 0.008246
    ev = pod_evidence(scrape, node="n1", read_at=NOW)
    assert [(e.namespace, e.pod) for e in ev] == [("ai-1", "d85np-t6mdg")]
    assert ev[0].devices[0].uuid == "GPU-931446e6-0413-2864-5b76-11227dcda4ae"


def test_dcgm_garbage_keeps_what_parsed(fixtures: Path) -> None:
    text = (fixtures / "metrics" / "dcgm_datadog_fixture_metrics.txt").read_text()
    cut = text.index("# HELP DCGM_FI_DEV_GPU_UTIL")
    scrape = parse_dcgm(text[:cut] + "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\" garbage here\n" + text[cut:])
    assert any("stops parsing" in p for p in scrape.problems)
    assert scrape.gpus and scrape.gpus[0].get("DCGM_FI_DEV_SM_CLOCK") == 300


def _serve(body: bytes, status: int = 200) -> tuple[ThreadingHTTPServer, str]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            return

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_read_dcgm_over_http(fixtures: Path) -> None:
    srv, url = _serve((fixtures / "metrics" / "dcgm_datadog_fixture_metrics.txt").read_bytes())
    try:
        assert read_dcgm(url + "/metrics").gpus
    finally:
        srv.shutdown()
        srv.server_close()
    srv, url = _serve(b"nope", 503)
    try:
        with pytest.raises(DcgmError, match="HTTP 503"):
            read_dcgm(url + "/metrics")
    finally:
        srv.shutdown()
        srv.server_close()


def _agent_pod(name: str, node: str, ip: str, phase: str = "Running") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "taugrid-system",
                         "labels": {"app.kubernetes.io/name": "taugrid-evidence",
                                    "app.kubernetes.io/component": "agent"}},
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "x"}]},
            "status": {"phase": phase, "podIP": ip}}


def test_discover_agents_by_label_through_the_api() -> None:
    with Simulator() as sim:
        sim.start()
        sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "taugrid-system"}})
        sim.apply(_agent_pod("agent-a", "gpu-1", "10.0.0.5"))
        sim.apply(_agent_pod("agent-b", "gpu-2", "fd00::7"))
        sim.apply(_agent_pod("agent-c", "gpu-3", "10.0.0.9", phase="Pending"))
        other = _agent_pod("controller", "cpu-1", "10.0.0.2")
        other["metadata"]["labels"]["app.kubernetes.io/component"] = "controller"
        sim.apply(other)
        api = KubeApi(api_client_for(sim.base_url))
        eps = discover_agents(api, "taugrid-system", selector=DEFAULT_SELECTOR)
    assert [(e.node, e.url) for e in eps] == [("gpu-1", "http://10.0.0.5:9402"), ("gpu-2", "http://[fd00::7]:9402")]
    assert endpoints_from_pods([{"status": {}}, {}]) == []


def test_agent_read_end_to_end_into_claims_inputs(tmp_path: Path) -> None:
    g = ["GPU-11111111-0000-0000-0000-000000000000", "GPU-22222222-0000-0000-0000-000000000000"]
    devs = [FakeDevice(uuid=g[0], util=100, power_mw=60_000), FakeDevice(uuid=g[1], pci="00000000:1C:00.0")]
    nv = FakeNvml(devs)
    node = Node(tmp_path / "pods")
    node.write(*node.steps(1, 4))
    node.write(node.line("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, "
                         "OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=8000) ran for 8097 milliseconds"))
    pods = [("research", "llm-worker-0", [("trainer", "nvidia.com/gpu", g)])]
    with PodResourcesServer(pods) as kubelet, Agent(settings(tmp_path, kubelet.socket), nv=nv) as agent:
        port = agent.serve("127.0.0.1", 0)
        wait(lambda: agent.ready and agent.attribution.up and agent.logs.followed == 1)
        nv.inject_xid(devs[1], 79)
        wait(lambda: bool(agent.xids.counts()))
        time.sleep(0.4)  # the hang hint's sustain window
        reader = AgentReader(lambda: NOW)
        ep = AgentEndpoint("gpu-node-1", "agent-x", f"http://127.0.0.1:{port}")
        rep = reader.read(ep)
        reports, errors = reader.read_all([ep, AgentEndpoint("gone", "agent-y", "http://127.0.0.1:1"), ep])
    assert len(reports) == 2 and len(errors) == 1 and "127.0.0.1:1" in errors[0]
    assert rep.nvml_state == "ok" and rep.podresources_up and rep.read_at == NOW
    (pe,) = rep.gpus
    assert (pe.namespace, pe.pod, pe.node, pe.containers) == ("research", "llm-worker-0", "gpu-node-1", ("trainer",))
    by = {d.uuid: d for d in pe.devices}
    assert by[g[0]].hang_hint and not by[g[1]].hang_hint and by[g[1]].xids == (79,)
    (lg,) = rep.logs
    assert [s.step for s in lg.scan.samples] == [1, 2, 3, 4] and lg.scan.format == "megatron"
    assert [h.kind for h in lg.scan.hangs] == ["nccl-watchdog-timeout"]
    assert rep.log_pods() == {("research", "llm-worker-0")}
    s = gpu_summary(rep.gpus, [("research", "llm-worker-0")], NOW + timedelta(seconds=10), timedelta(minutes=5))
    assert s.allocated == 2 and s.hang_hint == (g[0],) and s.lost == () and s.xids == (79,)
    stale = gpu_summary(rep.gpus, [("research", "llm-worker-0")], NOW + timedelta(minutes=6), timedelta(minutes=5))
    assert stale.pods == 0 and stale.allocated == 0, "too old to trust: no evidence, never an old answer"


def test_parse_evidence_rejects_other_versions_and_skips_bad_entries() -> None:
    ep = AgentEndpoint("n", "p", "http://x")
    with pytest.raises(AgentReadError, match="version"):
        parse_evidence({"version": 99}, ep, NOW)
    with pytest.raises(AgentReadError, match="not a JSON object"):
        parse_evidence([], ep, NOW)
    rep = parse_evidence({"version": 1, "nvml": {"state": "ok"}, "gpus": [{"uuid": 5}, "x"],
                          "allocations": [{"namespace": "a", "pod": "p", "container": "c", "device": "GPU-gone"}],
                          "logs": [{"pod": "p", "container": "c", "samples": [[1, "bad", "nan", False, None, 3],
                                                                               ["x"]]}]}, ep, NOW)
    assert len(rep.problems) == 2
    (pe,) = rep.gpus
    assert pe.devices == (GpuDevice(uuid="GPU-gone", lost=True),), "allocated but not on the bus: lost"
    (smp,) = rep.logs[0].scan.samples
    assert smp.step == 1 and smp.at is None and smp.loss != smp.loss  # NaN survives the trip


def test_parse_evidence_reads_xid_first_seen_as_ages_and_the_volatile_ecc_count() -> None:
    """Ages against the document's own `at` (the agent's clock may be off); hostile entries (not an ASCII
    code, a time after `at`, a count that is not one) are left out."""
    ep = AgentEndpoint("n", "p", "http://x")
    gpu = {"uuid": "GPU-1", "pods": [{"namespace": "a", "pod": "p", "container": "c"}],
           "xid_first_seen": {"79": 1000.0, "48": 1090.5, "²": 900.0, "95": 1200.0, "13": "soon", "-1": 10.0},
           "ecc_uncorrected": {"volatile": 3, "aggregate": 7}}
    rep = parse_evidence({"version": 1, "at": 1100.0, "gpus": [gpu]}, ep, NOW)
    (dev,) = rep.gpus[0].devices
    assert dev.xid_ages == ((48, 9.5), (79, 100.0)) and dev.ecc_uncorrected == 3
    for bad in ({"volatile": True}, {"volatile": -1}, {"volatile": 2.5}, [3], None):
        rep = parse_evidence({"version": 1, "at": 1100.0, "gpus": [{**gpu, "ecc_uncorrected": bad}]}, ep, NOW)
        assert rep.gpus[0].devices[0].ecc_uncorrected is None, bad
    no_at = parse_evidence({"version": 1, "gpus": [gpu]}, ep, NOW)
    assert no_at.gpus[0].devices[0].xid_ages == ()  # nothing to age them by


def test_what_the_controller_holds_between_documents_is_not_copied_per_document() -> None:
    """Held until the next document (the pods' GPU evidence) or for the history (every sample's
    total and format): decoding a document again reuses the names held, and a run of equal totals is
    one object. Off the wire (orjson), each would be a fresh copy per GPU, per sample, per pass."""
    import orjson

    ep = AgentEndpoint("n", "p", "http://x")

    def doc(total: int, loss: float) -> object:
        return orjson.loads(orjson.dumps({
            "version": 1, "node": "gpu-node-0017", "nvml": {"state": "ok"},
            "gpus": [{"uuid": f"GPU-5f2c1a9e-{i:04d}-4c0b-9d7e-a1b2c3d4e5f6", "index": i, "utilization": 0.9,
                      "pods": [{"namespace": "research-team", "pod": "llm-pretrain-worker-17",
                                "container": "trainer"}]} for i in range(2)],
            "logs": [{"namespace": "research-team", "pod": "llm-pretrain-worker-17", "container": "trainer",
                      "format": "megatron", "lines": 3,
                      "samples": [[1000 + i, None, loss, False, total, i + 1] for i in range(3)]}]}))
    a, b = parse_evidence(doc(500_000, 2.5), ep, NOW), parse_evidence(doc(500_000, 2.5), ep, NOW)
    (ga,), (gb,) = a.gpus, b.gpus
    assert ga == gb, "the same evidence"
    # canonical UUIDs are held as their 16 bytes in the pod's packed record (no string per GPU)
    assert ga._x is None and ga._p.count(bytes.fromhex("5f2c1a9e00004c0b9d7ea1b2c3d4e5f6")) == 1
    assert [d.uuid for d in ga.devices] == [f"GPU-5f2c1a9e-{i:04d}-4c0b-9d7e-a1b2c3d4e5f6" for i in range(2)]
    assert ga.namespace is gb.namespace and ga.pod is gb.pod and ga.node is gb.node
    assert ga.containers[0] is gb.containers[0]
    sa = a.logs[0].scan.samples
    assert [s.total for s in sa] == [500_000] * 3 and sa[0].total is sa[1].total is sa[2].total
    assert sa[0].format is b.logs[0].scan.samples[0].format
    # a total that changes is each run's own value
    c = parse_evidence(orjson.loads(orjson.dumps({"version": 1, "logs": [
        {"pod": "p", "container": "c", "samples": [[1, None, 1.0, False, t, i] for i, t in
                                                   enumerate([300_000, 300_000, 400_000, None, 400_000])]}]})), ep, NOW)
    assert [s.total for s in c.logs[0].scan.samples] == [300_000, 300_000, 400_000, None, 400_000]


def test_summary_takes_the_newest_record_per_pod() -> None:
    old = PodGpuEvidence("a", "p", "n", "dcgm", NOW - timedelta(seconds=30), (GpuDevice("G1", utilization=0.1),))
    new = PodGpuEvidence("a", "p", "n", "agent", NOW, (GpuDevice("G1", utilization=0.9, lost=True),))
    s = gpu_summary([old, new], [("a", "p")], NOW, timedelta(minutes=1))
    assert s.utilization == 0.9 and s.lost == ("G1",) and s.read_at == NOW
