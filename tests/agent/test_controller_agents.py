"""The live controller with a node agent: discovered through the API simulator by label, read over
HTTP; its log evidence drives progressing and its GPU allocation joins scheduled."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from collector import controller as controller_module
from collector.agent import Agent
from collector.backlog import Backlog
from collector.controller import Controller
from collector.gpu import GpuDevice, PodGpuEvidence
from collector.model import Ref
from collector.planes.node_agents import gpu_records, same_devices
from collector.settings import AgentSourceSettings, ControllerSettings, Settings
from collector.sources import agents
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.adx import AdxExporter, ExportSettings
from exporters.adx.embedded import DuckDBTarget
from exporters.adx.exporter import EvidenceSink
from kubesim.server import Simulator
from tests.agent.fake_nvml import FakeDevice, FakeNvml
from tests.agent.kubelet import PodResourcesServer
from tests.agent.test_agent import settings as agent_settings
from tests.agent.test_logs import megatron
from tests.controller.test_controller import FAST, T0, Clock, apply_run, ensure_namespaces, server_side, wait_until

UUIDS = [f"GPU-c0ffee00-0000-0000-0000-00000000000{i}" for i in range(8)]


def _agent_pod(port_node: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "taugrid-agent-x", "namespace": "default",
                         "labels": {"app.kubernetes.io/name": "taugrid-evidence",
                                    "app.kubernetes.io/component": "agent"}},
            "spec": {"nodeName": port_node, "containers": [{"name": "agent", "image": "taugrid-evidence"}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1"}}


@contextmanager
def _run_with_agent(tmp_path: Path, tick: timedelta = timedelta(seconds=0.2), *,
                    log_poll: timedelta = timedelta(0), agent_poll: timedelta = timedelta(seconds=0.3),
                    api_reads: list[str] | None = None, sink: EvidenceSink | None = None) -> Iterator[_Live]:
    """A run `llm` whose pod's log (steps 1-30, every 10 s up to T0) and 8 GPUs a node agent reads,
    and a live controller polling that agent every 0.3 s."""
    # the run's container log, written on the node as the kubelet does
    d = tmp_path / "pods" / "research_llm-w0_0b5e8c1a-0000-4000-8000-000000000001" / "main"
    d.mkdir(parents=True)
    lines = []
    for step in range(1, 31):
        at = T0 - timedelta(seconds=10 * (30 - step) + 5)
        lines.append(f"{at.strftime('%Y-%m-%dT%H:%M:%S.000000000Z')} stdout F {megatron(step)}\n")
    (d / "0.log").write_text("".join(lines))
    devs = [FakeDevice(uuid=u, pci=f"00000000:{0x10 + i:02X}:00.0", util=97, power_mw=550_000)
            for i, u in enumerate(UUIDS)]
    nv = FakeNvml(devs)
    pods = [("research", "llm-w0", [("main", "nvidia.com/gpu", UUIDS)])]
    clock = Clock(T0)
    with PodResourcesServer(pods) as kubelet, \
            Agent(replace(agent_settings(tmp_path, kubelet.socket), node="gpu-0"), nv=nv) as agent, \
            Simulator(settings=FAST, watch_window=50) as sim:
        port = agent.serve("127.0.0.1", 0)

        def agent_has_the_log() -> bool:  # as a running DaemonSet's agent has when a controller starts
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/evidence", timeout=5) as r:
                return any(x.get("pod") == "llm-w0" for x in json.loads(r.read()).get("logs") or [])
        wait_until(agent_has_the_log, timeout=10, what="the agent reading the pod's log")
        sim.start()
        apply_run(sim, "llm")
        ensure_namespaces(sim, "default")
        sim.apply(server_side(_agent_pod("gpu-0")))
        cfg = replace(ControllerSettings(), tick=tick, leader_election=False,
                      log_poll_interval=log_poll, ray_poll_interval=timedelta(0), watch_timeout_s=5,
                      agents=AgentSourceSettings(poll_interval=agent_poll, namespace="default", port=port))
        api = KubeApi(api_client_for(sim.base_url))
        if api_reads is not None:  # the log GETs the controller sends the API server
            get_text = api.get_text

            def recorded(path: str, query: Any = ()) -> bytes:
                if path.endswith("/log"):
                    api_reads.append(path)
                out: bytes = get_text(path, query)
                return out
            api.get_text = recorded  # type: ignore[method-assign]
        c = Controller(api, Settings(controller=cfg), clock.now, sink=sink)
        c.open()
        try:
            wait_until(c.ready.is_set, what="controller ready")
            yield _Live(c, devs, clock, d, nv, sim)
        finally:
            c.close()


@dataclass
class _Live:
    c: Controller
    devs: list[FakeDevice]
    clock: Clock
    log_dir: Path
    nv: FakeNvml
    sim: Simulator

    def claims(self) -> dict[str, tuple[str, str]]:
        rc = next((r for r in self.c.claims.values() if r.ref.name == "llm"), None)
        return {k: (v.observed.value, v.reason) for k, v in rc.claims.items()} if rc else {}


def test_controller_takes_logs_and_gpus_from_the_node_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # log evidence waits for the loop within a backlog of 3 samples: the first document (30 samples)
    # passes alone, and every later one only once the loop has given that back
    monkeypatch.setattr(controller_module, "LOG_BACKLOG", 3)
    taken: list[int] = []
    take = Backlog.take
    monkeypatch.setattr(Backlog, "take", lambda self, weight, stop: taken.append(weight) or take(self, weight, stop))
    with _run_with_agent(tmp_path) as live:
        c, claims, d, clock = live.c, live.claims, live.log_dir, live.clock
        wait_until(lambda: claims().get("progressing", ("",))[0] == "true", timeout=20,
                   what="progressing from the agent's log evidence")
        assert "step 30" in claims()["progressing"][1]
        wait_until(lambda: "8/8 GPUs allocated" in claims().get("scheduled", ("", ""))[1], timeout=10,
                   what="allocation from pod-resources")
        assert c.agent_log_pods == frozenset({("research", "llm-w0")})
        # later reads ask for what came after the last document (increments), and the history
        # the controller keeps from them is the whole log's
        afters: list[int | None] = []
        parse = agents.parse_evidence

        def recorded(doc: Any, endpoint: Any, read_at: Any) -> Any:
            afters.extend(x.get("after") for x in doc.get("logs") or [] if x.get("container") == "main")
            return parse(doc, endpoint, read_at)
        monkeypatch.setattr(agents, "parse_evidence", recorded)
        more = []
        for step in range(31, 41):
            at = T0 + timedelta(seconds=10 * (step - 30) - 5)
            more.append(f"{at.strftime('%Y-%m-%dT%H:%M:%S.000000000Z')} stdout F {megatron(step)}\n")
        with open(d / "0.log", "a") as f:
            f.write("".join(more))
        clock.advance(100)

        def step_40() -> bool:
            # A backlog of 3 samples is always behind: the increment may be coalesced, judged at most
            # OVERLOAD_COALESCE (30 s) after the run's last evaluation (collector/changes.py): time passes.
            clock.advance(1)
            return "step 40" in claims().get("progressing", ("", ""))[1]
        wait_until(step_40, timeout=20, what="step 40 from an increment")
        assert afters and all(a is not None and a >= 30 for a in afters), afters
        sig = next(s for s in c.index.evidence(next(r.ref for r in c.claims.values() if r.ref.name == "llm"))
                   .signals if s.source == "main")
        assert [x.step for x in sig.scan.samples] == list(range(1, 41))
        assert taken[0] >= 30 and len(taken) >= 2, taken
        wait_until(lambda: c._log_backlog.held == 0, timeout=5, what="the backlog given back")


def test_the_api_log_poller_leaves_the_agents_pods_from_its_first_pass(tmp_path: Path) -> None:
    """With API log polling on (every 0.2 s) and an agent polled every 2 s, the controller reads the
    agent first (at once) and the API poller waits for that: the pod's log is never read through
    the API server, not even in the first pass (it used to be, 48,680 GETs at fleet size)."""
    reads: list[str] = []
    with _run_with_agent(tmp_path, log_poll=timedelta(seconds=0.2), agent_poll=timedelta(seconds=2),
                         api_reads=reads) as live:
        wait_until(lambda: live.claims().get("progressing", ("",))[0] == "true", timeout=20,
                   what="progressing from the agent's log evidence")
        passes = live.c.health._poll_pass.labels("logs")._value.get()  # a pass has run (its length)
        time.sleep(1.0)  # five more API log passes
        assert live.c.agent_log_pods == frozenset({("research", "llm-w0")})
        assert reads == [], reads
        assert passes is not None


def test_a_pod_an_agent_reads_is_no_api_log_target_until_no_agent_reads_it(tmp_path: Path) -> None:
    """The API log source holds no target for a container a node agent reads (only counts it: at 50k
    pods with agents everywhere, their targets, keys and rotation state were ≈ 27 MiB); once no agent
    reads the pod (its agent gone), its run is marked and the API server's log is read."""
    reads: list[str] = []
    with _run_with_agent(tmp_path, log_poll=timedelta(seconds=0.2), agent_poll=timedelta(seconds=0.5),
                         api_reads=reads, tick=timedelta(seconds=600)) as live:  # (no full pass: the mark's)
        wait_until(lambda: live.claims().get("progressing", ("",))[0] == "true", timeout=20,
                   what="progressing from the agent's log evidence")
        src = live.c.sources.get("logs")
        assert src is not None
        wait_until(lambda: not src.targets.current and src.left_to_agents == 1, what="no target, one left to the agent")
        wait_until(lambda: src.metrics is not None and live.c.registry.get_sample_value(
            "taugrid_collector_log_skipped_per_pass", {"reason": "agent"}) == 1.0, what="counted as the agent's")
        assert reads == []
        live.sim.store.delete(live.sim.resource("v1", "Pod"), "default", "taugrid-agent-x")
        wait_until(lambda: live.c.agent_log_pods == frozenset(), what="no agent reads the pod")
        wait_until(lambda: bool(reads), what="the pod's log read through the API server")
        assert all(r.endswith("/pods/llm-w0/log") for r in reads) and src.left_to_agents == 0


def test_gpu_readings_alone_do_not_reevaluate_a_progressing_run(tmp_path: Path) -> None:
    """Every agent read replaces every pod's GPU evidence: a run whose readings moved (utilization,
    power) but whose devices did not is not re-evaluated for it while it progresses (at fleet size
    that was every GPU run every pass); a lost GPU is taken at once."""
    with _run_with_agent(tmp_path, tick=timedelta(hours=1)) as live:  # no full pass in the test's time
        c = live.c
        wait_until(lambda: "8/8 GPUs allocated" in live.claims().get("scheduled", ("", ""))[1]
                   and live.claims().get("progressing", ("",))[0] == "true", timeout=20, what="claims with GPUs")
        key = next(k for k, r in c.claims.items() if r.ref.name == "llm")
        reads = c.evaluations
        time.sleep(1.0)  # three agent reads, nothing new: increments add nothing, readings the same
        settled = c.claims[key]
        time.sleep(1.2)
        assert c.claims[key] is settled, "re-evaluated with nothing new"
        (sig,) = [s for s in c.index.evidence(settled.ref).signals if s.source == "main"]
        assert [x.step for x in sig.scan.samples] == list(range(1, 31)), "increments that add nothing keep it"
        for dev in live.devs:
            dev.util, dev.power_mw = 41, 301_000  # readings only
        time.sleep(1.2)
        assert c.claims[key] is settled, "re-evaluated for readings alone"
        assert all(d.utilization == 0.41 for g in c._gpus.values() for d in g.devices), "the readings were taken"
        live.devs[3].lost = True
        wait_until(lambda: "GPU(s) lost" in live.claims()["running"][1], timeout=5, what="a lost GPU, at once")
        assert c.evaluations > reads


def test_same_devices_tells_readings_from_what_claims_say() -> None:
    dev = GpuDevice(uuid=UUIDS[0], index=0, utilization=0.97, sm_active=0.8, power_w=550.0, power_limit_w=700.0)
    ev = PodGpuEvidence("research", "llm-w0", "gpu-0", "agent", T0, (dev, replace(dev, uuid=UUIDS[1], index=1)),
                        ("main",))
    readings = replace(ev, read_at=T0 + timedelta(seconds=30),
                       devices=tuple(replace(d, utilization=0.4, sm_active=0.1, power_w=300.0) for d in ev.devices))
    assert same_devices(ev, readings)
    first, second = ev.devices
    for changed in (replace(ev, devices=(replace(first, lost=True), second)),
                    replace(ev, devices=(replace(first, hang_hint=True), second)),
                    replace(ev, devices=(replace(first, xids=(79,)), second)),
                    replace(ev, devices=(replace(first, uuid=UUIDS[2]), second)),
                    replace(ev, devices=(first,)), replace(ev, containers=("main", "sidecar")),
                    replace(ev, node="gpu-1"), replace(ev, source="dcgm")):
        assert not same_devices(ev, changed), changed


def test_gpu_records_take_each_device_once_and_each_xid_when_it_appears() -> None:
    at = T0
    dev = GpuDevice("GPU-a", 0, utilization=0.97, power_w=550.0)
    shared = GpuDevice("GPU-s", 1, utilization=0.5, shared=True)
    old = {("research", "p0"): PodGpuEvidence("research", "p0", "n1", "agent", at, (dev, shared))}
    new = {("research", "p0"): PodGpuEvidence("research", "p0", "n1", "agent", at,
                                              (replace(dev, xids=(79, 48)), shared)),
           ("research", "p1"): PodGpuEvidence("research", "p1", "n1", "agent", at, (shared,))}
    samples, xids = gpu_records(old, new, lambda ref: Ref("TauRun", "research", "run-" + ref.name))
    assert [(s.uuid, s.pod, s.run, s.utilization) for s in samples] == [
        ("GPU-a", "p0", "run-p0", 97.0), ("GPU-s", "p0", "run-p0", 50.0)]  # the shared GPU once
    assert [(x.code, x.uuid, x.gpu, x.run) for x in xids] == [(48, "GPU-a", 0, "run-p0"), (79, "GPU-a", 0, "run-p0")]
    assert gpu_records(new, new, lambda ref: None)[1] == []  # a code already reported is not recorded again
    # stamped when the agent first saw it, where the agent says
    aged = {("research", "p0"): PodGpuEvidence("research", "p0", "n1", "agent", at,
                                               (replace(dev, xids=(79,), xid_ages=((79, 90.0),)),))}
    assert [x.at for x in gpu_records(old, aged, lambda ref: None)[1]] == [at - timedelta(seconds=90)]


def test_the_agents_gpu_readings_and_xids_reach_the_adx_tables(tmp_path: Path) -> None:
    """The controller writes each agent pass's readings (GpuSamples) and newly reported XIDs (GpuXids)
    through the real exporter into the embedded store: the tables the lemon score, the drain advisor
    and gpu_xids.kql read."""
    store = tmp_path / "store.duckdb"
    exporter = AdxExporter(ExportSettings(cluster="c1", spool_dir=tmp_path / "spool"), DuckDBTarget(store))
    exporter.open()
    try:
        with _run_with_agent(tmp_path, sink=exporter) as live:
            wait_until(lambda: "8/8 GPUs allocated" in live.claims().get("scheduled", ("", ""))[1],
                       timeout=20, what="the run's GPUs from the agent")
            # A GpuSamples row is named by its GPU and reading time: with the clock standing still every
            # pass's rows share one RowId, and a pass before the pod's run was indexed wrote Run "".
            # The clock moves on, as it does in a cluster: the passes from here write rows of their own.
            live.clock.set(T0 + timedelta(seconds=1))
            live.nv.inject_xid(live.devs[2], 79)
            wait_until(lambda: any(79 in d.xids for g in live.c._gpus.values() for d in g.devices),
                       timeout=30, what="the XID in the agent's evidence")
            time.sleep(0.7)  # two more passes: the XID is recorded once
            # a row remap waiting for a GPU reset (NVML remapped rows) joins the node's drain risk at once
            live.devs[4].rows = (0, 1, 1, 0)

            def remap_signal() -> tuple[str, ...]:
                rc = next((r for r in live.c.claims.values() if r.ref.name == "llm"), None)
                w = rc.work_at_risk if rc is not None else None
                return tuple(sig for n in (w.nodes if w is not None else ()) for sig in n.signals)
            wait_until(lambda: "row-remap-pending" in remap_signal(), timeout=30, what="the remap in the node's risk")
            assert "xid-79" in remap_signal()
    finally:
        exporter.close(drain_timeout=60.0)  # a loaded machine ships the last segments late
    con = duckdb.connect(str(store), read_only=True)
    try:
        rows = con.execute('SELECT DISTINCT "GpuUuid" FROM "GpuSamples" WHERE "Run" = ?', ["llm"]).fetchall()
        uuids = {r[0] for r in rows}
        assert uuids == set(UUIDS)
        got = con.execute('SELECT "Code", "GpuUuid", "Run", "Meaning" FROM "GpuXids"').fetchall()
    finally:
        con.close()
    assert [(code, uuid, run) for code, uuid, run, _ in got] == [(79, UUIDS[2], "llm")]
    assert "unknown" not in got[0][3].lower()  # explained from NVIDIA's catalogue


def test_the_trainers_tokens_per_second_cross_the_agents_document() -> None:
    """Energy per token needs the tokens/s a trainer printed: the agent's document carries it and the
    controller's parser takes it back (bounded: a rate no device reaches is dropped)."""
    from datetime import UTC, datetime

    from collector.sources.agents import AgentEndpoint, parse_evidence

    doc = {"version": agents.EVIDENCE_VERSION, "node": "n1", "gpus": [], "logs": [
        {"namespace": "research", "pod": "p0", "container": "main", "read_at": 1.0, "lines": 3, "format": "torchtitan",
         "samples": [[5, "2026-12-03T12:00:00Z", 2.0, False, None, 1]], "tokens": [5862.0, "2026-12-03T12:00:00Z"]},
        {"namespace": "research", "pod": "p1", "container": "main", "read_at": 1.0, "lines": 3, "format": "torchtitan",
         "samples": [[5, "2026-12-03T12:00:00Z", 2.0, False, None, 1]], "tokens": [1e12, "2026-12-03T12:00:00Z"]},
    ]}
    rep = parse_evidence(doc, AgentEndpoint("n1", "agent-0", "http://agent"), datetime.now(UTC))
    by = {c.pod: c.scan.tokens for c in rep.logs}
    assert by["p0"] is not None and by["p0"].per_gpu == 5862.0 and by["p1"] is None


def test_a_nodes_containers_share_one_source_string() -> None:
    """What an agent read is held per container (a signal: the pod and container named there); the scan's
    `source` says which agent read it, one string a node rather than one a container (~100 B each, held
    for every container of the fleet)."""
    from datetime import UTC, datetime

    from collector.sources.agents import AgentEndpoint, parse_evidence

    def doc(node: str) -> dict[str, object]:
        return {"version": agents.EVIDENCE_VERSION, "node": node, "gpus": [], "logs": [
            {"namespace": "research", "pod": f"p{i}", "container": c, "lines": 3}
            for i in range(3) for c in ("main", "fluent-bit")]}
    one = parse_evidence(doc("n1"), AgentEndpoint("n1", "agent-0", "http://agent"), datetime.now(UTC))
    again = parse_evidence(json.loads(json.dumps(doc("n1"))), AgentEndpoint("n1", "agent-0", "http://agent"),
                           datetime.now(UTC))
    other = parse_evidence(doc("n2"), AgentEndpoint("n2", "agent-1", "http://agent"), datetime.now(UTC))
    sources = {id(c.scan.source) for rep in (one, again) for c in rep.logs}
    assert len(sources) == 1 and one.logs[0].scan.source == "agent:n1"
    assert {c.scan.source for c in other.logs} == {"agent:n2"}
    assert [(c.pod, c.container) for c in one.logs][:2] == [("p0", "main"), ("p0", "fluent-bit")]


def test_names_no_gpu_or_pod_can_have_are_refused_not_cut() -> None:
    """A peer that writes megabyte names (a compromised node, a hostile build) costs only its entries:
    a GPU whose UUID no device has is skipped and named as a problem, a pod or container name longer
    than Kubernetes allows names nothing, an over-long node name falls back to the endpoint's node.
    Cut names could merge two entries into one; refused ones cannot."""
    from datetime import UTC, datetime

    from collector.agent.evidence import as_columns
    from collector.sources.agent_gpus import MAX_NAME, MAX_UUID
    from collector.sources.agents import AgentEndpoint, parse_evidence

    long_uuid, long_name = "GPU-" + "a" * MAX_UUID, "p" * (MAX_NAME + 1)
    doc = {"version": 1, "node": "n" * 10_000, "gpus": [
        {"uuid": long_uuid, "index": 0, "pods": [{"namespace": "research", "pod": "p0", "container": "main"}]},
        {"uuid": "GPU-ok", "index": 1, "pods": [{"namespace": "research", "pod": long_name, "container": "main"},
                                                 {"namespace": "research", "pod": "p0", "container": "main"}]},
    ], "xids": [{"uuid": long_uuid, "code": 79}, {"uuid": "GPU-ok", "code": 48}],
        "allocations": [{"namespace": "research", "pod": "p0", "device": "d" * (MAX_UUID + 1)}],
        "logs": [
        {"namespace": "research", "pod": "p0", "container": "c" * (MAX_NAME + 1), "lines": 1,
         "samples": [[5, "2026-12-03T12:00:00Z", 2.0, False, None, 1]]},
        {"namespace": "research", "pod": "p0", "container": "main", "lines": 1,
         "samples": [[5, "2026-12-03T12:00:00Z", 2.0, False, None, 1]]},
    ]}
    for version in (doc, as_columns(doc)):  # (each GPU an object; the GPUs column by column)
        rep = parse_evidence(version, AgentEndpoint("n1", "agent-0", "http://agent"), datetime.now(UTC))
        assert [(e.pod, [d.uuid for d in e.devices], e.node) for e in rep.gpus] == [("p0", ["GPU-ok"], "n1")]
        assert rep.gpus[0].devices[0].xids == (48,)
        assert [(c.pod, c.container) for c in rep.logs] == [("p0", "main")]
        assert len(rep.problems) == 1 and f"over {MAX_UUID} characters" in rep.problems[0]
