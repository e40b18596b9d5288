"""Controller benchmark: watch → index → claims on one core, beside the official client's decode.

Layout: this process runs the `Controller` (reflector threads + loop) pinned to CPU 0; the
simulated API server runs in a separate process pinned to CPU 1, so the controller's core is
measured alone. Phases, in order:

  1. memory:    controller RSS growth from a small to a large fleet of tracked pods, fed by watch
                (fixed overhead cancels): (RSS(large) - RSS(small)) / (large - small).
  2. sustained: the simulator writes pod status updates at a steady rate; claim update latency
                (`Controller.latencies()`: queue arrival → end of the re-evaluation that saw it).
  3. burst:     the simulator writes M pod MODIFIED updates under its store lock (so they are all
                queued server side), then releases; time until the controller has applied and
                evaluated all M. Events/s end to end, plus latency during the burst.
  4. decode:    the same served watch lines (fetched back from the simulator) through
                orjson.loads → collector.kube.normalize → RunIndex.upsert in-process (no HTTP, no
                threads), and through the official client's watch decode
                (`kubernetes.watch.Watch().unmarshal_event(line, "V1Pod")`, what
                `Watch().stream()` does per line with deserialization on): the baseline.
  5. tracemalloc (when RSS/pod is over target, or --trace-memory): phase 1 again, smaller, with
                tracemalloc on in the controller's process: retained bytes per pod by allocation site.

Latency samples come from the controller's own list; the bench swaps in a list that also keeps
what the controller trims past 100k samples (phases 2-3 only). Other load on CPU 0 slows the
wall-clock figures; "per CPU-second" is the figure to compare across runs on a busy machine.

Stream phases (2-4) run `--repeats` times (3); their figures are medians, met/missed read from the
median, and the spread of the throughput rows is printed.

Usage: .venv/bin/python bench/bench_controller.py [--quick] [--repeats 3] [--help for sizes]
"""

from __future__ import annotations

import argparse
import gc
import logging
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The tree whose code is measured: this one, or a baseline checkout (--baseline: a child process).
TREE = Path(os.environ.get("TAUGRID_BENCH_TREE") or ROOT)
if str(TREE) not in sys.path:
    sys.path.insert(0, str(TREE))

import orjson  # noqa: E402

from tests.dumpkit import pod as base_pod  # noqa: E402
from tests.test_explain_fixtures import taurun  # noqa: E402

TARGET_EPS = 20_000
TARGET_BYTES_PER_POD = 1024
TARGET_P99_S = 0.200

NAMESPACES = 8
Obj = dict[str, Any]


# --- realistic objects --------------------------------------------------------------------------


def _hex(seed: str, n: int) -> str:
    import hashlib

    out = ""
    i = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{i}".encode()).hexdigest()
        i += 1
    return out[:n]


def run_name(i: int) -> tuple[str, str]:
    return f"team-{i % NAMESPACES}", f"llm-run-{i:05d}"


def pod_name(run: str, j: int) -> str:
    return f"{run}-raycluster-{'head' if j == 0 else 'worker'}-{j:02d}"


def realistic_pod(ns: str, run: str, j: int, created: datetime, node: str, gpus: int = 8) -> Obj:
    """A KubeRay GPU pod as a real API server serves it: ~5 KB of JSON. `gpus`: what it holds (0: a
    CPU pod of the run, no GPU request)."""
    head = j == 0
    rc = f"{run}-raycluster"
    group = "headgroup" if head else "gpu-workers"
    role = "head" if head else "worker"
    labels = {
        "taugrid.io/run": run,
        "ray.io/cluster": rc,
        "ray.io/node-type": role,
        "ray.io/group": group,
        "ray.io/is-ray-node": "yes",
        "ray.io/identifier": f"{rc}-{role}",
        "app.kubernetes.io/created-by": "kuberay-operator",
        "app.kubernetes.io/name": "kuberay",
        "kueue.x-k8s.io/queue-name": "team-queue",
        "kueue.x-k8s.io/podset": group,
    }
    p = base_pod(pod_name(run, j), ns, created, node=node, gpus=gpus, labels=labels,
                 owner={"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": rc, "uid": f"uid-{rc}"})
    m = p["metadata"]
    m["generateName"] = f"{rc}-{role}-"
    m["annotations"] = {
        "ray.io/ft-enabled": "false",
        "kueue.x-k8s.io/workload": f"raycluster-{rc}-4f2a1",
        "kubectl.kubernetes.io/default-container": "ray-worker" if not head else "ray-head",
    }
    image = "nvcr.io/acme/llm-trainer:26.01-py3"
    env = [{"name": k, "value": v} for k, v in (
        ("RAY_CLUSTER_NAME", rc), ("RAY_PORT", "6379"), ("RAY_ADDRESS", f"{rc}-head-svc.{ns}.svc.cluster.local:6379"),
        ("NCCL_DEBUG", "WARN"), ("NCCL_IB_HCA", "mlx5"), ("RAY_CLOUD_INSTANCE_ID", m["name"]),
    )]
    gpu = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    res = {"limits": {"cpu": "96", "memory": "1600Gi", **gpu, "ephemeral-storage": "500Gi"},
           "requests": {"cpu": "96", "memory": "1600Gi", **gpu, "ephemeral-storage": "500Gi"}}
    mounts = [{"name": "shared-mem", "mountPath": "/dev/shm"}, {"name": "checkpoints", "mountPath": "/checkpoints"},
              {"name": "datasets", "mountPath": "/data", "readOnly": True},
              {"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
               "readOnly": True}]
    main = {
        "name": "ray-head" if head else "ray-worker", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/bash", "-lc", "--"],
        "args": [f"ulimit -n 65536; ray start --address=$RAY_ADDRESS --block --num-gpus={gpus} "
                 "--metrics-export-port=8080"],
        "env": env, "resources": res, "volumeMounts": mounts,
        "ports": [{"containerPort": 8080, "name": "metrics", "protocol": "TCP"}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
    }
    sidecar = {"name": "fluentbit", "image": "fluent/fluent-bit:3.1.4", "imagePullPolicy": "IfNotPresent",
               "resources": {"limits": {"cpu": "200m", "memory": "256Mi"},
                             "requests": {"cpu": "100m", "memory": "128Mi"}},
               "volumeMounts": [{"name": "ray-logs", "mountPath": "/tmp/ray"}],
               "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
    init = {"name": "wait-gcs-ready", "image": image, "command": ["/bin/bash", "-lc", "--"],
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
    p["spec"] = {
        "containers": [main, sidecar], "initContainers": [init], "nodeName": node,
        "restartPolicy": "Never", "schedulerName": "default-scheduler", "serviceAccountName": "ray-worker",
        "serviceAccount": "ray-worker", "priorityClassName": "training-high", "priority": 100000,
        "dnsPolicy": "ClusterFirst", "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        "securityContext": {}, "terminationGracePeriodSeconds": 30,
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                         "cloud.google.com/gke-nodepool": "h100-pool"},
        "tolerations": [
            {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"},
            {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "tolerationSeconds": 300},
        ],
        "volumes": [
            {"name": "shared-mem", "emptyDir": {"medium": "Memory", "sizeLimit": "256Gi"}},
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": f"{run}-ckpt"}},
            {"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets-ro", "readOnly": True}},
            {"name": "ray-logs", "emptyDir": {}},
            {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}},
        ],
    }
    st = p["status"]
    t = st["conditions"][0]["lastTransitionTime"]
    st["conditions"] = [{"type": c, "status": "True", "lastProbeTime": None, "lastTransitionTime": t}
                        for c in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                  "PodScheduled")]
    st.update({
        "hostIP": f"10.20.{j}.{hash(node) % 250}", "hostIPs": [{"ip": f"10.20.{j}.{hash(node) % 250}"}],
        "podIP": f"10.64.{j}.{len(run)}", "podIPs": [{"ip": f"10.64.{j}.{len(run)}"}],
        "startTime": t, "qosClass": "Guaranteed",
    })

    def cstatus(name: Any, img: Any, state: Obj, ready: bool) -> Obj:
        return {"name": name, "image": img, "imageID": f"{img.split(':')[0]}@sha256:{_hex(img, 64)}",
                "containerID": f"containerd://{_hex(m['name'] + name, 64)}", "ready": ready, "restartCount": 0,
                "started": ready, "lastState": {}, "state": state}

    st["containerStatuses"] = [cstatus(main["name"], image, {"running": {"startedAt": t}}, True),
                               cstatus("fluentbit", sidecar["image"], {"running": {"startedAt": t}}, True)]
    st["initContainerStatuses"] = [cstatus("wait-gcs-ready", image, {"terminated": {
        "exitCode": 0, "reason": "Completed", "startedAt": t, "finishedAt": t,
        "containerID": f"containerd://{_hex(m['name'] + 'init', 64)}"}}, False)]
    return p


def bumped(obj: Obj, n: int) -> Obj:
    """A new status (shared structure otherwise) with the main container's restartCount bumped."""
    st = obj["status"]
    cs = st["containerStatuses"]
    main = {**cs[0], "restartCount": cs[0]["restartCount"] + n}
    return {**obj, "status": {**st, "containerStatuses": [main, *cs[1:]]}}


def node_name(n: int) -> str:
    return f"gpu-{n:04d}"


def fleet_controller(runs: int, pods_per_run: int, nodes: int, now: Callable[[], datetime], *,
                     ready: bool = True) -> tuple[Any, list[Obj]]:
    """A controller (never opened: no thread, no server) holding `runs` TauRuns of `pods_per_run`
    realistic GPU pods each, spread over `nodes` GPU nodes, written into its index as a watch would;
    and the pods. `ready`: the Node objects too, every resource listed (synced) and the loop ready,
    as after the start; otherwise the runs' objects alone (what an index-only bench reads)."""
    from collector.controller import Controller
    from collector.kube import normalize
    from collector.settings import ControllerSettings, Settings
    from collector.sources.kube_api import KubeApi, api_client_for, resources_for

    now0 = now()
    settings = Settings(controller=replace(ControllerSettings(), leader_election=False,
                                           log_poll_interval=timedelta(0)))
    c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")), settings, now)
    res = {r.kind: r for r in resources_for(settings.taugrid)}
    created = now0 - timedelta(hours=3)
    stamp = now0.strftime("%Y-%m-%dT%H:%M:%SZ")
    objs: list[Obj] = [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name(n)}, "spec": {},
         "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                    "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": stamp}]}}
        for n in range(nodes)] if ready else []
    pods: list[Obj] = []
    for i in range(runs):
        ns, run = run_name(i)
        objs.append(taurun(run, ns, "Running", created, workers=pods_per_run - 1))
        for j in range(pods_per_run):
            p = realistic_pod(ns, run, j, created, node_name((i * pods_per_run + j) % nodes))
            p["metadata"]["resourceVersion"] = "1"
            objs.append(p)
            pods.append(p)
    for o in objs:
        rec = normalize(o).record
        assert rec is not None, o["metadata"]["name"]
        c._upsert(res[o["kind"]], rec)
    if ready:
        for kind in ("Pod", "Node", "TauRun", "Event", "Workload", "Job", "RayCluster", "RayJob"):
            c.index.synced[kind] = now0
        c.ready.set()
    return c, pods


# --- the simulator process ----------------------------------------------------------------------


def _sim_main(conn: Any, cpu: int | None, window: int) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    logging.disable(logging.CRITICAL)
    from kubesim.server import Simulator

    sim = Simulator(watch_window=window)
    url = sim.start("127.0.0.1:0")
    store = sim.store
    pod_rt = sim.resource("v1", "Pod")
    namespaces: set[str] = set()
    pods: list[tuple[str, str]] = []
    cur: dict[tuple[str, str], Obj] = {}
    created = datetime.now(UTC) - timedelta(hours=3)
    conn.send(url)

    def write(i: int) -> tuple[str, str, str]:
        key = pods[i % len(pods)]
        new = store.replace(pod_rt, key[0], key[1], bumped(cur[key], 1), subresource="status")
        cur[key] = new
        return key[0], key[1], new["metadata"]["resourceVersion"]

    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "close":
                sim.close()
                conn.send(None)
                return
            if cmd == "populate":
                # `gpu_nodes`: each node's 8 GPUs held by one of its pods, the others none (a node can
                # hold no more); else every pod 8 GPUs, whatever its node holds
                first, n, ppr, nodes, *more = args
                gpu_nodes = bool(more and more[0])
                per_node = -(-(first + n) * ppr // max(nodes, 1))  # pods a node holds, at most
                held: dict[int, int] = {}  # GPUs its pods hold, by node
                last: tuple[str, str, str] = ("", "", "")
                sizes: list[int] = []
                for node in range(nodes):
                    sim.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{node:04d}",
                               "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
                               "spec": {}, "status": {"capacity": {"nvidia.com/gpu": "8"},
                                                      "allocatable": {"nvidia.com/gpu": "8"},
                                                      "conditions": [{"type": "Ready", "status": "True"}]}})
                for i in range(first, first + n):
                    ns, run = run_name(i)
                    if ns not in namespaces:
                        sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
                        namespaces.add(ns)
                    sim.apply(taurun(run, ns, "Running", created, workers=ppr - 1))
                    for j in range(ppr):
                        p = i * ppr + j
                        k, node = divmod(p, max(nodes, 1))
                        # (the node's k-th pod holds its GPUs where k is the node's own turn: one a node,
                        # and with `ppr` pods a node, one a run)
                        gpus = 8 if not gpu_nodes or k == node % per_node else 0
                        obj = sim.apply(realistic_pod(ns, run, j, created, f"gpu-{node:04d}", gpus))
                        if gpus:
                            held[node] = held.get(node, 0) + gpus
                        key = (ns, obj["metadata"]["name"])
                        pods.append(key)
                        cur[key] = obj
                        last = (ns, key[1], obj["metadata"]["resourceVersion"])
                        if len(sizes) < 16:
                            sizes.append(len(orjson.dumps(obj)))
                conn.send({"pods": len(pods), "last": last, "sizes": sizes, "rv": store.resource_version,
                           "gpus": sum(held.values()), "gpus_node_max": max(held.values(), default=0)})
            elif cmd == "burst":
                (m,) = args
                rv0 = store.resource_version
                t_w = time.monotonic()
                with store.cond:  # watches wait on this lock: all M are queued server side first
                    for i in range(m):
                        last = write(i)
                    t0 = time.monotonic()
                conn.send({"t0": t0, "write_s": t0 - t_w, "last": last, "rv0": rv0})
            elif cmd == "sustain":
                rate, secs = args
                total = int(rate * secs)
                t0 = time.monotonic()
                for i in range(total):
                    due = t0 + i / rate
                    d = due - time.monotonic()
                    if d > 0.001:
                        time.sleep(d)
                    last = write(i)
                conn.send({"t0": t0, "t1": time.monotonic(), "last": last, "n": total})
            else:
                raise ValueError(cmd)
        except Exception as e:  # surface to the parent
            conn.send(RuntimeError(f"simulator {cmd}: {type(e).__name__}: {e}"))


# --- the replay server: the burst's watch lines at wire speed ------------------------------------------


def _replay_main(conn: Any, cpu: int | None, sim_url: str, rv0: str, n: int) -> None:
    """Answers as the simulator (every GET proxied to it), except watches: a pod watch gets the
    recorded burst, written as fast as the socket takes it once the parent says go; other watches
    stay open and quiet. The simulator encodes ~3,000 lines/s on this machine, far below what the
    controller is asked to take; this measures the controller, not the simulator."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    import urllib3

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    lines = fetch_watch_lines(sim_url, rv0, n)
    last = orjson.loads(lines[-1])["object"]["metadata"]
    # One HTTP chunk per event, as the API server frames a watch (64 of them per socket write, so
    # that this server keeps ahead of the reader).
    blocks = [b"".join(b"%x\r\n%s\n\r\n" % (len(x) + 1, x) for x in lines[i:i + 64]) for i in range(0, len(lines), 64)]
    del lines
    http = urllib3.PoolManager(maxsize=32)
    go = threading.Event()
    served = threading.Event()
    stop = threading.Event()
    times: dict[str, float] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlsplit(self.path)
            q = parse_qs(url.query)
            if q.get("watch") != ["true"]:
                r = http.request("GET", sim_url + self.path, headers={"Accept": "application/json"})
                self.send_response(r.status)
                self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(r.data)))
                self.end_headers()
                self.wfile.write(r.data)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            deadline = time.monotonic() + int(q.get("timeoutSeconds", ["30"])[0])
            try:
                if url.path == "/api/v1/pods" and not served.is_set():
                    served.set()
                    go.wait()
                    times["t0"] = time.monotonic()
                    for block in blocks:
                        self.wfile.write(block)
                    self.wfile.flush()
                    times["t1"] = time.monotonic()
                stop.wait(max(0.0, deadline - time.monotonic()))
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conn.send((f"http://127.0.0.1:{server.server_address[1]}", (last["namespace"], last["name"],
                                                               last["resourceVersion"])))
    while True:
        cmd = conn.recv()
        if cmd == "go":
            served.wait(60)
            t = time.monotonic()
            go.set()
            conn.send(t)
        elif cmd == "times":
            conn.send(dict(times))
        else:
            stop.set()
            server.shutdown()
            conn.send(None)
            return


def replay_burst(a: argparse.Namespace, cpu: int | None, sim_url: str, rv0: str) -> dict[str, Any]:
    """End to end with the server out of the way: the recorded burst through HTTP, reflector, queue, loop."""
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_replay_main, args=(child, cpu, sim_url, rv0, a.burst), daemon=True)
    proc.start()
    c: Any = None
    try:
        url, last = conn.recv()
        c = open_controller(url, a.tick)
        wait_until(lambda: c.ready.is_set() and len(c.claims) == a.runs, 120, "ready (replay)")
        c._latencies = KeepAll()
        cpu0 = cpu_s()
        conn.send("go")
        t0 = conn.recv()
        t_done = wait_until(lambda: len(c._latencies) + len(c._latencies.dropped) >= a.burst
                            and applied(c, last)(), 600, "replayed burst applied")
        wall = t_done - t0
        cpu_used = cpu_s() - cpu0
        conn.send("times")
        times = conn.recv()
        return {"events": a.burst, "eps": a.burst / wall, "wall_s": wall, "cpu": cpu_used / wall,
                "eps_cpu": a.burst / cpu_used, "write_s": times["t1"] - times["t0"], **pcts(c._latencies.all())}
    finally:
        if c is not None:
            c.close()
        conn.send("close")
        conn.recv()
        proc.join(10)


class SimProcess:
    def __init__(self, cpu: int | None, window: int) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_sim_main, args=(child, cpu, window), daemon=True)
        self.proc.start()
        self.url: str = self.conn.recv()

    def call(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
        r = self.conn.recv()
        if isinstance(r, Exception):
            raise r
        return r

    def close(self) -> None:
        try:
            self.call("close")
        finally:
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.terminate()


# --- the measured side ----------------------------------------------------------------------------


class KeepAll(list[float]):
    """The controller trims its latency list past 100k samples; keep the trimmed ones too."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: list[float] = []

    def __delitem__(self, idx: Any) -> None:
        self.dropped.extend(self[idx])
        super().__delitem__(idx)

    def all(self) -> list[float]:
        return self.dropped + list(self)


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def wait_until(pred: Callable[[], bool], timeout: float, what: str, step: float = 0.005,
               sample: Callable[[], None] | None = None) -> float:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        if sample is not None:
            sample()
        time.sleep(step)
    return time.monotonic()


def open_controller(url: str, tick_s: float, *, keep_all: bool = True) -> Any:
    from collector.controller import Controller
    from collector.settings import ControllerSettings, Settings
    from collector.sources.kube_api import KubeApi, api_client_for

    settings = Settings(controller=replace(ControllerSettings(), leader_election=False,
                                           log_poll_interval=timedelta(0), tick=timedelta(seconds=tick_s)))
    c = Controller(KubeApi(api_client_for(url)), settings, lambda: datetime.now(UTC))
    if keep_all:
        c._latencies = KeepAll()  # bench-only: keep every sample (see KeepAll)
    c.open()
    return c


def applied(c: Any, last: tuple[str, str, str]) -> Callable[[], bool]:
    ns, name, rv = last

    def pred() -> bool:
        rec = c.index.get("Pod", ns, name)
        return rec is not None and rec.resource_version == rv and c._changes.empty() and not c._dirty
    return pred


def pcts(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))]
    return {"n": len(s), "p50": q(0.50), "p99": q(0.99), "max": s[-1]}


def phase_memory(a: argparse.Namespace, cpu: int | None, *, small: int, large: int,
                 trace: bool = False) -> dict[str, Any]:
    """Grow the fleet the controller tracks from `small` to `large` pods through its watches.

    With `trace`, tracemalloc runs in this (the controller's) process and the retained growth is
    attributed to allocation sites; RSS is then inflated by tracemalloc itself and not reported.
    """
    ppr = a.pods_per_run
    small_runs, large_runs = small // ppr, large // ppr
    sim = SimProcess(cpu, window=50_000)
    c: Any = None
    try:
        r = sim.call("populate", 0, small_runs, ppr, a.nodes)
        if trace:
            tracemalloc.start(1)
        c = open_controller(sim.url, a.tick, keep_all=False)  # what the controller itself keeps
        wait_until(lambda: c.ready.is_set() and len(c.claims) == small_runs, 120, "ready (memory, small)")
        wait_until(applied(c, r["last"]), 120, "small fleet applied")
        time.sleep(0.2)
        gc.collect()
        rss_a = rss_bytes()
        snap_a = tracemalloc.take_snapshot() if trace else None
        chunk = max(1, a.mem_chunk // ppr)
        done = small_runs
        while done < large_runs:
            n = min(chunk, large_runs - done)
            r = sim.call("populate", done, n, ppr, 0)
            done += n
            wait_until(applied(c, r["last"]), 300, "large fleet chunk applied")
        wait_until(lambda: len(c.claims) == large_runs, 60, "claims for the large fleet")
        time.sleep(0.2)
        gc.collect()
        rss_b = rss_bytes()
        pods_a, pods_b = small_runs * ppr, large_runs * ppr
        out = {"pods_small": pods_a, "pods_large": pods_b, "rss_small": rss_a, "rss_large": rss_b,
               "per_pod": (rss_b - rss_a) / (pods_b - pods_a), "sizes": r["sizes"]}
        if snap_a is not None:
            diff = tracemalloc.take_snapshot().compare_to(snap_a, "lineno")
            pods = pods_b - pods_a
            out["traced_per_pod"] = sum(d.size_diff for d in diff) / pods
            out["top"] = [(_site(d.traceback[0].filename, d.traceback[0].lineno), d.size_diff / pods,
                           d.count_diff / pods) for d in diff[:14]]
        return out
    finally:
        if trace:
            tracemalloc.stop()
        if c is not None:
            c.close()
        sim.close()


def _site(filename: str, lineno: int) -> str:
    try:
        return f"{os.path.relpath(filename, ROOT) if filename.startswith(str(ROOT)) else filename}:{lineno}"
    except ValueError:
        return f"{filename}:{lineno}"


def fetch_watch_lines(url: str, rv: str, n: int) -> list[bytes]:
    import urllib3

    http = urllib3.PoolManager()
    resp = http.request("GET", f"{url}/api/v1/pods?watch=true&resourceVersion={rv}&timeoutSeconds=30",
                        preload_content=False)
    lines: list[bytes] = []
    buf = b""
    try:
        for chunk in resp.stream(1 << 20):
            buf += chunk
            *complete, buf = buf.split(b"\n")
            lines.extend(x for x in complete if x.strip() and b'"type":"BOOKMARK"' not in x[:20])
            if len(lines) >= n:
                break
    finally:
        resp.release_conn()
        resp.close()
    return lines[:n]


def phase_stream(a: argparse.Namespace, cpu: int | None) -> dict[str, Any]:
    ppr = a.pods_per_run
    sim = SimProcess(cpu, window=2 * a.burst + 50_000)  # two bursts, and the first one read again
    c: Any = None
    out: dict[str, Any] = {}
    try:
        r = sim.call("populate", 0, a.runs, ppr, a.nodes)
        out["sizes"] = r["sizes"]
        out["pods"] = r["pods"]
        c = open_controller(sim.url, a.tick)
        t = time.monotonic()
        wait_until(lambda: c.ready.is_set() and len(c.claims) == a.runs, 120, "ready")
        wait_until(applied(c, r["last"]), 120, "initial fleet applied")
        out["startup_s"] = time.monotonic() - t

        # sustained rate
        if a.sustain_s > 0:
            c._latencies = KeepAll()
            cpu0 = cpu_s()
            s = sim.call("sustain", a.rate, a.sustain_s)
            t_done = wait_until(applied(c, s["last"]), 120, "sustained updates applied")
            wall = t_done - s["t0"]
            lat = c._latencies.all()
            out["sustained"] = {"events": s["n"], "rate": s["n"] / (s["t1"] - s["t0"]), "lag_s": t_done - s["t1"],
                                "cpu": (cpu_s() - cpu0) / wall, "evaluations": c.evaluations, **pcts(lat)}

        # burst: the controller's path now (typed pods), then the previous one (dicts + normalize)
        out["burst"] = burst(sim, c, a.burst)
        c.close()
        c = None
        import collector.controller as controller_mod
        from collector.sources.decode import POD_DICTS, decoder_for

        def previous(api_version: str, kind: str, *, full: bool = False) -> Any:
            return POD_DICTS if (api_version, kind) == ("v1", "Pod") and not full else decoder_for(
                api_version, kind, full=full)

        # bench-only: the controller as it was before the typed path. collector.controller imported the name,
        # so it is swapped in that module's namespace (where the controller looks it up at call time).
        vars(controller_mod)["decoder_for"] = previous
        try:
            c = open_controller(sim.url, a.tick)
            wait_until(lambda: c.ready.is_set() and len(c.claims) == a.runs, 120, "ready (previous path)")
            out["burst_prev"] = burst(sim, c, a.burst)
        finally:
            vars(controller_mod)["decoder_for"] = decoder_for
        c.close()
        c = None
        b = out["burst"]
        out["serve_eps"] = serve_rate(sim.url, b["rv0"], a.burst)
        out["replay"] = replay_burst(a, cpu, sim.url, b["rv0"])
        vars(controller_mod)["decoder_for"] = previous
        try:
            out["replay_prev"] = replay_burst(a, cpu, sim.url, b["rv0"])
        finally:
            vars(controller_mod)["decoder_for"] = decoder_for
        # bench-only: the typed path, but watch lines read through urllib3's chunk-by-chunk stream
        # (one hand-off to the loop per event) instead of off the socket (collector.sources.chunked)
        import collector.sources.kube_api as kube_api_mod
        reader = kube_api_mod._chunked_reader
        kube_api_mod._chunked_reader = lambda raw: None
        try:
            out["replay_urllib3"] = replay_burst(a, cpu, sim.url, b["rv0"])
        finally:
            kube_api_mod._chunked_reader = reader

        # the same served lines, for the in-process paths
        lines = fetch_watch_lines(sim.url, b["rv0"], a.decode_lines)
        from collector.sources.kube_api import DEFAULT_RESOURCES, KubeApi, api_client_for

        api = KubeApi(api_client_for(sim.url))
        initial = []
        for res in DEFAULT_RESOURCES:
            if res.kind in ("Pod", "TauRun", "Node"):
                initial.extend(api.list_pages(res)[0])
        out["decode"] = decode_paths(lines, initial, a.baseline_lines)
        if a.baseline_tree:
            out["decode_base"] = baseline_decode(a.baseline_tree, lines, initial, a.baseline_lines)
    finally:
        if c is not None:
            c.close()
        sim.close()
    return out


def burst(sim: SimProcess, c: Any, m: int) -> dict[str, Any]:
    """M pod MODIFIED written at once server side; events/s until the controller applied them all."""
    c._latencies = KeepAll()
    ev0 = c.evaluations
    cpu0 = cpu_s()
    b = sim.call("burst", m)
    depth: list[int] = []  # controller queue length (changes), sampled every 5 ms
    t_done = wait_until(lambda: len(c._latencies) + len(c._latencies.dropped) >= m
                        and applied(c, b["last"])(), 600, "burst applied",
                        sample=lambda: depth.append(c._changes.qsize()))
    wall = t_done - b["t0"]
    cpu_used = cpu_s() - cpu0
    return {"events": m, "eps": m / wall, "wall_s": wall, "sim_write_s": b["write_s"], "rv0": b["rv0"],
            "cpu": cpu_used / wall, "eps_cpu": m / cpu_used,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "evaluations": c.evaluations - ev0, "queue_max": max(depth, default=0), **pcts(c._latencies.all())}


def serve_rate(url: str, rv: str, n: int) -> float:
    """Watch lines/s the simulator serves to a reader that only splits lines: the end-to-end ceiling."""
    import urllib3

    http = urllib3.PoolManager()
    t = time.monotonic()
    resp = http.request("GET", f"{url}/api/v1/pods?watch=true&resourceVersion={rv}&timeoutSeconds=30",
                        preload_content=False)
    got = 0
    buf = b""
    try:
        for chunk in resp.stream(1 << 16):
            buf += chunk
            got += buf.count(b"\n")
            buf = buf[buf.rfind(b"\n") + 1:]
            if got >= n:
                break
    finally:
        resp.release_conn()
        resp.close()
    return got / (time.monotonic() - t)


DECODE_PASSES = 3
STAGES = ("framing", "skim", "typed_decode", "record", "upsert")


def median_of(results: list[Any]) -> Any:
    """Results of repeated phases merged: numbers by their median, dicts key by key, anything else
    (lists of sizes, allocation sites) from the first repeat."""
    first = results[0]
    if isinstance(first, dict):
        return {k: median_of([r[k] for r in results if isinstance(r, dict) and k in r]) for k in first}
    if all(isinstance(r, int) and not isinstance(r, bool) for r in results):
        return statistics.median_low(results)  # a count stays a count
    if all(isinstance(r, int | float) and not isinstance(r, bool) for r in results):
        return statistics.median(results)
    return first


def spread(results: list[dict[str, Any]], phase: str, key: str) -> tuple[float, float]:
    values = [r[phase][key] for r in results]
    return min(values), max(values)


def best_of(run: Callable[[], None], passes: int = DECODE_PASSES) -> float:
    """The least thread CPU time of `passes` calls of `run`, seconds."""
    best = float("inf")
    for _ in range(passes):
        gc.collect()
        t = time.thread_time()
        run()
        best = min(best, time.thread_time() - t)
    return best


QUIET_SLICE = 1000


def best_sliced(run: Callable[[list[bytes]], None], lines: list[bytes], passes: int = DECODE_PASSES) -> float:
    """Seconds of thread CPU time: `run` over each QUIET_SLICE-line slice, the least of `passes`
    for each slice, summed (see `typed_quiet_eps`)."""
    slices = [lines[i:i + QUIET_SLICE] for i in range(0, len(lines), QUIET_SLICE)]
    least = [float("inf")] * len(slices)
    for _ in range(passes):
        gc.collect()
        for i, part in enumerate(slices):
            t = time.thread_time()
            run(part)
            least[i] = min(least[i], time.thread_time() - t)
    return sum(least)


def stages(lines: list[bytes], typed: Any, contract: Any, idx: Any) -> dict[str, float]:
    """Where an in-process event's time goes, µs per line, each stage alone (best of the passes):
    the watch's chunked framing, skimming the JSON (a decode that keeps only "type": the floor of
    any decode of the whole line), the typed decode (floor included), the record built from the
    Structs, and the index upsert."""
    import msgspec
    from msgspec import UNSET

    from collector.kube_pod import PodEvent, pod_record
    from collector.sources.chunked import chunked_lines

    n = len(lines)
    framed = b"".join(b"%x\r\n%s\n\r\n" % (len(x) + 1, x) for x in lines) + b"0\r\n\r\n"

    def framing() -> None:
        pos = 0

        def read(size: int) -> bytes:  # what a socket read hands over: a copy, at most `size`
            nonlocal pos
            piece = framed[pos:pos + size]
            pos += len(piece)
            return piece
        for _ in chunked_lines(read):
            pass

    class _TypeOnly(msgspec.Struct, gc=False):
        type: str = ""

    skim_decode = msgspec.json.Decoder(_TypeOnly).decode

    def skim() -> None:
        for line in lines:
            skim_decode(line)

    def decode() -> None:
        for line in lines:
            typed.event(line)
    objs: list[Any] = []
    for line in lines:
        e = typed.event(line)
        if type(e) is PodEvent:
            o: Any = e.object
            if o.kind is UNSET:
                o.kind = "Pod"
            if o.apiVersion is UNSET:
                o.apiVersion = "v1"
            objs.append(o)

    def record() -> None:
        for o in objs:
            pod_record(o, contract)
    recs = [r for o in objs if (r := pod_record(o, contract)) is not None]

    def upsert() -> None:
        for r in recs:
            idx.upsert(r)
    return {"framing": best_of(framing) / n * 1e6, "skim": best_of(skim) / n * 1e6,
            "typed_decode": best_of(decode) / n * 1e6, "record": best_of(record) / max(1, len(objs)) * 1e6,
            "upsert": best_of(upsert) / max(1, len(recs)) * 1e6}


def decode_paths(lines: list[bytes], initial: list[Obj], baseline_n: int) -> dict[str, Any]:
    """Single-threaded paths, timed in thread CPU time so that other load on the core does not count,
    each the best of `DECODE_PASSES` passes over the same lines (timeit's rule: other load on the
    machine only ever adds time). Every pass of a path does the same work: the index holds the same
    records after each."""
    from kubernetes import watch as k8s_watch

    from collector.correlate import RunIndex
    from collector.kube import normalize
    from collector.settings import TauGridContract

    contract = TauGridContract()
    res: dict[str, Any] = {"lines": len(lines), "bytes": sum(map(len, lines)) / max(1, len(lines))}
    gc.collect()

    for line in lines[:50]:  # warm-up
        orjson.loads(line)
    def loads_only() -> None:
        for line in lines:
            orjson.loads(line)
    res["orjson_eps"] = len(lines) / best_of(loads_only)

    idx = RunIndex()
    for obj in initial:
        rec = normalize(obj, contract).record
        if rec is not None:
            idx.upsert(rec)

    def dict_record(obj: Obj) -> Any:
        """A pod decoded as dicts through `normalize`, with the reflector's defaults filled in."""
        obj.setdefault("kind", "Pod")
        obj.setdefault("apiVersion", "v1")
        rec = normalize(obj, contract, where=f"Pod {obj['metadata']['name']}").record
        assert rec is not None
        return rec

    def orjson_path() -> None:
        for line in lines:
            idx.upsert(dict_record(orjson.loads(line)["object"]))
    res["inproc_eps"] = len(lines) / best_of(orjson_path)

    # The previous path: msgspec's selective decode into dicts, then the same normalize.
    from collector.sources.decode import POD_DICTS as dec
    for line in lines[:50]:
        dec.event(line)

    def selective_path() -> None:
        for line in lines:
            idx.upsert(dict_record(dec.event(line)["object"]))
    res["selective_eps"] = len(lines) / best_of(selective_path)

    def selective_decode() -> None:
        for line in lines:
            dec.event(line)
    res["selective_decode_eps"] = len(lines) / best_of(selective_decode)

    # What the controller runs for pods now: Structs, and the record built from their attributes
    # (collector.kube_pod), with the reflector's steps for a typed event.
    from msgspec import UNSET

    from collector.kube_pod import PodEvent, normalize_pod, pod_record
    from collector.sources.decode import decoder_for
    typed = decoder_for("v1", "Pod")
    for line in lines[:50]:
        typed.event(line)
    fast = 0

    def typed_over(part: list[bytes]) -> None:
        nonlocal fast
        for line in part:
            e = typed.event(line)
            if type(e) is PodEvent:
                fast += 1
                o: Any = e.object
                if o.kind is UNSET:
                    o.kind = "Pod"
                if o.apiVersion is UNSET:
                    o.apiVersion = "v1"
                # As `Controller.upsert` does: the record of a clean pod, normalize_pod for the rest.
                rec = pod_record(o, contract) or normalize_pod(o, contract).record
            else:
                rec = dict_record(e["object"])
            assert rec is not None
            idx.upsert(rec)

    def typed_path() -> None:
        nonlocal fast
        fast = 0
        typed_over(lines)
    res["typed_eps"] = len(lines) / best_of(typed_path)
    res["typed_share"] = fast / len(lines)
    # The same path timed slice by slice: the least time of each QUIET_SLICE lines over the passes,
    # summed. Load from other processes comes in bursts longer than a slice and shorter than a
    # pass, so this estimates the path on a quiet core better than the best whole pass does.
    res["typed_quiet_eps"] = len(lines) / best_sliced(typed_over, lines)

    def typed_decode() -> None:
        for line in lines:
            typed.event(line)
    res["typed_decode_eps"] = len(lines) / best_of(typed_decode)

    res["stage_us"] = stages(lines, typed, contract, idx)

    w = k8s_watch.Watch()  # type: ignore[no-untyped-call]
    texts = [x.decode() for x in lines[:baseline_n]]
    for text in texts[:50]:  # warm-up: the client builds its model validators lazily
        w.unmarshal_event(text, "V1Pod")  # type: ignore[no-untyped-call]
    def official() -> None:
        for text in texts:
            e = w.unmarshal_event(text, "V1Pod")  # type: ignore[no-untyped-call]
            assert e["object"].metadata.name
    res["baseline_eps"] = len(texts) / best_of(official)
    res["baseline_lines"] = len(texts)
    api = w._api_client
    objs = [orjson.dumps(orjson.loads(x)["object"]).decode() for x in texts]
    def deserialize() -> None:
        for text in objs:
            api.deserialize(text, "V1Pod", "application/json")
    res["deserialize_eps"] = len(objs) / best_of(deserialize)
    return res


def baseline_decode(tree: Path, lines: list[bytes], initial: list[Obj], baseline_n: int) -> dict[str, Any]:
    """`decode_paths` over the same lines with a baseline tree's code, in a child process."""
    import json
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        f.write(orjson.dumps({"lines": [x.decode() for x in lines], "initial": initial, "n": baseline_n}))
    try:
        done = subprocess.run([sys.executable, __file__, "--decode-only", f.name], capture_output=True, text=True,
                              check=True, env={**os.environ, "TAUGRID_BENCH_TREE": str(tree)})
    finally:
        os.unlink(f.name)
    res: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return res


def _decode_only(path: str) -> None:
    doc = orjson.loads(Path(path).read_bytes())
    print(orjson.dumps(decode_paths([x.encode() for x in doc["lines"]], doc["initial"], doc["n"])).decode())


def _source_line(site: str) -> str:
    path, _, line = site.rpartition(":")
    try:
        p = Path(path) if os.path.isabs(path) else ROOT / path
        return p.read_text().splitlines()[int(line) - 1].strip()[:90]
    except (OSError, ValueError, IndexError):
        return ""


# --- main -----------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (~30 s), for smoke use")
    p.add_argument("--runs", type=int, default=500, help="TauRuns in the throughput fleet")
    p.add_argument("--pods-per-run", type=int, default=8)
    p.add_argument("--nodes", type=int, default=256, help="GPU nodes the pods are spread over")
    p.add_argument("--burst", type=int, default=100_000, help="pod MODIFIED updates in the burst")
    p.add_argument("--rate", type=float, default=2000, help="sustained updates per second")
    p.add_argument("--sustain-s", type=float, default=20)
    p.add_argument("--mem-small", type=int, default=2000, help="tracked pods, first RSS point")
    p.add_argument("--mem-large", type=int, default=20_000, help="tracked pods, second RSS point")
    p.add_argument("--mem-chunk", type=int, default=2000, help="pods added per step between the RSS points")
    p.add_argument("--decode-lines", type=int, default=20_000, help="watch lines for the in-process figures")
    p.add_argument("--baseline-lines", type=int, default=5_000, help="of those, decoded by the official client")
    p.add_argument("--tick", type=float, default=5.0, help="controller full re-evaluation period, seconds")
    p.add_argument("--trace-memory", action="store_true", help="always run the tracemalloc breakdown")
    p.add_argument("--trace-pods", type=int, default=4000, help="pods added in the tracemalloc run")
    p.add_argument("--no-pin", action="store_true", help="do not pin the controller and simulator to CPUs")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--repeats", type=int, default=3,
                   help="stream phases (throughput, latency, decode) run this many times; figures are medians")
    p.add_argument("--baseline", default="",
                   help="a commit whose in-process path is measured over the same lines, in the same run")
    p.add_argument("--decode-only", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.decode_only:
        _decode_only(a.decode_only)
        return
    a.baseline_tree = None
    if a.quick:
        a.runs, a.burst, a.sustain_s = 100, 20_000, 5
        a.mem_small, a.mem_large, a.trace_pods = 1000, 5000, 2000
        a.decode_lines, a.baseline_lines = 5000, 1000

    logging.disable(logging.WARNING)
    cpus = sorted(os.sched_getaffinity(0))
    pin = not a.no_pin and len(cpus) >= 2
    sim_cpu = cpus[1] if pin else None
    if pin:
        os.sched_setaffinity(0, {cpus[0]})  # before any thread: the controller's threads inherit it
    t_start = time.monotonic()
    print(f"# controller benchmark  {datetime.now(UTC):%Y-%m-%d %H:%M}Z  python {platform.python_version()}  "
          f"cpus {os.cpu_count()}  pinned: {f'controller→cpu{cpus[0]}, simulator→cpu{sim_cpu}' if pin else 'no'}",
          flush=True)

    mem = None if a.skip_memory else phase_memory(a, sim_cpu, small=a.mem_small, large=a.mem_large)
    if mem:
        print(f"  memory phase done ({time.monotonic() - t_start:.0f} s)", flush=True)
    streams = []
    tmp = None
    if a.baseline:
        import subprocess
        import tempfile

        tmp = tempfile.TemporaryDirectory(prefix="bench-controller-")
        a.baseline_tree = Path(tmp.name) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(a.baseline_tree),
                        a.baseline], check=True)
    try:
        for i in range(max(1, a.repeats)):
            streams.append(phase_stream(a, sim_cpu))
            print(f"  stream phases {i + 1}/{max(1, a.repeats)} done ({time.monotonic() - t_start:.0f} s)",
                  flush=True)
    finally:
        if tmp is not None:
            import subprocess

            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(a.baseline_tree)],
                           check=False)
            tmp.cleanup()
    st = median_of(streams)
    tm = None
    if a.trace_memory or (mem and mem["per_pod"] > TARGET_BYTES_PER_POD):
        tm = phase_memory(a, sim_cpu, small=a.mem_small, large=a.mem_small + a.trace_pods, trace=True)
        print(f"  tracemalloc phase done ({time.monotonic() - t_start:.0f} s)", flush=True)

    d = st["decode"]
    b = st["burst"]
    sizes = st["sizes"]
    print(f"\nfleet: {a.runs} TauRuns x {a.pods_per_run} pods = {st['pods']} pods, {a.nodes} nodes; "
          f"pod JSON {min(sizes)}-{max(sizes)} B (watch line avg {d['bytes']:.0f} B); "
          f"startup to all claims {st['startup_s']:.2f} s; tick {a.tick:g} s")
    rows: list[tuple[str, str, str, str]] = []

    def row(name: str, value: str, target: str = "", note: str = "") -> None:
        rows.append((name, value, target, note))

    def ok(good: bool) -> str:
        return "ok" if good else "MISSED"

    bp = st["burst_prev"]
    n = len(streams)
    print(f"stream figures: medians of {n} repeats (met/missed from the median); spread of the throughput rows: "
          + "; ".join(f"{name} {lo:,.0f}-{hi:,.0f}" for name, (lo, hi) in (
              ("burst/s", spread(streams, "burst", "eps")), ("replayed/s", spread(streams, "replay", "eps")),
              ("in-process/s", spread(streams, "decode", "typed_eps")))))
    row("end to end: burst events/s (typed pods, now)", f"{b['eps']:,.0f}", f">= {TARGET_EPS:,}",
        f"{ok(b['eps'] >= TARGET_EPS)}; {b['events']:,} in {b['wall_s']:.2f} s, CPU {b['cpu']:.2f} cores, "
        f"{b['evaluations']} evaluations; x{b['eps'] / d['baseline_eps']:.1f} baseline")
    row("  per CPU-second (robust to other load)", f"{b['eps_cpu']:,.0f}", "",
        f"queue max {b['queue_max']:,} changes; peak RSS {b['peak_rss'] / 2**20:,.0f} MiB")
    row("end to end: burst events/s (previous: dicts+normalize)", f"{bp['eps']:,.0f}", "",
        f"{bp['events']:,} in {bp['wall_s']:.2f} s, CPU {bp['cpu']:.2f} cores; per CPU-second {bp['eps_cpu']:,.0f}")
    rp, rpp = st["replay"], st["replay_prev"]
    row("end to end, server out of the way: replayed burst/s", f"{rp['eps']:,.0f}", f">= {TARGET_EPS:,}",
        f"{ok(rp['eps'] >= TARGET_EPS)}; typed pods; {rp['events']:,} in {rp['wall_s']:.2f} s (written in "
        f"{rp['write_s']:.2f} s), CPU {rp['cpu']:.2f} cores, per CPU-second {rp['eps_cpu']:,.0f}; "
        f"p99 {rp['p99'] * 1e3:.0f} ms")
    ru = st["replay_urllib3"]
    row("  the same, lines read through urllib3's stream", f"{ru['eps']:,.0f}", "",
        f"one hand-off per chunk (= per event); {ru['wall_s']:.2f} s, CPU {ru['cpu']:.2f} cores, "
        f"per CPU-second {ru['eps_cpu']:,.0f}; p99 {ru['p99'] * 1e3:.0f} ms")
    row("  the same, previous path (dicts+normalize)", f"{rpp['eps']:,.0f}", "",
        f"{rpp['wall_s']:.2f} s, CPU {rpp['cpu']:.2f} cores, per CPU-second {rpp['eps_cpu']:,.0f}; "
        f"p99 {rpp['p99'] * 1e3:.0f} ms")
    row("  simulator alone serving the burst's lines/s", f"{st['serve_eps']:,.0f}", "",
        "a reader that only splits lines: the end-to-end ceiling on this machine")
    row("in-process: typed decode+record+upsert/s (now)", f"{d['typed_eps']:,.0f}", ">= 50,000",
        f"{ok(d['typed_eps'] >= 50_000)}; x{d['typed_eps'] / d['baseline_eps']:.1f} baseline; "
        f"{d['typed_share']:.0%} of lines typed; best of {DECODE_PASSES} passes (every in-process row)")
    row("  typed decode only (msgspec Structs)/s", f"{d['typed_decode_eps']:,.0f}", "", "")
    db = st.get("decode_base")
    if db is not None:
        lo, hi = spread(streams, "decode_base", "typed_eps")
        row(f"  baseline {a.baseline}: typed decode+record+upsert/s", f"{db['typed_eps']:,.0f}", "",
            f"the same lines, that tree's code, a child process in each repeat; now "
            f"x{d['typed_eps'] / db['typed_eps']:.2f}; spread {lo:,.0f}-{hi:,.0f}")
    row("  quiet estimate: least time per slice, summed/s", f"{d['typed_quiet_eps']:,.0f}", "",
        f"the same passes timed per {QUIET_SLICE:,} lines" + (
            f"; baseline {db['typed_quiet_eps']:,.0f}/s, now x{d['typed_quiet_eps'] / db['typed_quiet_eps']:.2f}"
            if db is not None and "typed_quiet_eps" in db else ""))
    su = d["stage_us"]
    base_su = db.get("stage_us") if db is not None else None
    row("  per event, each stage alone (us)", " + ".join(f"{su[k]:.1f}" for k in STAGES), "",
        " + ".join(STAGES) + "; the typed decode includes the skim; framing is end to end only" + (
            f"; baseline {' + '.join(f'{base_su[k]:.1f}' for k in STAGES)}" if base_su else ""))
    row("in-process: selective dicts+normalize+upsert/s", f"{d['selective_eps']:,.0f}", "",
        f"x{d['selective_eps'] / d['baseline_eps']:.1f} baseline; the previous path")
    row("  selective decode only (msgspec TypedDicts)/s", f"{d['selective_decode_eps']:,.0f}", "", "")
    row("in-process: orjson.loads+normalize+upsert/s", f"{d['inproc_eps']:,.0f}", "",
        f"x{d['inproc_eps'] / d['baseline_eps']:.1f} baseline; the path before that")
    row("in-process: orjson.loads only/s", f"{d['orjson_eps']:,.0f}", "", f"{d['lines']:,} lines")
    row("baseline: client Watch.unmarshal_event(V1Pod)/s", f"{d['baseline_eps']:,.0f}", "",
        f"kubernetes 37 (pydantic models), {d['baseline_lines']:,} lines; what Watch.stream() does per line")
    row("  of which ApiClient.deserialize(V1Pod) alone/s", f"{d['deserialize_eps']:,.0f}", "", "")
    if "sustained" in st:
        s = st["sustained"]
        row(f"latency @ {s['rate']:,.0f}/s for {a.sustain_s:g} s: p50", f"{s['p50'] * 1e3:.1f} ms")
        row("  p99", f"{s['p99'] * 1e3:.1f} ms", f"<= {TARGET_P99_S * 1e3:.0f} ms",
            f"{ok(s['p99'] <= TARGET_P99_S)}; n={s['n']:,}, lag at end {s['lag_s'] * 1e3:.0f} ms, "
            f"CPU {s['cpu']:.2f} cores")
        row("  max", f"{s['max'] * 1e3:.1f} ms")
    row("latency during burst: p50", f"{b['p50'] * 1e3:.0f} ms")
    row("  p99", f"{b['p99'] * 1e3:.0f} ms", f"<= {TARGET_P99_S * 1e3:.0f} ms", ok(b["p99"] <= TARGET_P99_S))
    row("  max", f"{b['max'] * 1e3:.0f} ms")
    if mem:
        row(f"RSS per tracked pod ({mem['pods_small']:,}->{mem['pods_large']:,})",
            f"{mem['per_pod']:,.0f} B", f"<= {TARGET_BYTES_PER_POD:,} B",
            f"{ok(mem['per_pod'] <= TARGET_BYTES_PER_POD)}; RSS {mem['rss_small'] / 2**20:.0f} -> "
            f"{mem['rss_large'] / 2**20:.0f} MiB")
    if tm:
        row(f"  tracemalloc: retained per pod ({tm['pods_small']:,}->{tm['pods_large']:,})",
            f"{tm['traced_per_pod']:,.0f} B", "", "Python objects kept; the rest of the RSS growth is allocator slack")
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    print(f"\n{'figure':<{w[0]}}  {'value':>{w[1]}}  {'target':<{w[2]}}  note")
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:<{w[2]}}  {r[3]}")
    if tm:
        print("\ntop retained allocation sites per tracked pod (tracemalloc, lineno):")
        for site, size, count in tm["top"]:
            print(f"  {size:7.0f} B  {count:5.2f} blocks  {site}  {_source_line(site)}")
    print(f"\ntotal {time.monotonic() - t_start:.0f} s")


if __name__ == "__main__":
    main()
