"""Straggler accuracy against the simulator's truth: detection rate, time to detection, false suspects.

A seeded generator draws multi-pod training runs (4 or 8 ranks in lockstep, steps of 5–20 s, every
rank's compute jittering by 1–5 % per step, 1–10 % on healthy runs; 8 GPUs per rank, played by
kubesim/gpus.py with natural spread and 2–5 % jitter per step) of six classes:

  healthy                 no rank slower: natural jitter only
  healthy-noisy           no rank slower: 10–20 % jitter, and 1–3 % of each rank's steps 30–100 % longer
  straggler               one rank 10–50 % slower from a point on, for good
  straggler-intermittent  one rank 10–50 % slower for 4–8 minutes of every 10–16
  straggler-mild          one rank 5–10 % slower, for good (below the goal's 10 %; reported apart)
  gpu-throttle            one GPU of one rank throttling (thermal or power brake: SM clock and power
                          down, reasons set) from a point on, its rank 10–40 % slower for it

The simulator (kubesim, HTTP API on a manual clock) plays them; every 30 s of scenario time the
harness reads each run's pods and their logs through the Kubernetes API as the controller does
(`--timestamps`, the last 500 lines), reads each node's GPUs as the node agent does (the agent's
NVML sampler over the fake NVML at the pynvml boundary, its `/evidence` document, the controller's
parser), and judges them with the claim engine (`claims.evaluate`, then `claims.gpu.apply_gpu`: GPU
spread and energy per step). Truth is the simulator's side channel: which pod straggles (and which
GPU throttles), and when.

Figures, per class:
- detection: the straggler's pod named within DEADLINE of its first slow stretch beginning; for
  gpu-throttle, the throttling GPU named as a GPU suspect (its UUID and node);
- time to detection: from that instant to the first evaluation naming it (median, p95, max);
- wrong suspects: evaluations naming any other pod (any pod at all on healthy runs), or another GPU
  than the throttling one, over evaluations made once at least 5 minutes of training are in view;
  and runs with any;
- energy per step: the share of evaluations (after warm-up) where it is known, and its error
  against the simulator's own energy over the same steps (median).

Usage: .venv/bin/python bench/straggler_accuracy.py [--runs 40] [--seed 1] [--minutes 30] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

for _p in (Path(__file__).resolve().parents[1],):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import orjson  # noqa: E402

from collector.agent.evidence import Snapshot, evidence_document  # noqa: E402
from collector.agent.nvml import NvmlSampler  # noqa: E402
from collector.agent.podresources import Allocation  # noqa: E402
from collector.claims import evaluate  # noqa: E402
from collector.claims.gpu import apply_gpu  # noqa: E402
from collector.correlate import Signal, build_index  # noqa: E402
from collector.gpu import PodGpuEvidence  # noqa: E402
from collector.kube import normalize  # noqa: E402
from collector.model import PodFacts, Ref  # noqa: E402
from collector.progress import scan_text  # noqa: E402
from collector.settings import ClaimSettings  # noqa: E402
from collector.sources.agents import AgentEndpoint, parse_evidence  # noqa: E402
from collector.sources.kube_api import KubeApi, api_client_for  # noqa: E402
from kubesim.clock import ManualClock  # noqa: E402
from kubesim.engine import ScenarioEngine  # noqa: E402
from kubesim.gpus import SimGpu  # noqa: E402
from kubesim.scenario import scenario_from_dict  # noqa: E402
from kubesim.server import Simulator, SimulatorSettings  # noqa: E402
from tests.agent.fake_nvml import FakeDevice, FakeNvml  # noqa: E402

CLASSES = ("healthy", "healthy-noisy", "straggler", "straggler-intermittent", "straggler-mild", "gpu-throttle")
DEADLINE = timedelta(minutes=10)
EVERY_S = 30.0  # the harness reads and judges this often (scenario seconds)
WARMUP = timedelta(minutes=5)  # wrong suspects are counted once this much training is in view
NS = "research"
START = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)
TRAIN_AT = 50.0  # scenario seconds after a run's submission when it starts training


@dataclass
class Drawn:
    name: str
    cls: str
    workers: int
    every: float
    slower: float = 0.0
    straggler: int = -1
    slow_from: float = 0.0
    throttle_gpu: int = -1


@dataclass
class Outcome:
    drawn: Drawn
    first_slow: float | None = None  # scenario seconds
    named_at: float | None = None
    evaluations: int = 0
    wrong: int = 0  # evaluations (after warm-up) naming another pod, or anyone on a healthy run
    wrong_pods: set[str] = field(default_factory=set)
    first_wrong: str = ""  # the first wrong naming's reason
    truth_gpu: tuple[str, str] = ("", "")  # (UUID, node) of the throttling GPU
    energy_known: int = 0  # evaluations after warm-up with a known energy per step
    energy_errors: list[float] = field(default_factory=list)  # |estimate / simulator's truth - 1|


def draw(seed: int, runs: int, minutes: float,
         classes: tuple[str, ...] = CLASSES) -> tuple[dict[str, Any], list[Drawn]]:
    rng = random.Random(seed)
    drawn = []
    runs_doc = []
    for i in range(runs):
        cls = classes[i % len(classes)]
        workers = rng.choice([4, 8])
        every = rng.choice([5.0, 10.0, 15.0, 20.0])
        d = Drawn(f"run-{i:03d}", cls, workers, every)
        train: dict[str, Any] = {"every": f"{every:g}s", "iterations": 250_000, "pods": "workers",
                                 "startIteration": rng.randrange(0, 5000), "checkpointEvery": 0,
                                 "rankJitter": round(rng.uniform(0.01, 0.10 if cls == "healthy" else 0.05), 3),
                                 "jitter": 0.02, "gpus": True,
                                 "gpuJitter": round(rng.uniform(0.02, 0.05), 3)}
        if cls == "healthy-noisy":
            train.update({"rankJitter": round(rng.uniform(0.10, 0.20), 3),
                          "hiccups": round(rng.uniform(0.01, 0.03), 3)})
        if not cls.startswith("healthy"):
            d.straggler = rng.randrange(workers)
            d.slower = rng.uniform(0.05, 0.10) if cls == "straggler-mild" else \
                rng.uniform(0.10, 0.40) if cls == "gpu-throttle" else rng.uniform(0.10, 0.50)
            d.slow_from = rng.uniform(3, 12) * 60
            train.update({"straggler": d.straggler, "slower": round(d.slower, 3), "slowFrom": f"{d.slow_from:.0f}s"})
            if cls == "gpu-throttle":
                d.throttle_gpu = rng.randrange(8)
                train.update({"throttleGpu": d.throttle_gpu,
                              "throttleReason": rng.choice(["thermal", "power-brake"])})
            if cls == "straggler-intermittent":
                on = rng.uniform(4, 8) * 60
                train.update({"slowFor": f"{on:.0f}s", "slowEvery": f"{on + rng.uniform(6, 8) * 60:.0f}s"})
        drawn.append(d)
        runs_doc.append({
            "name": d.name, "namespace": NS, "kind": "Job", "profile": f"a100-{workers}x8", "queue": "a100",
            "image": "nvcr.io/nvidia/pytorch:24.05-py3", "at": "1s",
            "timeline": [{"at": "2s", "admit": {}}, {"at": "4s", "schedule": {}}, {"at": "5s", "pull": {}},
                         {"at": "45s", "start": {"pullSeconds": 39.0}}, {"at": f"{TRAIN_AT:g}s", "train": train}]})
    nodes = sum(d.workers for d in drawn) + 2
    doc = {
        "name": "stragglers", "seed": seed, "start": START.isoformat().replace("+00:00", "Z"),
        "cluster": {
            "namespaces": [NS],
            "nodes": [{"name": "aks-a100", "count": nodes, "pool": "gpua100", "gpus": 8,
                       "gpuProduct": "NVIDIA-A100-SXM4-80GB", "cpu": "96", "memory": "1800Gi"}],
            "flavors": ["a100"],
            "clusterQueues": [{"name": "gpu-a100", "flavor": "a100", "gpus": 8 * nodes}],
            "localQueues": [{"name": "a100", "namespace": NS, "clusterQueue": "gpu-a100"}],
            "profiles": [{"name": f"a100-{w}x8", "localQueue": "a100", "clusterQueue": "gpu-a100",
                          "flavors": ["a100"], "workers": w, "gpusPerWorker": 8} for w in (4, 8)],
        },
        "runs": runs_doc,
    }
    return doc, drawn


class Agents:
    """One node agent per node with GPUs: the agent's own NVML sampler over the fake NVML (at the
    pynvml boundary) whose devices read what the simulator plays, its `/evidence` document, and the
    controller's parser of it."""

    def __init__(self, clock: ManualClock) -> None:
        self._clock = clock
        self._nodes: dict[str, tuple[NvmlSampler, dict[str, FakeDevice]]] = {}

    def read(self, gpus: list[SimGpu], now: datetime) -> tuple[dict[tuple[str, str], PodGpuEvidence],
                                                               dict[str, datetime]]:
        by_node: dict[str, list[SimGpu]] = defaultdict(list)
        for g in gpus:
            by_node[g.node].append(g)
        out: dict[tuple[str, str], PodGpuEvidence] = {}
        for node, gs in sorted(by_node.items()):
            if node not in self._nodes:
                devs = {g.uuid: FakeDevice(uuid=g.uuid, pci=f"00000000:{0x18 + g.index:02X}:00.0",
                                           nvlink_kib=(0, 0), gpm_sm=0.0) for g in gs}
                sampler = NvmlSampler(FakeNvml(list(devs.values())), clock=lambda: self._clock.now().timestamp())
                sampler.open()
                self._nodes[node] = (sampler, devs)
            sampler, devs = self._nodes[node]
            for g in gs:
                d = devs[g.uuid]
                d.util, d.mem_util, d.power_mw, d.limit_mw, d.sm_mhz = g.util, g.mem_util, g.power_mw, g.limit_mw, \
                    g.sm_mhz
                d.reasons, d.gpm_sm, d.pcie_kbs, d.energy_mj = g.reasons, g.gpm_sm, g.pcie_kbs, g.energy_mj
                d.nvlink_kib = (g.nvlink_tx_kib, g.nvlink_rx_kib)
            at = now.timestamp()
            snap = Snapshot(node, at, sampler.status, sampler.sample(), {}, 120.0,
                            tuple(Allocation(NS, g.pod, "main", "nvidia.com/gpu", g.uuid) for g in gs),
                            True, at, "", (), ())
            doc = orjson.loads(orjson.dumps(evidence_document(snap)))
            report = parse_evidence(doc, AgentEndpoint(node, f"agent-{node}", f"http://{node}:9402"), now)
            out.update({(e.namespace, e.pod): e for e in report.gpus})
        return out, dict.fromkeys(by_node, now)


Named = tuple[tuple[tuple[str, str, str], ...], str, float | None]  # (pod, GPU, node) suspects, reason, J/step


def _judge(api: KubeApi, drawn: list[Drawn], now: datetime, s: ClaimSettings,
           gpus: dict[tuple[str, str], PodGpuEvidence], nodes: dict[str, datetime]) -> dict[str, Named]:
    """Each run's named suspects at `now`, read through the API (and the agents) as the controller reads."""
    raw: list[dict[str, Any]] = []
    for path in (f"/api/v1/namespaces/{NS}/pods", f"/apis/batch/v1/namespaces/{NS}/jobs", "/api/v1/nodes"):
        doc = api.get_json(path)
        kind = {"pods": "Pod", "jobs": "Job", "nodes": "Node"}[path.rsplit("/", 1)[1]]
        api_version = "batch/v1" if kind == "Job" else "v1"
        raw += [{"apiVersion": api_version, "kind": kind, **o} for o in doc.get("items", [])]
    records = [n.record for n in map(normalize, raw) if n.record is not None]
    index = build_index(records)
    index.synced.update(dict.fromkeys(("Pod", "Job", "Node", "Workload", "Event"), now))
    for r in records:
        f = r.facts
        if r.ref.kind == "Pod" and r.ref.namespace == NS and isinstance(f, PodFacts) and f.phase == "Running":
            text = api.get_text(f"/api/v1/namespaces/{NS}/pods/{r.ref.name}/log",
                                [("timestamps", "true"), ("tailLines", 500)])
            index.set_signal(Signal(r.ref, "main", scan_text(text, source=r.ref.name), now))
    out: dict[str, Named] = {}
    for d in drawn:
        ev = index.evidence(Ref("Job", NS, d.name))
        rc = apply_gpu(evaluate(ev, now, s), ev, gpus, nodes, now, s)
        st = rc.stragglers
        jps = rc.energy.joules_per_step if rc.energy is not None else None
        out[d.name] = (tuple((x.pod, x.gpu, x.node) for x in st.suspects), st.reason, jps) if st else ((), "", jps)
    return out


def play(runs: int, seed: int, minutes: float, classes: tuple[str, ...] = CLASSES,
         judge_every: int = 1) -> list[Outcome]:
    """The drawn runs played and judged; `judge_every`: the claims judged on every Nth read only (the
    agents still read every EVERY_S), as the controller does for a progressing run whose log increments
    it defers (`claims.confirm_refresh`)."""
    doc, drawn = draw(seed, runs, minutes, classes)
    scenario = scenario_from_dict(doc, f"<stragglers seed={seed}>")
    clock = ManualClock(scenario.start)
    s = ClaimSettings()
    outcomes = {d.name: Outcome(d) for d in drawn}
    agents = Agents(clock)
    # the simulator's own energy: (scenario s, step, joules over the run's GPUs), per run
    meter: dict[str, list[tuple[float, int, float]]] = defaultdict(list)
    with Simulator(clock=clock, settings=SimulatorSettings(seed=seed)) as sim:
        url = sim.start()
        engine = ScenarioEngine(scenario, url, clock=clock)
        api = KubeApi(api_client_for(url))
        try:
            t = 0.0
            end = TRAIN_AT + 60 * minutes
            reads = 0
            while t < end:
                t = min(t + EVERY_S, end)
                reads += 1
                engine.step_to(t)
                engine.client.flush()
                if engine.errors:
                    raise RuntimeError(f"scenario errors: {engine.errors[:5]}")
                now = clock.now()
                plays = [st.gpu_play for d in drawn if (st := engine.runs[(NS, d.name)]).gpu_play is not None]
                gpus, nodes = agents.read([g for p in plays for gs in p.pods.values() for g in gs], now)
                if reads % judge_every:
                    continue
                named = _judge(api, drawn, now, s, gpus, nodes)
                for d in drawn:
                    o = outcomes[d.name]
                    st = engine.runs[(NS, d.name)]
                    if st.straggling and o.first_slow is None:
                        first = st.straggling[0][0]
                        o.first_slow = first if isinstance(first, float) else None
                    truth = st.straggler_pod
                    hot = st.gpu_play.truth() if st.gpu_play is not None else None
                    if hot is not None and not o.truth_gpu[0]:
                        o.truth_gpu = (hot.uuid, hot.node)
                    suspects, why, jps = named[d.name]
                    if st.gpu_play is not None:
                        meter[d.name].append((t, st.iteration, sum(g.energy_mj for gs in st.gpu_play.pods.values()
                                                                    for g in gs) / 1000.0))
                    if o.first_slow is not None and o.named_at is None and (
                            (d.cls == "gpu-throttle" and (o.truth_gpu[0], o.truth_gpu[1]) in
                             {(gpu, node) for _, gpu, node in suspects})
                            or (d.cls != "gpu-throttle" and truth in {p for p, _, _ in suspects})):
                        o.named_at = t
                    if t - TRAIN_AT >= WARMUP.total_seconds():
                        o.evaluations += 1
                        wrong = [f"{p} {gpu}".strip() for p, gpu, _ in suspects
                                 if d.cls.startswith("healthy") or p != truth
                                 or (gpu and d.cls == "gpu-throttle" and gpu != o.truth_gpu[0])]
                        if wrong:
                            o.wrong += 1
                            o.wrong_pods.update(wrong)
                            o.first_wrong = o.first_wrong or f"at {t:.0f} s: {why}"
                        if jps is not None:
                            o.energy_known += 1
                            o.energy_errors.append(_energy_error(meter[d.name], t, jps))
        finally:
            engine.client.close()
    return list(outcomes.values())


def _energy_error(meter: list[tuple[float, int, float]], t: float, jps: float) -> float:
    """The estimate against the simulator's own joules per step over the 5 minutes before `t`."""
    a = next((m for m in meter if m[0] >= t - 300.0), meter[0])
    b = meter[-1]
    if b[1] <= a[1]:
        return math.inf
    return abs(jps / ((b[2] - a[2]) / (b[1] - a[1])) - 1)


def _in_time(o: Outcome) -> bool:
    return o.named_at is not None and o.first_slow is not None and \
        o.named_at - o.first_slow <= DEADLINE.total_seconds()


def report(outcomes: list[Outcome], seed: int, minutes: float, wall: float) -> dict[str, Any]:
    end = TRAIN_AT + 60 * minutes
    by: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by[o.drawn.cls].append(o)
    out: dict[str, Any] = {"seed": seed, "runs": len(outcomes), "minutes": minutes, "wall_seconds": round(wall, 1),
                           "classes": {}}
    for cls in CLASSES:
        os_ = by.get(cls, [])
        if not os_:
            continue
        evals = sum(o.evaluations for o in os_)
        row: dict[str, Any] = {
            "runs": len(os_),
            "wrong_suspect_evaluations": sum(o.wrong for o in os_), "evaluations": evals,
            "wrong_suspect_rate": round(sum(o.wrong for o in os_) / evals, 4) if evals else None,
            "runs_with_a_wrong_suspect": sum(1 for o in os_ if o.wrong),
            "wrong": [f"{o.drawn.name} ({o.drawn.workers} ranks, {o.drawn.every:g}s steps) {o.first_wrong}"
                      for o in os_ if o.wrong],
            "energy_known_rate": round(sum(o.energy_known for o in os_) / evals, 4) if evals else None,
            "energy_error_median": round(statistics.median(errs), 4) if (errs := [
                e for o in os_ for e in o.energy_errors]) else None,
            "energy_error_p95": round(sorted(errs)[max(0, int(0.95 * len(errs)) - 1)], 4) if errs else None,
        }
        if not cls.startswith("healthy"):
            # judged only where the play went on for the deadline after the first slow stretch began
            slow = [o for o in os_ if o.first_slow is not None and o.first_slow + DEADLINE.total_seconds() <= end]
            ttd = [o.named_at - o.first_slow for o in slow if o.named_at is not None and o.first_slow is not None]
            in_time = [x for x in ttd if x <= DEADLINE.total_seconds()]
            row.update({
                "judged": len(slow),
                "named_within_10m": len(in_time),
                "detection_rate": round(len(in_time) / len(slow), 4) if slow else None,
                "ttd_median_s": round(statistics.median(ttd), 1) if ttd else None,
                "ttd_p95_s": round(sorted(ttd)[max(0, int(0.95 * len(ttd)) - 1)], 1) if ttd else None,
                "ttd_max_s": round(max(ttd), 1) if ttd else None,
                "missed": [f"{o.drawn.name} ({o.drawn.workers} ranks, {o.drawn.every:g}s steps, "
                           f"{o.drawn.slower:.0%} slower)" for o in slow if not _in_time(o)],
            })
        out["classes"][cls] = row
    return out


def markdown(rep: dict[str, Any]) -> str:
    """docs/straggler_accuracy.md: the figures per class, as the harness measured them."""
    lines = [
        "# Straggler accuracy against ground truth",
        "",
        f"Generated by `bench/straggler_accuracy.py --runs {rep['runs']} --seed {rep['seed']} --minutes "
        f"{rep['minutes']:g} --out docs/straggler_accuracy.md` ({rep['wall_seconds'] / 60:.0f} min on this machine); "
        "do not edit by hand. How it plays and judges the runs: the module's docstring. Goal (issue 28): at least "
        "95 % of stragglers 10 % slower or more named within 10 minutes, under 1 % false suspects on healthy runs.",
        "",
        "| class | runs | judged | named within 10 min | detection | time to detection: median / p95 / max | "
        "wrong-suspect evaluations | runs with a wrong suspect |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cls, r in rep["classes"].items():
        wrong = f"{r['wrong_suspect_evaluations']} of {r['evaluations']}" + (
            f" ({100 * r['wrong_suspect_rate']:.2f} %)" if r["wrong_suspect_rate"] is not None else "")
        if cls.startswith("healthy"):
            lines.append(f"| {cls} | {r['runs']} | — | — | — | — | {wrong} | {r['runs_with_a_wrong_suspect']} |")
            continue
        rate = f"{100 * r['detection_rate']:.1f} %" if r["detection_rate"] is not None else "—"
        ttd = " / ".join("—" if r[k] is None else f"{r[k]:.0f} s" for k in ("ttd_median_s", "ttd_p95_s", "ttd_max_s"))
        lines.append(f"| {cls} | {r['runs']} | {r['judged']} | {r['named_within_10m']} | {rate} | {ttd} | {wrong} | "
                     f"{r['runs_with_a_wrong_suspect']} |")
    lines += ["", "`judged`: runs whose play went on for 10 minutes after their first slow stretch began. A wrong "
              "suspect is a named pod other than the straggler (any pod on a healthy run), counted per evaluation "
              "(every 30 s, once 5 minutes of training are in view). `straggler-mild` (5–10 % slower) is below the "
              "goal's 10 % and reported apart. `gpu-throttle` is detected only when the throttling GPU itself is "
              "named (its UUID and node, basis `gpu-spread`); naming its pod from the logs alone is not counted; "
              "another GPU named is a wrong suspect.", ""]
    lines += ["Energy per step (`taugrid_run_energy_joules_per_step`) against the simulator's own joules per step "
              "over the same 5 minutes:", "", "| class | evaluations with it known | error: median / p95 |",
              "| --- | --- | --- |"]
    for cls, r in rep["classes"].items():
        known = "—" if r.get("energy_known_rate") is None else f"{100 * r['energy_known_rate']:.1f} %"
        err = "—" if r.get("energy_error_median") is None else \
            f"{100 * r['energy_error_median']:.1f} % / {100 * r['energy_error_p95']:.1f} %"
        lines.append(f"| {cls} | {known} | {err} |")
    lines.append("")
    missed = [(cls, m) for cls, r in rep["classes"].items() for m in r.get("missed", [])]
    lines += ["Missed within 10 minutes:", ""] + ([f"- {cls}: {m}" for cls, m in missed] or ["None."])
    wrongs = [(cls, m) for cls, r in rep["classes"].items() for m in r.get("wrong", [])]
    lines += ["", "Runs with a wrong suspect (the first naming):", ""] + (
        [f"- {cls}: {m}" for cls, m in wrongs] or ["None."])
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=30.0, help="training minutes played per run")
    ap.add_argument("--classes", default=",".join(CLASSES), help="comma-separated classes to draw from")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--out", type=Path, help="write them as markdown here (docs/straggler_accuracy.md)")
    ap.add_argument("--judge-every", type=int, default=1, help="judge on every Nth read of the agents and logs "
                    f"(every {EVERY_S:.0f} s): a deferred progressing run's cadence")
    a = ap.parse_args()
    t0 = time.monotonic()
    classes = tuple(c for c in a.classes.split(",") if c)
    if not classes or any(c not in CLASSES for c in classes):
        ap.error(f"--classes: choose from {', '.join(CLASSES)}")
    outcomes = play(a.runs, a.seed, a.minutes, classes, a.judge_every)
    rep = report(outcomes, a.seed, a.minutes, time.monotonic() - t0)
    text = json.dumps(rep, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")
    if a.out:
        a.out.write_text(markdown(rep))


if __name__ == "__main__":
    main()
