"""Node agent overhead: CPU, RSS and /metrics render time, beside baselines measured in the same run.

Load (issue 10): 8 simulated GPUs sampled at 1 Hz (a scripted NVML at the pynvml boundary, as in
tests/agent), 100 pods on the node in the kubelet's pod-resources answer (8 hold a GPU each), and
50 containers each writing 20 CRI lines/s (1,000 lines/s; ~5% progress lines, the rest noise) into
a /var/log/pods tree. Prometheus scrapes /metrics and the controller reads /evidence every 15 s (in the
version the tree's controller asks for: `?version=4`, each pod's GPUs packed by the agent).

Each role runs in its own process for the same window, measured from /proc (utime+stime, VmRSS,
VmHWM):
  - agent:    the whole agent (sampler, XID thread, pod-resources cache, log tailer + parsers, HTTP), with
              glibc's mmap threshold fixed as `taugrid-evidence agent` fixes it (collector/malloc.py); it
              names the collector it imported and the parent checks it is this tree's (or the baseline's)
  - sampler:  baseline 1, the NVML sampler alone at 1 Hz with exposition off (no HTTP, no logs)
  - iterate:  baseline 2, plain line iteration of the same log files (read new bytes, split lines)
  - baseline: with --baseline REF, the agent of git commit REF (its collector/, bench/ and tests/
              exported with `git archive` to a temporary directory), run the same way
Each agent process starts with its own offsets state and is measured once its first log poll is
done (/readyz) plus the warmup, so catching up on the files' tails (up to 1 MiB each) is not in the
window (--no-wait-ready: the warmup only, as this bench measured before).
--repeats N measures the agent (and the baseline agent, alternating with it) N times and prints
medians beside each run's figures; CPU is utime+stime of the process from /proc, also as seconds.
--history S writes S seconds of lines first and has each agent read the files whole: a long-running
agent's retained samples (up to LogSettings.samples_kept per container) are then in its memory.
Usage: .venv/bin/python bench/bench_agent.py [--seconds 30] [--quick] [--repeats 3] [--baseline 9421385]
       [--history 900]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NOISE = (
    "[2026-01-10 12:00:01,829] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 812.3 | bwd: 1630.1",
    "node-3:2211:2890 [5] NCCL INFO Channel 07/24 : 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
    "INFO:megatron.core.datasets.blended_megatron_dataset_builder:Building dataset splits with cls=GPTDataset",
    "    forward-backward ...............................: (8541.20, 8560.77)",
    "/usr/lib/python3.10/site-packages/torch/utils/checkpoint.py:429: UserWarning: pass use_reentrant explicitly",
)
PROGRESS = (" iteration {step:8d}/  250000 | consumed samples: {cs:12d} | elapsed time per iteration (ms): 1000.0 | "
            "learning rate: 9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 | loss scale: 1.0 |")
GPUS = 8
PODS = 100
CONTAINERS = 50
LINES_PER_S = 20


def _uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-444444444444"


# --- roles (child processes) ----------------------------------------------------------------------

def _fake_nvml() -> object:
    from tests.agent.fake_nvml import FakeDevice, FakeNvml
    devs = [FakeDevice(uuid=_uuid(i), pci=f"00000000:{0x10 + i:02X}:00.0", util=95, power_mw=550_000, gpm_sm=80.0)
            for i in range(GPUS)]
    return FakeNvml(devs)


def role_agent(args: argparse.Namespace) -> None:
    from collector.agent import Agent, AgentSettings, LogSettings
    from collector.malloc import fix_mmap_threshold
    assert fix_mmap_threshold()  # what `taugrid-evidence agent` does (collector/agent/command.py)
    s = AgentSettings(node="bench", podresources_socket=Path(args.socket), kmsg_path=None,
                      state_dir=Path(args.state), logs=LogSettings(root=Path(args.root), scope="all"))
    with Agent(s, nv=_fake_nvml()) as agent:
        port = agent.serve("127.0.0.1", 0)
        import collector  # which tree this process runs (the parent checks it is the one it measures)
        print(json.dumps({"port": port, "collector": str(Path(collector.__file__).resolve().parent)}), flush=True)
        sys.stdin.readline()  # until the parent closes stdin


def _stop_at_stdin_close(stop: threading.Event) -> None:
    """Set `stop` once the parent closes stdin (readline returns at EOF)."""
    sys.stdin.readline()
    stop.set()


def role_sampler(args: argparse.Namespace) -> None:
    from collector.agent.nvml import NvmlSampler
    s = NvmlSampler(_fake_nvml())
    s.open()
    print(json.dumps({"port": 0}), flush=True)
    stop = threading.Event()
    threading.Thread(target=_stop_at_stdin_close, args=(stop,), daemon=True).start()
    next_at = time.monotonic()
    while not stop.is_set():
        s.sample()
        next_at += 1.0
        stop.wait(max(0.0, next_at - time.monotonic()))


def role_iterate(args: argparse.Namespace) -> None:
    """Plain line iteration: every 2 s, read what each file grew by and split it into lines."""
    root = Path(args.root)
    offsets: dict[str, int] = {}
    print(json.dumps({"port": 0}), flush=True)
    stop = threading.Event()
    threading.Thread(target=_stop_at_stdin_close, args=(stop,), daemon=True).start()
    n = 0
    while not stop.is_set():
        for p in root.glob("*/*/0.log"):
            key = str(p)
            with open(p, "rb") as f:
                f.seek(offsets.get(key, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            offsets[key] = offsets.get(key, 0) + end
            for _line in data[:end].split(b"\n"):
                n += 1
        stop.wait(2.0)


# --- the parent -------------------------------------------------------------------------------------

class Writer(threading.Thread):
    """50 containers × 20 lines/s, written each 100 ms in small batches (as a runtime flushes)."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stop = threading.Event()
        self.files = []
        self.paths: list[Path] = []
        for c in range(CONTAINERS):
            d = root / f"research_train-{c:03d}_0000-{c:04d}" / "trainer"
            d.mkdir(parents=True)
            self.paths.append(d / "0.log")
            self.files.append(open(d / "0.log", "ab", buffering=0))  # noqa: SIM115
        self.lines = 0
        self.rng = random.Random(0)
        self.step = [0] * CONTAINERS

    def _lines(self, c: int, k: int, ts: str) -> str:
        buf = []
        for _ in range(k):
            if self.rng.random() < 0.05:
                self.step[c] += 1
                text = PROGRESS.format(step=self.step[c], cs=self.step[c] * 1024)
            else:
                text = self.rng.choice(NOISE)
            buf.append(f"{ts} stdout F {text}\n")
        return "".join(buf)

    def prefill(self, seconds: float) -> None:
        """`seconds` of lines per container written at once (stamped in the past), before `start()`."""
        t0 = time.time() - seconds
        for s in range(int(seconds)):
            ts = datetime.fromtimestamp(t0 + s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
            for c, f in enumerate(self.files):
                f.write(self._lines(c, LINES_PER_S, ts).encode())
                self.lines += LINES_PER_S

    def run(self) -> None:
        tick = 0.1
        per_tick = LINES_PER_S * tick
        carry = [0.0] * CONTAINERS
        next_at = time.monotonic()
        while not self.stop.is_set():
            ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
            for c, f in enumerate(self.files):
                carry[c] += per_tick
                k = int(carry[c])
                carry[c] -= k
                if k:
                    f.write(self._lines(c, k, ts).encode())
                    self.lines += k
            next_at += tick
            self.stop.wait(max(0.0, next_at - time.monotonic()))
        for f in self.files:
            f.close()


def _from_start(state: Path, root: Path, paths: list[Path]) -> None:
    """An offsets file (the agent's, collector.agent.cri.OffsetStore) naming byte 0 of every file: the
    agent reads each file whole, as one that has followed the containers since they started."""
    state.mkdir(parents=True, exist_ok=True)
    doc = {"version": 1, "containers": {str(p.parent.relative_to(root)): {p.name: [p.stat().st_ino, 0]}
                                        for p in paths}}
    (state / "log-offsets.json").write_text(json.dumps(doc))


def _proc(pid: int) -> tuple[float, int, int]:
    """(cpu seconds, VmRSS bytes, VmHWM bytes) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return cpu, rss, hwm


def _get(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as r:
        n = len(r.read())
    return time.perf_counter() - t0, n


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(port: int, limit_s: float = 120.0) -> None:
    """Until /readyz answers 200: sampled once and the log directory polled once (tails read)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)


def _asks(tree: Path) -> str:
    """The query the controller of `tree` reads /evidence with (`?version=N`, its EVIDENCE_VERSION; none
    before it asked): the agent renders that version for it every read."""
    m = re.search(r"^EVIDENCE_VERSION = (\d+)$", (tree / "collector/sources/agents.py").read_text(), re.M)
    return f"?version={m.group(1)}" if m else ""


def measure(role: str, seconds: float, common: list[str], warmup: float,
            baseline: Path | None = None, wait_ready: bool = True) -> dict[str, float]:
    if role == "command":  # the real `taugrid-evidence agent` process (real pynvml: no GPU here)
        port = _free_port()
        opts = dict(zip(common[::2], common[1::2], strict=True))
        exe = str(Path(sys.executable).with_name("taugrid-evidence"))
        # this tree's collector, not the one the (shared, editable) environment's script would import
        path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        proc = subprocess.Popen([exe, "agent", "--address", f"127.0.0.1:{port}", "--log-root", opts["--root"],
                                 "--log-scope", "all", "--pod-resources-socket", opts["--socket"], "--kmsg", "",
                                 "--state-dir", opts["--state"] + "-cmd"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "PYTHONPATH": path})
    else:
        script = str(baseline / "bench" / "bench_agent.py") if role == "baseline" and baseline else __file__
        env = {**os.environ, "PYTHONPATH": str(baseline)} if role == "baseline" and baseline else None
        proc = subprocess.Popen([sys.executable, script, "--role", "agent" if role == "baseline" else role,
                                 *common], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        hello = json.loads(proc.stdout.readline())
        port = hello["port"]
        if "collector" in hello:  # an agent role (a baseline's bench may predate the field)
            want = (baseline if role == "baseline" and baseline else ROOT) / "collector"
            if Path(hello["collector"]) != want.resolve():
                raise SystemExit(f"{role} imported {hello['collector']}, not {want}")
    assert proc.stdin is not None
    asks = _asks(baseline if role == "baseline" and baseline else ROOT)
    try:
        if port and wait_ready:
            _wait_ready(port)
        time.sleep(warmup)  # imports, first reads of the files, first pod-resources List
        cpu0, _, _ = _proc(proc.pid)
        t0 = time.monotonic()
        render: list[float] = []
        size = 0
        next_scrape = t0
        while time.monotonic() - t0 < seconds:
            if port and time.monotonic() >= next_scrape:
                dt, size = _get(f"http://127.0.0.1:{port}/metrics")
                render.append(dt)
                _get(f"http://127.0.0.1:{port}/evidence{asks}")
                next_scrape += 15.0
            time.sleep(0.2)
        cpu1, rss, hwm = _proc(proc.pid)
        wall = time.monotonic() - t0
        out = {"cpu_share": (cpu1 - cpu0) / wall, "cpu_s": cpu1 - cpu0, "wall_s": wall, "rss": rss, "hwm": hwm}
        if port:
            lat = [_get(f"http://127.0.0.1:{port}/metrics")[0] for _ in range(20)]
            hz = [_get(f"http://127.0.0.1:{port}/healthz")[0] for _ in range(20)]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/evidence", timeout=10) as r:
                doc = json.loads(r.read())
            out.update(metrics_ms=statistics.median(lat) * 1e3, healthz_ms=statistics.median(hz) * 1e3,
                       metrics_bytes=size, containers=len(doc["logs"]),
                       log_lines=sum(c["lines"] for c in doc["logs"]),
                       steps=sum(len(c["samples"]) for c in doc["logs"]))
        return out
    finally:
        proc.stdin.close()
        if role == "command":
            proc.terminate()
        proc.wait(20)


def _export(ref: str, into: Path) -> Path:
    """collector/, bench/ and tests/ of git commit `ref`, written under `into` (no checkout touched)."""
    out = into / f"baseline-{ref}"
    out.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "collector", "bench", "tests"],
                             check=True, capture_output=True).stdout
    tar = into / "baseline.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(out, filter="data")
    return out


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["agent", "sampler", "iterate"])
    ap.add_argument("--root")
    ap.add_argument("--socket")
    ap.add_argument("--state")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--quick", action="store_true", help="10 s windows")
    ap.add_argument("--repeats", type=int, default=1, help="agent windows (each beside a baseline agent window)")
    ap.add_argument("--baseline", metavar="REF", help="also measure the agent of this git commit, alternating")
    ap.add_argument("--history", type=float, default=0.0, metavar="S",
                    help="S seconds of lines written before the windows, read whole by each agent (its offsets "
                         "name byte 0): the agent holds a long-running one's samples (memory)")
    ap.add_argument("--no-wait-ready", action="store_true",
                    help="start the window after the warmup only (the first poll's catch-up on the files' tails "
                         "may fall in it, as before --repeats existed)")
    args = ap.parse_args()
    if args.role:
        {"agent": role_agent, "sampler": role_sampler, "iterate": role_iterate}[args.role](args)
        return

    from tests.agent.kubelet import PodResourcesServer, PodSpec
    seconds = 10.0 if args.quick else args.seconds
    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    base = _export(args.baseline, tmp) if args.baseline else None
    pods: list[PodSpec] = [
        ("research", f"train-{i:03d}", [("trainer", "nvidia.com/gpu", [_uuid(i)] if i < GPUS else [])])
        for i in range(PODS)]
    writer = Writer(tmp / "pods")
    if args.history:
        writer.prefill(args.history)
    writer.start()
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        with PodResourcesServer(pods) as kubelet:
            lines0, t0 = writer.lines, time.monotonic()
            order = ["sampler", "iterate"]
            for _ in range(max(1, args.repeats)):
                order += ["agent", "baseline"] if base is not None else ["agent"]
            order.append("command")
            for k, role in enumerate(order):
                # each process its own offsets: none resumes where another stopped
                state = tmp / f"state-{k}-{role}"
                common = ["--root", str(tmp / "pods"), "--socket", str(kubelet.socket), "--state", str(state)]
                if args.history and role in ("agent", "baseline"):
                    _from_start(state, tmp / "pods", writer.paths)
                runs.setdefault(role, []).append(measure(role, seconds, common, warmup=4.0, baseline=base,
                                                          wait_ready=not args.no_wait_ready))
            rate = (writer.lines - lines0) / (time.monotonic() - t0)
    finally:
        writer.stop.set()
        writer.join()
        shutil.rmtree(tmp, ignore_errors=True)
    mib = 1 << 20
    a, s, it, cmd = runs["agent"][-1], runs["sampler"][0], runs["iterate"][0], runs["command"][0]
    print(f"load: {GPUS} GPUs at 1 Hz, {PODS} pods in pod-resources, {CONTAINERS} containers, "
          f"{rate:,.0f} lines/s written; {seconds:.0f} s windows, one process each")
    print(f"{'role':<40}{'CPU (% of a core)':>18}{'CPU s':>8}{'RSS MiB':>10}{'peak MiB':>10}")
    rows: list[tuple[str, dict[str, float]]] = []
    for role, label in (("agent", "agent (everything)"), ("baseline", f"baseline: agent at {args.baseline}")):
        for i, r in enumerate(runs.get(role, [])):
            rows.append((f"{label} #{i + 1}" if len(runs[role]) > 1 else label, r))
    rows += [("baseline: sampler, exposition off", s), ("baseline: plain line iteration", it),
             ("`taugrid-evidence agent` (no NVML)", cmd)]
    for name, r in rows:
        print(f"{name:<40}{r['cpu_share'] * 100:>17.2f}%{r['cpu_s']:>8.3f}"
              f"{r['rss'] / mib:>10.1f}{r['hwm'] / mib:>10.1f}")
    for role, label in (("agent", "agent"), ("baseline", f"agent at {args.baseline}")):
        if len(runs.get(role, [])) > 1:
            rr = runs[role]
            print(f"median of {len(rr)}, {label}: {_median(rr, 'cpu_share') * 100:.2f}% of a core, "
                  f"peak {_median(rr, 'hwm') / mib:.1f} MiB (max {max(r['hwm'] for r in rr) / mib:.1f})")
    print(f"/metrics: {a['metrics_ms']:.2f} ms median render+GET ({a['metrics_bytes'] / 1024:.1f} KiB); "
          f"baseline /healthz GET {a['healthz_ms']:.2f} ms")
    print(f"agent parsed {a['log_lines']:,.0f} lines of {a['containers']:.0f} containers "
          f"({a['steps']:,.0f} progress samples kept)")
    cpu = _median(runs["agent"], "cpu_share")
    cpu_ok = cpu <= 0.02
    rss_ok = max(r["hwm"] for r in runs["agent"]) <= 60 * mib
    print(f"goal ≤ 2% of a core: {'met' if cpu_ok else 'MISSED'} ({cpu * 100:.2f}%); goal ≤ 60 MiB RSS (peak): "
          f"{'met' if rss_ok else 'MISSED'}")


if __name__ == "__main__":
    main()
