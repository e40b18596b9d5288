"""Random draws for the accuracy search: one run each, its dimensions combined at random.

A draw is reproducible from (seed, index) alone. Its dimensions: the root kind; the restart mode
(none, in place, pod replacement, in process, whole-run resubmit) or the other thing that happens to
the run (it stalls, pauses, loses a node); the cadence (jitter, checkpoint pauses); a sidecar that
prints; clock perturbations (a skewed node clock, forged trainer times); the evidence removed or
degraded in the user's dump; the procedure steps the user skipped; and the judging instant, drawn
relative to the moment that matters (just inside and just outside the stall window's edge, during a
replay, around a node's loss). Scenario-level dimensions (a future TauCluster stamp, procedure steps
skipped for the whole dump) come from the draw's scenario, (seed, index // per_scenario).

Each draw plays on GPU nodes of its own (`g<index>-<k>`), so what is done to one draw's nodes and
files touches no other draw. Many draws share one simulator: each run's timeline is shifted so that
the common judging instant falls where that draw wants it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from kubesim.scenario import Scenario, scenario_from_dict
from kubesim.truth import Tolerance

START = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)
NAMESPACES = ("research", "team-b", "team-c")
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
FATES = ("steady", "stall", "pause", "restart", "resubmit", "node-down")
RESTARTS = ("none", "inplace", "replace", "inprocess", "resubmit")
GLOBAL_SKIPS = ("crds", "cluster", "leases")
POD_SKIPS = ("current-logs", "previous-logs")
DEGRADES = ("no-previous", "no-node", "no-events", "no-banners", "no-kubelet-timestamps", "missing-rank-log")


# Dimensions with a plain "off" value.
_ZERO: dict[str, Any] = {"jitter": 0.0, "ckpt_every": 0, "sidecar": "", "skew": 0.0, "forge": "", "stamp_prefix": False,
                         "lag": 0, "then_stall": None}


@dataclass(frozen=True, slots=True)
class Draw:
    seed: int
    index: int
    scenario: int
    kind: str
    tau_run: bool
    workers: int
    namespace: str
    style: str
    every: float
    printers: str  # workers | head
    submitter: bool
    fate: str
    restart: str  # none | inplace | replace | inprocess | resubmit
    rewind: int
    start_after: float  # replacement pods (or an in-place back-off) run this long after the failure
    resume_after: float  # then the checkpoint load before the first step
    then_stall: float | None  # after the key event, the run stalls this long after it (None: it does not)
    pause_for: float  # fate pause: how long
    warm: float  # training before the key event
    offset: float  # the judging instant, seconds after the key event
    jitter: float
    ckpt_every: int  # periodic checkpoint pauses every N steps (0: none)
    ckpt_for: float
    sidecar: str
    skew: float  # the draw's nodes' clock skew (s)
    forge: str  # the trainer prints forged times: "" | "+3m" | "+6h" | "9999"
    stamp_prefix: bool  # the trainer prefixes its lines with its own RFC 3339 time
    grace: int
    exit_after: float
    lag: int
    resubmit_after: float
    resubmit_from: int  # the new run starts from this checkpoint step (0: from scratch)
    degrade: frozenset[str] = field(default_factory=frozenset)
    pod_skip: frozenset[str] = field(default_factory=frozenset)
    global_skip: frozenset[str] = field(default_factory=frozenset)
    future_taucluster: bool = False
    file_times: str = ""  # "" | copied | behind (FILE_TIMES)

    @property
    def name(self) -> str:
        return f"r{self.index:05d}"

    @property
    def style_numbers_steps(self) -> bool:
        """Whether its trainer's lines carry a step number (Hugging Face loss dicts do not)."""
        return self.style != "hf"

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(f"g{self.index:05d}-{k}" for k in range(self.workers))

    def dims(self) -> dict[str, str]:
        """The draw's non-default dimensions (what shrinking removes), as short texts."""
        out: dict[str, str] = {}
        if self.restart != "none":
            out["restart"] = self.restart
        for k in _ZERO:
            v = getattr(self, k)
            if v:
                out[k] = str(v)
        if self.grace != 30 or self.exit_after != 3.0:
            out["grace"] = f"{self.grace}s, exits after {self.exit_after:.0f}s"
        for d in sorted(self.degrade):
            out[d] = "yes"
        for s in sorted(self.pod_skip | self.global_skip):
            out[f"skip {s}"] = "yes"
        if self.future_taucluster:
            out["future_taucluster"] = "yes"
        if self.file_times:
            out["file_times"] = self.file_times
        return out

    def without(self, dim: str) -> Draw:
        """This draw with one dimension (a key of `dims()`) back at its default."""
        if dim == "restart":
            return replace(self, restart="none", fate="steady" if self.fate in ("restart", "resubmit") else self.fate)
        if dim == "grace":
            return replace(self, grace=30, exit_after=3.0)
        if dim == "future_taucluster":
            return replace(self, future_taucluster=False)
        if dim == "file_times":
            return replace(self, file_times="")
        if dim in DEGRADES:
            return replace(self, degrade=self.degrade - {dim})
        if dim.startswith("skip "):
            s = dim[5:]
            return replace(self, pod_skip=self.pod_skip - {s}, global_skip=self.global_skip - {s})
        if dim in _ZERO:
            return replace(self, **{dim: _ZERO[dim]})
        raise KeyError(dim)

    def keep_only(self, keep: set[str]) -> Draw:
        d = self
        for dim in list(self.dims()):
            if dim not in keep:
                d = d.without(dim)
        return d


def _edge_offset(rng: random.Random, edge: float, every: float) -> float:
    """Seconds after the last step: before the 1.5-interval truth line, inside the tolerance, at its
    edge (just inside, just outside), past it, far past it."""
    u = rng.random()
    if u < 0.12:
        return rng.uniform(0.0, 1.3 * every)
    if u < 0.32:
        return rng.uniform(1.6 * every, max(1.7 * every, edge - 4.0))
    if u < 0.62:
        return edge + rng.uniform(-4.0, 8.0)
    if u < 0.85:
        return edge + rng.uniform(8.0, 150.0)
    return edge + rng.uniform(150.0, 1500.0)


FILE_TIMES = {"copied": 2 * 86400.0, "behind": -3600.0}  # the dump's file times off the capture instant


def scenario_dims(seed: int, scenario: int) -> tuple[frozenset[str], bool, str]:
    """Procedure steps the whole dump skips, whether TauCluster stamps come from the future, and the
    dump's file times ("": the capture instant; copied: two days later, as `cp` leaves them; behind:
    an hour early, from a workstation whose clock is off)."""
    rng = random.Random(f"{seed}/scenario/{scenario}")
    skip = frozenset(s for s, p in (("crds", 0.15), ("cluster", 0.15), ("leases", 0.3)) if rng.random() < p)
    future = rng.random() < 0.15
    u = rng.random()
    return skip, future, "copied" if u < 0.1 else "behind" if u < 0.15 else ""


def draw(seed: int, index: int, per_scenario: int, tol: Tolerance) -> Draw:
    rng = random.Random(f"{seed}/{index}")
    kind = rng.choices(("RayJob", "Job", "JobSet", "PyTorchJob"), (40, 25, 15, 20))[0]
    workers = rng.choice((1, 2, 2, 4))
    style = rng.choices(("megatron", "deepspeed", "lightning", "hf"), (50, 20, 20, 10))[0]
    every = float(rng.choice((5, 10, 10, 15, 20, 30, 60)))
    edge = tol.progress_edge(every)
    fate = rng.choices(FATES, (22, 20, 10, 28, 10, 10))[0]
    restart = "none"
    if fate == "restart":
        restart = rng.choice(("inplace", "replace", "inprocess"))
    elif fate == "resubmit":
        restart = "resubmit"
    start_after = {"inplace": 10.0, "replace": rng.uniform(15, 40), "inprocess": 0.0}.get(restart, 0.0)
    resume_after = rng.uniform(5, 60) if restart in ("inplace", "replace", "inprocess") else 0.0
    rewind = rng.choice((rng.randrange(2, 6), rng.randrange(10, 60), rng.randrange(100, 300)))
    rewind = max(2, min(rewind, int(1800 / every)))  # a replay of at most half an hour
    grace = rng.choices((30, 120, 600, 3600), (55, 20, 15, 10))[0]
    exit_after = rng.choice((2.0, 10.0, float(grace)))
    if kind == "PyTorchJob" and restart == "resubmit":
        exit_after = min(exit_after, 30.0)  # the same pod names wait for the old pods to go
    resubmit_after = rng.uniform(3, 30) + (exit_after + 2 if kind == "PyTorchJob" else 0)
    then_stall: float | None = None
    pause_for = 0.0
    warm = rng.uniform(max(180.0, 12 * every), 900.0)
    startup = 0.0
    if fate == "steady":
        offset = rng.uniform(0, 600)
    elif fate == "stall":
        offset = _edge_offset(rng, edge, every)
    elif fate == "pause":
        offset = _edge_offset(rng, edge, every)
        if rng.random() < 0.7 or offset < 4 * every:
            pause_for = offset + rng.uniform(5, 600)
        else:
            pause_for = rng.uniform(every, offset - 2 * every)
    elif fate == "restart":
        delay = start_after + resume_after
        replay = rewind * every
        u = rng.random()
        if u < 0.3:
            offset = rng.uniform(0, delay + max(replay - every, 1.0))
        elif u < 0.45:
            offset = delay + replay + rng.uniform(-every, 2 * every)
        elif u < 0.7:
            offset = delay + replay + rng.uniform(2 * every, 900)
        else:
            then_stall = delay + rng.uniform(0.2, 0.9) * replay + every
            offset = then_stall + _edge_offset(rng, edge, every)
    elif fate == "resubmit":
        startup = resubmit_after + rng.uniform(20, 40)
        u = rng.random()
        if u < 0.3:
            offset = rng.uniform(0, startup + 5)
        elif u < 0.7:
            offset = startup + 5 + rng.uniform(0, 600)
        else:
            then_stall = startup + 5 + rng.uniform(60, 300)
            offset = then_stall + _edge_offset(rng, edge, every)
    else:  # node-down
        ne = tol.node_edge()
        u = rng.random()
        offset = (rng.uniform(0, 45) if u < 0.3 else rng.uniform(45, ne) if u < 0.5 else
                  ne + rng.uniform(0.5, 10) if u < 0.7 else rng.uniform(ne + 10, 900))
    forge = ""
    if style in ("megatron", "deepspeed") and rng.random() < 0.12:
        forge = rng.choice(("+3m", "+6h", "9999"))
    skew = 0.0
    if rng.random() < 0.18:
        skew = rng.choice((-600.0, -90.0, -20.0, 20.0, 90.0, 240.0, 7200.0))
    global_skip, future, file_times = scenario_dims(seed, index // per_scenario)
    degrade = frozenset(d for d in DEGRADES if rng.random() < 0.12)
    pod_skip = frozenset(s for s in POD_SKIPS if rng.random() < 0.15)
    lag = rng.randrange(1, 6) if workers > 1 and rng.random() < 0.15 else 0
    printers = "workers" if lag or rng.random() < 0.75 else "head"
    ckpt_every = rng.randrange(10, 60) if rng.random() < 0.25 else 0
    return Draw(
        seed=seed, index=index, scenario=index // per_scenario, kind=kind,
        tau_run=kind == "RayJob" and rng.random() < 0.8, workers=workers, namespace=rng.choice(NAMESPACES),
        style=style, every=every, printers=printers, submitter=kind == "RayJob" and rng.random() < 0.5,
        fate=fate, restart=restart, rewind=rewind, start_after=start_after, resume_after=resume_after,
        then_stall=then_stall, pause_for=pause_for, warm=warm, offset=offset,
        jitter=round(rng.uniform(0.05, 0.35), 2) if rng.random() < 0.4 else 0.0,
        ckpt_every=ckpt_every, ckpt_for=rng.uniform(30, 240),
        sidecar=rng.choice(("shipper", "exporter")) if rng.random() < 0.3 else "",
        skew=skew, forge=forge, stamp_prefix=rng.random() < 0.15, grace=grace, exit_after=exit_after, lag=lag,
        resubmit_after=resubmit_after, resubmit_from=rng.choice((0, rng.randrange(100, 2000))),
        degrade=degrade, pod_skip=pod_skip, global_skip=global_skip, future_taucluster=future,
        file_times=file_times,
    )


def _dur(seconds: float) -> str:
    return f"{max(seconds, 0.0):.3f}s"


def _bring_up(d: Draw, t: float, pull: float) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"at": _dur(t), "admit": {}},
        {"at": _dur(t + 2), "schedule": {"pods": "workers", "nodes": list(d.nodes)}},
        {"at": _dur(t + 2), "schedule": {}},
        {"at": _dur(t + 3), "pull": {}},
        {"at": _dur(t + pull), "start": {"pullSeconds": round(pull - 4, 1)}},
    ]
    if d.submitter:
        steps.append({"at": _dur(t + pull + 1), "submitter": {}})
    return steps


def key_time(d: Draw) -> float:
    """Seconds from submission to the key event (the stall, the restart, the loss...)."""
    return 2 + 30 + 5 + d.warm


def judge_time(d: Draw) -> float:
    """Seconds from submission to the judging instant."""
    return key_time(d) + d.offset


def run_doc(d: Draw, at: float) -> dict[str, Any]:
    """The draw's run as a scenario entry, submitted at `at` scenario seconds."""
    train: dict[str, Any] = {"every": f"{d.every:g}s", "iterations": 250_000, "style": d.style,
                             "pods": d.printers, "startIteration": 1000 + d.index % 4000}
    if d.jitter:
        train["jitter"] = d.jitter
    if d.ckpt_every:
        train["pauseEvery"] = d.ckpt_every
        train["pauseFor"] = _dur(d.ckpt_for)
    if d.forge:
        train["forgeTime"] = d.forge
    if d.stamp_prefix:
        train["stampPrefix"] = True
    if d.lag:
        train["lagRanks"] = d.lag
    steps = _bring_up(d, 0.0, 30.0)
    k = key_time(d)
    steps.append({"at": _dur(37), "train": train})
    if d.fate == "stall":
        steps.append({"at": _dur(k), "stall": {}})
    elif d.fate == "pause":
        steps.append({"at": _dur(k), "pause": {"for": _dur(d.pause_for)}})
    elif d.fate == "node-down":
        steps.append({"at": _dur(k), "nodeLoss": {"node": d.nodes[0]}})
    elif d.restart in ("inplace", "replace", "inprocess"):
        steps.append({"at": _dur(k), "restart": {"mode": d.restart, "rewind": d.rewind,
                                                 "startAfter": _dur(d.start_after),
                                                 "resumeAfter": _dur(d.resume_after)}})
    elif d.restart == "resubmit":
        steps.append({"at": _dur(k), "resubmit": {}})
        steps += _bring_up(d, k + d.resubmit_after, 25.0)
        again = {**train, "startIteration": d.resubmit_from}
        steps.append({"at": _dur(k + d.resubmit_after + 30.0), "train": again})
    if d.then_stall is not None:
        steps.append({"at": _dur(k + d.then_stall), "stall": {}})
    doc: dict[str, Any] = {
        "name": d.name, "namespace": d.namespace, "kind": d.kind, "tauRun": d.tau_run,
        "profile": f"a100-{d.workers}x8", "image": IMAGE, "at": _dur(at), "timeline": steps,
        "terminationGracePeriodSeconds": d.grace, "exitAfter": _dur(d.exit_after),
    }
    if d.kind == "Job":
        doc["queue"] = "a100"
    if d.sidecar:
        doc["sidecar"] = d.sidecar
    if d.kind == "RayJob" and d.restart == "replace":
        doc["restartPolicy"] = "Never"  # KubeRay recreates failed Ray pods that do not restart in place
    return doc


def scenario_of(draws: list[Draw], seed: int, name: str) -> tuple[Scenario, float]:
    """One scenario playing every draw, and the common judging instant (scenario seconds)."""
    t_judge = max(judge_time(d) for d in draws) + 5.0
    future = any(d.future_taucluster for d in draws)
    nodes: list[dict[str, Any]] = [{"name": "aks-system-0", "pool": "system", "cpu": "64", "memory": "256Gi"}]
    for d in draws:
        for n in d.nodes:
            node: dict[str, Any] = {"name": n, "pool": "gpua100", "gpus": 8, "gpuProduct": "NVIDIA-A100-SXM4-80GB",
                                    "instanceType": "Standard_ND96amsr_A100_v4", "cpu": "96", "memory": "1800Gi"}
            if d.skew:
                node["clockSkew"] = f"{'-' if d.skew < 0 else ''}{abs(d.skew):g}s"
            nodes.append(node)
    gpus = 8 * sum(d.workers for d in draws)
    doc = {
        "name": name,
        "seed": seed,
        "start": START.isoformat().replace("+00:00", "Z"),
        "cluster": {
            "namespaces": list(NAMESPACES),
            "nodes": nodes,
            "flavors": ["a100"],
            "clusterQueues": [{"name": "gpu-a100", "flavor": "a100", "gpus": 2 * gpus + 64, "cohort": "taugrid"}],
            "localQueues": [{"name": "a100", "namespace": ns, "clusterQueue": "gpu-a100"} for ns in NAMESPACES],
            "profiles": [{"name": f"a100-{w}x8", "localQueue": "a100", "clusterQueue": "gpu-a100", "flavors": ["a100"],
                          "priorityClass": "training-normal", "workers": w, "gpusPerWorker": 8} for w in (1, 2, 4)],
            "tauClusterRefresh": "5m",
            "kubeletHeartbeats": True,
            **({"tauClusterFuture": "8760h"} if future else {}),
        },
        "runs": [run_doc(d, t_judge - judge_time(d)) for d in draws],
    }
    return scenario_from_dict(doc, f"<search {name}>"), t_judge
