"""Straggler accuracy against the simulator's truth: detection rate, time to detection, false suspects.

A seeded generator draws multi-pod training runs (4 or 8 ranks in lockstep, steps of 5–20 s, every
rank's compute jittering by 1–5 % per step, 1–10 % on healthy runs) of five classes:

  healthy                 no rank slower: natural jitter only
  healthy-noisy           no rank slower: 10–20 % jitter, and 1–3 % of each rank's steps 30–100 % longer
  straggler               one rank 10–50 % slower from a point on, for good
  straggler-intermittent  one rank 10–50 % slower for 4–8 minutes of every 10–16
  straggler-mild          one rank 5–10 % slower, for good (below the goal's 10 %; reported apart)

The simulator (kubesim, HTTP API on a manual clock) plays them; every 30 s of scenario time the
harness reads each run's pods and their logs through the Kubernetes API as the controller does
(`--timestamps`, the last 500 lines), and judges them with the claim engine (`claims.evaluate`, its
`stragglers`). Truth is the simulator's side channel: which pod straggles, and when.

Figures, per class:
- detection: the straggler's pod named within DEADLINE of its first slow stretch beginning;
- time to detection: from that instant to the first evaluation naming it (median, p95, max);
- wrong suspects: evaluations naming any other pod (any pod at all on healthy runs), over evaluations
  made once at least 5 minutes of training are in view; and runs with any.

Usage: .venv/bin/python bench/straggler_accuracy.py [--runs 40] [--seed 1] [--minutes 30] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
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

from collector.claims import evaluate  # noqa: E402
from collector.correlate import Signal, build_index  # noqa: E402
from collector.kube import normalize  # noqa: E402
from collector.model import PodFacts, Ref  # noqa: E402
from collector.progress import scan_text  # noqa: E402
from collector.settings import ClaimSettings  # noqa: E402
from collector.sources.kube_api import KubeApi, api_client_for  # noqa: E402
from kubesim.clock import ManualClock  # noqa: E402
from kubesim.engine import ScenarioEngine  # noqa: E402
from kubesim.scenario import scenario_from_dict  # noqa: E402
from kubesim.server import Simulator, SimulatorSettings  # noqa: E402

CLASSES = ("healthy", "healthy-noisy", "straggler", "straggler-intermittent", "straggler-mild")
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


@dataclass
class Outcome:
    drawn: Drawn
    first_slow: float | None = None  # scenario seconds
    named_at: float | None = None
    evaluations: int = 0
    wrong: int = 0  # evaluations (after warm-up) naming another pod, or anyone on a healthy run
    wrong_pods: set[str] = field(default_factory=set)
    first_wrong: str = ""  # the first wrong naming's reason


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
                                 "jitter": 0.02}
        if cls == "healthy-noisy":
            train.update({"rankJitter": round(rng.uniform(0.10, 0.20), 3),
                          "hiccups": round(rng.uniform(0.01, 0.03), 3)})
        if not cls.startswith("healthy"):
            d.straggler = rng.randrange(workers)
            d.slower = rng.uniform(0.05, 0.10) if cls == "straggler-mild" else rng.uniform(0.10, 0.50)
            d.slow_from = rng.uniform(3, 12) * 60
            train.update({"straggler": d.straggler, "slower": round(d.slower, 3), "slowFrom": f"{d.slow_from:.0f}s"})
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


def _judge(api: KubeApi, drawn: list[Drawn], now: datetime,
           s: ClaimSettings) -> dict[str, tuple[tuple[str, ...], str]]:
    """Each run's named straggler pods at `now`, read through the API as the controller reads."""
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
    out = {}
    for d in drawn:
        rc = evaluate(index.evidence(Ref("Job", NS, d.name)), now, s)
        st = rc.stragglers
        out[d.name] = (tuple(x.pod for x in st.suspects), st.reason) if st else ((), "")
    return out


def play(runs: int, seed: int, minutes: float, classes: tuple[str, ...] = CLASSES) -> list[Outcome]:
    doc, drawn = draw(seed, runs, minutes, classes)
    scenario = scenario_from_dict(doc, f"<stragglers seed={seed}>")
    clock = ManualClock(scenario.start)
    s = ClaimSettings()
    outcomes = {d.name: Outcome(d) for d in drawn}
    with Simulator(clock=clock, settings=SimulatorSettings(seed=seed)) as sim:
        url = sim.start()
        engine = ScenarioEngine(scenario, url, clock=clock)
        api = KubeApi(api_client_for(url))
        try:
            t = 0.0
            end = TRAIN_AT + 60 * minutes
            while t < end:
                t = min(t + EVERY_S, end)
                engine.step_to(t)
                engine.client.flush()
                if engine.errors:
                    raise RuntimeError(f"scenario errors: {engine.errors[:5]}")
                now = clock.now()
                named = _judge(api, drawn, now, s)
                for d in drawn:
                    o = outcomes[d.name]
                    st = engine.runs[(NS, d.name)]
                    if st.straggling and o.first_slow is None:
                        first = st.straggling[0][0]
                        o.first_slow = first if isinstance(first, float) else None
                    truth = st.straggler_pod
                    pods, why = named[d.name]
                    if o.first_slow is not None and o.named_at is None and truth in pods:
                        o.named_at = t
                    if t - TRAIN_AT >= WARMUP.total_seconds():
                        o.evaluations += 1
                        wrong = [p for p in pods if d.cls.startswith("healthy") or p != truth]
                        if wrong:
                            o.wrong += 1
                            o.wrong_pods.update(wrong)
                            o.first_wrong = o.first_wrong or f"at {t:.0f} s: {why}"
        finally:
            engine.client.close()
    return list(outcomes.values())


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
              "goal's 10 % and reported apart.", ""]
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
    a = ap.parse_args()
    t0 = time.monotonic()
    classes = tuple(c for c in a.classes.split(",") if c)
    if not classes or any(c not in CLASSES for c in classes):
        ap.error(f"--classes: choose from {', '.join(CLASSES)}")
    outcomes = play(a.runs, a.seed, a.minutes, classes)
    rep = report(outcomes, a.seed, a.minutes, time.monotonic() - t0)
    text = json.dumps(rep, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")
    if a.out:
        a.out.write_text(markdown(rep))


if __name__ == "__main__":
    main()
