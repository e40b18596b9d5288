"""The controller's node-agent poll at fleet size: one pass over every agent's /evidence.

Every `agents.poll_interval` (30 s) the controller's agent poller reads each node agent's
`/evidence` document (`collector.sources.agents.AgentReader.read_all`, 16 at a time) and parses it
into GPU and log evidence. At the fleet size of DESIGN.md that is 5,604 agents per pass. This
measures what one pass costs the controller's process:

  - agents:   one server process (pinned to the other CPU) answers for every agent: each agent has
              its own address in 127.0.0.0/8 (so the client opens a connection per agent, as it
              would to 5,604 pods), and its own document (node, pods and containers named after it),
              built by the agent's own `evidence_document` from a node of the fleet: 8 GPUs each held
              by one pod, ~9 containers, one of them a run's driver carrying 256 progress samples.
  - measured: `read_all` over all agents in this process (pinned to CPU 0): CPU seconds (process
              CPU time: the server is another process), wall seconds, and the share of a core it
              takes at the poll interval.
  - passes:   the first reads whole documents; the reader then holds each agent's cursor and the
              later passes read increments (`?epoch=&poll=`: the driver's last 10 samples and the one
              before them, as the agent renders them for a reader 30 s behind; docs/agent.md).
  - baseline: the same GETs (`fetch`), 16 at a time, bodies read and dropped (no JSON, no parse):
              the transport's part of the cost; and the same through urllib3's PoolManager (the
              reader's transport before). `--before-tree DIR`: each pass read again with the
              AgentReader of another source tree, which must give the same reports.
  - loop:     what the controller's loop then does with each container's log evidence: extend its
              history with the increment (`extend_history`) or take the whole, then compact it; an
              increment that adds nothing only moves the read time (`collector.planes.signals.adds_nothing`).
  - discover: the list the poller makes each pass of the agent pods (the DaemonSet), as JSON of the
              same size decoded and turned into endpoints (`endpoints_from_pods`).

Usage: .venv/bin/python bench/bench_agent_poll.py [--agents 5604] [--passes 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import urllib3

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from collector.agent.evidence import Snapshot, evidence_document  # noqa: E402
from collector.agent.logs import ContainerLog  # noqa: E402
from collector.agent.nvml import GpuReading, NvmlStatus  # noqa: E402
from collector.agent.podresources import Allocation  # noqa: E402
from collector.claims.progress import compacted  # noqa: E402
from collector.correlate import Signal  # noqa: E402
from collector.model import Ref  # noqa: E402
from collector.planes.signals import adds_nothing  # noqa: E402
from collector.progress.history import extend_history  # noqa: E402
from collector.progress.model import LogScan, ProgressSample  # noqa: E402
from collector.settings import ClaimSettings  # noqa: E402
from collector.sources.agents import (  # noqa: E402
    EVIDENCE_VERSION,
    AgentEndpoint,
    AgentReader,
    AgentReadError,
    endpoints_from_pods,
    fetch,
)

CLAIMS = ClaimSettings()
INCREMENT = 10  # driver samples a 30 s poll adds (a step every 3 s)
NODE_TOKEN = "NODE0000"  # replaced by each agent's own number, in every name it appears in


def node_document(samples: int = 256, *, increment: int | None = None, version: int = 1,
                  at: float | None = None) -> bytes:
    """A fleet node's /evidence as the agent renders it (names carry NODE_TOKEN). `increment`: the
    document for a reader whose cursor predates only the driver's last `increment` samples (what a
    30 s poll adds at a step every 3 s), as the agent renders it for `?epoch=&poll=`; `version`: as it
    renders it for `?version=` (2: the GPUs column by column; 3: with what the controller reads only;
    4: each pod's GPUs packed, what this tree's reader asks for)."""
    now = time.time() if at is None else at  # (one instant for every version of the node's document)
    t0 = datetime.fromtimestamp(now, UTC) - timedelta(hours=2)
    gpus, allocs, logs = [], [], []
    for i in range(8):
        uuid = f"GPU-{NODE_TOKEN}-{i:04d}-4d2a-9c1e-5b7f3a8e{i:04d}"
        gpus.append(GpuReading(index=i, uuid=uuid, name="NVIDIA H100 80GB HBM3", pci=f"0000:{0x18 + i:02x}:00.0",
                               at=now, utilization=0.97, sm_active=0.81, power_w=612.0, power_limit_w=700.0,
                               memory_used_bytes=71 << 30, memory_total_bytes=80 << 30))
        pod = f"llm-run-{NODE_TOKEN}-raycluster-worker-{i}"
        allocs.append(Allocation("team-0", pod, "ray-worker", "nvidia.com/gpu", uuid))
        logs.append(ContainerLog("team-0", pod, f"uid-{NODE_TOKEN}-{i}", "ray-worker",
                                 LogScan(source="", format=None, samples=(), hangs=(), xids=(), diagnostics=(),
                                         lines=500), now, None if increment is None else 500))
    progress = tuple(ProgressSample(step=10_000 + k, at=t0 + timedelta(seconds=3 * k), loss=2.1 - k * 1e-4,
                                    line=2 * k + 1, format="deepspeed") for k in range(samples))
    after = None if increment is None else progress[-increment - 1].line
    logs.append(ContainerLog("team-0", f"llm-run-{NODE_TOKEN}-raycluster-head-0", f"uid-{NODE_TOKEN}-h", "ray-head",
                             LogScan(source="", format="deepspeed", samples=progress, hangs=(), xids=(),
                                     diagnostics=(), lines=500), now, after))
    snap = Snapshot(node=f"gpu-{NODE_TOKEN}", at=now, nvml=NvmlStatus("ok", "", "550.54.15", 8), gpus=tuple(gpus),
                    hang_since={}, hang_sustain_s=300.0, allocations=tuple(allocs), podresources_up=True,
                    podresources_last_success=now, podresources_error="", xids=(), logs=tuple(logs),
                    log_epoch="bench", log_poll=1)
    return orjson.dumps(evidence_document(snap, version=version))


def address(i: int) -> str:
    """Agent i's pod IP: its own loopback address (Linux answers all of 127.0.0.0/8 locally)."""
    assert 0 <= i < 250 * 256
    return f"127.0.{i // 250}.{i % 250 + 1}"


def _serve(conn: Any, cpu: int | None, bodies: dict[tuple[bool, int], bytes]) -> None:
    """Answer each agent's address with its document: whole or the increment (a cursor asked), in the
    version asked (`?version=N`: 4 this tree's reader, 3 and 2 readers before it), else 1."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    by_ip: dict[tuple[str, bool, int], bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # as the agent's own server (collector.endpoints): a connection per read

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            ip = self.connection.getsockname()[0]
            inc = "epoch=" in self.path  # a reader with a cursor: the increment
            v = next((k for k in (4, 3, 2) if f"version={k}" in self.path), 1)
            doc = by_ip.get((ip, inc, v))
            if doc is None:
                doc = by_ip[(ip, inc, v)] = bodies[(inc, v)].replace(
                    NODE_TOKEN.encode(), ("n" + ip.replace(".", "-")).encode())
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(doc)))
            self.end_headers()
            self.wfile.write(doc)

    server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    server.daemon_threads = True
    server.request_queue_size = 256
    conn.send(server.server_address[1])
    import threading
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conn.recv()
    server.shutdown()


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def plain_get_all(urls: list[str], workers: int) -> int:
    """The baseline: the same GETs as `fetch` makes them, 16 at a time, bodies dropped."""
    from concurrent.futures import ThreadPoolExecutor

    def one(url: str) -> int:
        try:
            return len(fetch(url, connect_s=2.0, read_s=5.0, max_body=32 << 20))
        except AgentReadError as e:
            print(f"  baseline GET failed: {e}", file=sys.stderr)
            return 0

    with ThreadPoolExecutor(max_workers=workers) as ex:
        return sum(ex.map(one, urls))


def urllib3_get_all(urls: list[str], workers: int) -> int:
    """The transport before (urllib3's PoolManager, as `AgentReader` used it), bodies dropped."""
    from concurrent.futures import ThreadPoolExecutor
    pool = urllib3.PoolManager(num_pools=1024, maxsize=2)

    def one(url: str) -> int:
        r = pool.request("GET", url, retries=False, preload_content=False, redirect=False)
        n = len(r.read())
        r.release_conn()
        return n

    try:
        with ThreadPoolExecutor(max_workers=workers) as ex:
            return sum(ex.map(one, urls))
    finally:
        pool.clear()


def _loop(reports: list[Any], signals: dict[tuple[str, str, str], Signal], *, skip_empty: bool) -> float:
    """The controller loop's part (`Controller._apply`, "agent-log") for one pass: CPU seconds."""
    c0 = cpu_s()
    for r in reports:
        for c in r.logs:
            key = (c.namespace, c.pod, c.container)
            prev = signals.get(key)
            if skip_empty and prev is not None and c.after is not None and adds_nothing(prev.scan, c.scan, c.after):
                signals[key] = replace(prev, read_at=r.read_at)  # nothing new: only read now
                continue
            sig = Signal(Ref("Pod", c.namespace, c.pod), c.container, c.scan, r.read_at)
            if prev is not None and c.after is not None:
                sig = replace(sig, scan=extend_history(prev.scan, c.scan, c.after))
            signals[key] = compacted(sig, CLAIMS)
    return cpu_s() - c0


def _gist(r: Any) -> tuple[Any, ...]:
    """What a report says (its classes may come from another tree)."""
    return (r.endpoint.url, r.nvml_state, r.podresources_up, [replace(g, read_at=None) for g in r.gpus],
            r.problems, r.cursor, [(c.namespace, c.pod, c.container, c.scan, c.after) for c in r.logs])


def _reader_of(tree: str) -> Any:
    """The AgentReader of another source tree (its module loaded under another name; what it imports
    comes from this tree)."""
    import importlib.util
    path = Path(tree) / "collector" / "sources" / "agents.py"
    spec = importlib.util.spec_from_file_location("before_agents", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules["before_agents"] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module.AgentReader(lambda: datetime.now(UTC))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agents", type=int, default=5604)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--interval", type=float, default=30.0, help="the poll interval the share of a core is taken at")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--before-tree", default="", help="also read each pass with the AgentReader of this source tree "
                   "(`git archive <rev> | tar -x -C DIR`): the reader before a change, in the same run")
    a = p.parse_args()
    cpu = None if a.no_pin or (os.cpu_count() or 1) < 2 else 0
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    at = time.time()
    bodies = {(inc, v): node_document(increment=INCREMENT if inc else None, version=v, at=at)
              for inc in (False, True) for v in (1, 2, 3, 4)}
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, None if cpu is None else 1, bodies), daemon=True)
    proc.start()
    port = conn.recv()
    try:
        endpoints = [AgentEndpoint(f"gpu-{i:04d}", f"agent-{i:04d}", f"http://{address(i)}:{port}")
                     for i in range(a.agents)]
        assert len({e.url for e in endpoints}) == a.agents
        print(f"# agent poll benchmark  {datetime.now(UTC):%Y-%m-%d %H:%MZ}  python {sys.version.split()[0]}  "
              f"cpus {os.cpu_count()}  agents {a.agents}  /evidence {len(bodies[(False, EVIDENCE_VERSION)]):,} B each "
              f"(version {EVIDENCE_VERSION}; version 2: {len(bodies[(False, 2)]):,} B, version 1: "
              f"{len(bodies[(False, 1)]):,} B)")
        reader = AgentReader(lambda: datetime.now(UTC))
        old_reader = _reader_of(a.before_tree) if a.before_tree else None
        rows = []
        signals: dict[tuple[str, str, str], Signal] = {}
        signals_before: dict[tuple[str, str, str], Signal] = {}  # the loop as before: every increment extended
        for n in range(a.passes):
            c0, t0 = cpu_s(), time.monotonic()
            query = f"?version={EVIDENCE_VERSION}" + ("" if n == 0 else "&epoch=bench&poll=1")  # (this reader asks)
            nbytes = plain_get_all([f"{e.url}/evidence{query}" for e in endpoints], 16)
            base = (cpu_s() - c0, time.monotonic() - t0)
            c0 = cpu_s()
            urllib3_get_all([f"{e.url}/evidence{query}" for e in endpoints], 16)
            before = cpu_s() - c0
            c0, t0 = cpu_s(), time.monotonic()
            reports, errors = reader.read_all(endpoints)
            read = (cpu_s() - c0, time.monotonic() - t0)
            old = ""
            if old_reader is not None:
                c0 = cpu_s()
                old_reports, old_errors = old_reader.read_all(endpoints)
                # (an agent one of the two readers could not reach, on a loaded machine: compared without it)
                theirs = {r.endpoint.url: _gist(r) for r in old_reports}
                both = [r for r in reports if r.endpoint.url in theirs]
                differ = [r.endpoint.url for r in both if _gist(r) != theirs[r.endpoint.url]]
                assert not differ, f"not the same reports: {differ[:3]}"
                missed = len(endpoints) - len(both)
                old = f" (the reader of {a.before_tree}: {cpu_s() - c0:.2f} CPU-s, the same reports" + \
                    (f"; {missed} agents not read by one of the two: {(old_errors or errors)[:1]})" if missed else ")")
            assert not errors, errors[:3]
            samples = sum(len(c.scan.samples) for r in reports for c in r.logs)
            loop_before = _loop(reports, signals_before, skip_empty=False)
            loop = _loop(reports, signals, skip_empty=True)
            assert {k: s.scan.samples for k, s in signals.items()} == \
                {k: s.scan.samples for k, s in signals_before.items()}, "the loop's histories differ"
            held = sum(len(x.scan.samples) for x in signals.values())
            rows.append((base, read, nbytes, len(reports), samples, loop))
            print(f"pass {n + 1} ({'whole' if n == 0 else 'increments'}): read_all {read[0]:.2f} CPU-s, "
                  f"{read[1]:.2f} s wall "
                  f"({read[0] / a.agents * 1e3:.2f} ms CPU per agent; {read[0] / a.interval:.3f} core at "
                  f"{a.interval:.0f} s){old} | baseline plain GETs "
                  f"{base[0]:.2f} CPU-s, {base[1]:.2f} s wall (urllib3's pool, as before: {before:.2f} CPU-s) | "
                  f"{nbytes / 1e6:.0f} MB, {len(reports):,} reports, "
                  f"{sum(len(r.gpus) for r in reports):,} pods' GPU evidence, {samples:,} progress samples | loop "
                  f"(extend, compact) {loop:.2f} CPU-s (every increment extended, as before: {loop_before:.2f}), "
                  f"{held:,} samples held")
        # discover: the DaemonSet's pods as the API lists them, decoded and turned into endpoints
        pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"taugrid-evidence-agent-{i:05x}", "namespace": "taugrid-system", "uid": f"uid-{i}",
            "labels": {"app.kubernetes.io/name": "taugrid-evidence", "app.kubernetes.io/component": "agent",
                       "controller-revision-hash": "5d8f7c9b6", "pod-template-generation": "1"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "taugrid-evidence-agent",
                                 "uid": "ds-uid", "controller": True}]},
            "spec": {"nodeName": f"gpu-{i:04d}", "containers": [{"name": "agent", "image": "taugrid-evidence:1",
                                                                 "ports": [{"containerPort": 9402}]}]},
            "status": {"phase": "Running", "podIP": address(i), "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}]}}
            for i in range(a.agents)]
        listing = orjson.dumps({"kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": pods})
        c0 = cpu_s()
        eps = endpoints_from_pods(orjson.loads(listing)["items"])
        disc = cpu_s() - c0
        assert len(eps) == a.agents
        best = min(rows[1:] or rows, key=lambda r: r[1][0])  # increments: the steady state
        print(f"discover: list of {a.agents:,} agent pods ({len(listing) / 1e6:.1f} MB) decoded into endpoints: "
              f"{disc * 1e3:.0f} ms CPU")
        per_pass = best[1][0] + disc + best[5]
        print(f"per pass in the steady state (best of the increment passes; poller, discover, loop): "
              f"{per_pass:.2f} CPU-s = {per_pass / a.interval:.3f} core at a {a.interval:.0f} s interval; of which "
              f"transport (baseline) {best[0][0]:.2f} CPU-s, loop {best[5]:.2f} CPU-s")
    finally:
        conn.send("stop")
        proc.join(10)


if __name__ == "__main__":
    main()
