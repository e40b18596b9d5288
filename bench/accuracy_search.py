"""A seeded randomized search for fail-open claims, against the simulator's ground truth.

Each draw is one run whose dimensions are combined at random (`accuracy_draws.py`): restart mode,
evidence removed or degraded, clock perturbations, cadence and pauses, sidecars, and the judging
instant (drawn anywhere, on purpose just inside and just outside the stall window's edge, during
replays, around a node's loss). Draws are played many to a simulator (each run's timeline shifted so
the common judging instant falls where that draw wants it) and judged, run by run, from:

- controller: the live controller started at the judging instant (official client, API clock);
- bare: `explain --from-dump` on `kubectl cluster-info dump` exactly as kubectl writes it;
- full: `explain --from-dump` on the README's fuller procedure (`accuracy_dumps.PROCEDURE`);
- user: the same with some steps skipped and the draw's evidence degraded file by file.

Never `--at`: a dump is judged at the time `explain` finds in it. Per claim and source it counts what
must be zero (a false `true` or `verified`; `true` where the evidence it needs is absent from that
source; a wrong owner of a wait) and `unknown` where the truth is known (coverage), with a floor:
at least 90% of healthy runs verified by the controller and in full-procedure dumps. Each kind of
failure is shrunk to a minimal draw (dimensions removed one at a time while it still fails) and
printed with the command that replays it.

Usage: .venv/bin/python bench/accuracy_search.py [--draws 5000] [--seed 1] [--per-scenario 100]
           [--out docs/accuracy-search.md] [--draw N [--keep dim,dim]] [--shrink 8]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from accuracy import LiveController, classes_report, explain_claims  # noqa: E402
from accuracy import summary as accuracy_summary  # noqa: E402
from accuracy_draws import FILE_TIMES, Draw, draw, scenario_of  # noqa: E402
from accuracy_dumps import (  # noqa: E402
    CURRENT_SUFFIX,
    PREVIOUS_SUFFIX,
    PROCEDURE,
    Degradation,
    Kubectl,
    bare,
    degrade,
    procedure,
)

from collector.settings import ClaimSettings  # noqa: E402
from kubesim.clock import ManualClock  # noqa: E402
from kubesim.engine import ScenarioEngine  # noqa: E402
from kubesim.generate import CLASSES as CLASS_NAMES  # noqa: E402
from kubesim.server import Simulator, SimulatorSettings  # noqa: E402
from kubesim.truth import RunTruth, Tolerance  # noqa: E402

CLAIMS = ("scheduled", "running", "progressing")
SOURCES = ("controller", "bare", "full", "user")
FLOOR_SOURCES = ("controller", "full")
FLOOR = 0.90
RESTART_WINDOW = ClaimSettings().restart_window.total_seconds()
ERRORS = ("false-verified", "false-true", "true-without-evidence", "wrong-owner")
STALL_EXAMPLES = 8  # false stalls shown in the report
PROCEDURE_LINES = [PROCEDURE[k] for k in PROCEDURE]
_STAMP = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z ", re.M)


def tolerance(settings: ClaimSettings | None = None) -> Tolerance:
    """The detection latency the collector is allowed, from its own ClaimSettings (the ceiling
    multiplier and the window's cap with defaults for settings that do not have them yet)."""
    c = settings or ClaimSettings()
    wmax = getattr(c, "stall_window_max", None)
    return Tolerance(
        stall_floor=c.stall_floor.total_seconds(),
        stall_ceiling_multiplier=float(getattr(c, "stall_ceiling_multiplier", 10.0)),
        stall_window_max=wmax.total_seconds() if wmax is not None else 1800.0,
        scrape_interval=c.scrape_interval.total_seconds(),
    )


# ----------------------------------------------------------------------------- evidence per source
@dataclass(frozen=True, slots=True)
class Evidence:
    """What a source holds of a draw's evidence (read from its files, not from the collector)."""

    node_seen: bool = True  # the Node of every pod doing the run's work is in it
    times: bool = True  # its step lines carry trustworthy times (kubelet stamps, or the trainer's own)
    mark_seen: bool = True  # after a restart: a log holding the pre-restart high-water mark is in it
    # its step lines' only times are the trainer's own, and the trainer forges them: no collector can
    # tell a stall from progress by them (a forgery as large as the stall's age hides it exactly)
    forged_only: bool = False

    def healthy(self) -> bool:
        return self.node_seen and self.times and self.mark_seen


def _pods_by_uid(dump: Path) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for f in dump.glob("*/pods.json"):
        for p in json.loads(f.read_text()).get("items") or []:
            m = p["metadata"]
            out[m["uid"]] = (m["namespace"], m["name"])
    return out


def _nodes_in(dump: Path) -> set[str]:
    f = dump / "nodes.json"
    return {n["metadata"]["name"] for n in json.loads(f.read_text()).get("items") or []} if f.is_file() else set()


def dump_evidence(dump: Path, d: Draw, t: RunTruth, uids: dict[str, tuple[str, str]], nodes: set[str]) -> Evidence:
    node_seen = all(node in nodes for _, _, node in t.pods if node)
    own = d.style in ("megatron", "deepspeed") or d.stamp_prefix
    stamps = False
    for uid in t.printers:
        where = uids.get(uid)
        if where is None:
            continue
        pod = dump / where[0] / where[1]
        for f in pod.glob(f"*{CURRENT_SUFFIX}"):
            if _STAMP.search(f.read_bytes()[:4096]):
                stamps = True
    times = stamps or (own and not d.forge)
    forged_only = own and bool(d.forge) and not stamps
    mark_seen = True
    if t.restarts and not d.style_numbers_steps:
        mark_seen = False  # its lines carry no step number: no log shows the mark
    elif t.restarts:
        last = t.restarts[-1]
        mark_seen = False
        for _, uid, container, which in last.holders:
            where = uids.get(uid)
            if where is None:
                continue
            base = dump / where[0] / where[1]
            files = ([base / f"{container}{PREVIOUS_SUFFIX}"] if which == "previous"
                     else [base / "logs.txt", base / f"{container}{CURRENT_SUFFIX}"])
            if any(f.is_file() and f.stat().st_size for f in files):
                mark_seen = True
    return Evidence(node_seen, times, mark_seen, forged_only)


def live_evidence(d: Draw, t: RunTruth, alive_uids: set[str]) -> Evidence:
    """The API at the judging instant: every Node, logs with timestamps, previous logs of live pods."""
    mark_seen = True
    if t.restarts and not d.style_numbers_steps:
        mark_seen = False
    elif t.restarts:
        mark_seen = any(uid in alive_uids for _, uid, _, _ in t.restarts[-1].holders)
    return Evidence(True, True, mark_seen)


# ----------------------------------------------------------------------------- judging
@dataclass(frozen=True, slots=True)
class Failure:
    kind: str  # one of ERRORS
    source: str
    claim: str  # scheduled | running | progressing | blocked
    draw: int
    expected: str
    got: str
    reason: str
    facts: str


@dataclass
class SearchReport:
    seed: int
    draws: int
    per_scenario: int
    tol: Tolerance
    timings: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    # (source, claim, truth, observed) → count; truth "true" | "false" | "false-in-tolerance"
    observed: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    stages: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    errors: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (kind, source, claim)
    failures: list[Failure] = field(default_factory=list)
    # source → [healthy runs, verified per claim..., all three]
    floor: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    dims: Counter[str] = field(default_factory=Counter)  # how often each dimension was drawn
    missing: Counter[str] = field(default_factory=Counter)  # source → runs it did not report
    ghosts: Counter[str] = field(default_factory=Counter)  # source → runs reported that are no current run
    # source → progressing `true` judged undecidable: a forged trainer clock is the only time on the lines
    undecidable: Counter[str] = field(default_factory=Counter)
    shrunk: list[tuple[Failure, Draw, dict[str, str], bool]] = field(default_factory=list)
    # source → progressing judged STALLED while the run was running and advancing (a false page)
    false_stalls: Counter[str] = field(default_factory=Counter)
    stall_examples: list[Failure] = field(default_factory=list)  # the first few, for the report
    floor_misses: list[tuple[str, int, str, str]] = field(default_factory=list)  # healthy runs not verified

    def error_count(self) -> int:
        return sum(self.errors.values())

    def floor_ok(self) -> bool:
        return all(self.floor_rate(s) >= FLOOR for s in FLOOR_SOURCES if self.floor[s]["healthy"])

    def floor_rate(self, source: str, what: str = "all") -> float:
        c = self.floor[source]
        return c[what] / c["healthy"] if c["healthy"] else 1.0


def _facts(d: Draw, t: RunTruth) -> str:
    parts = [f"{d.kind} {d.workers}w {d.style} every {d.every:g}s fate {d.fate}"]
    if t.since_advance is not None:
        parts.append(f"last valid advance {t.since_advance:.0f}s ago (edge {tolerance().progress_edge(t.every):.0f}s)")
    if t.down_for is not None:
        parts.append(f"node down {t.down_for:.0f}s")
    if t.restarts:
        r = t.restarts[-1]
        parts.append(f"{r.mode} restart {r.ago:.0f}s ago at mark {r.mark}")
    if t.generation:
        parts.append(f"resubmitted (generation {t.generation})")
    dims = d.dims()
    if dims:
        parts.append("; ".join(f"{k}={v}" for k, v in dims.items()))
    return ", ".join(parts)


def judge(rep: SearchReport, d: Draw, t: RunTruth, source: str, run: dict[str, Any] | None,
          ev: Evidence) -> list[Failure]:
    found: list[Failure] = []
    if run is None:
        rep.missing[source] += 1
        for claim in CLAIMS:
            rep.observed[(source, claim, "true" if getattr(t, claim) else "false", "missing")] += 1
        return found
    tol = rep.tol
    evidence_for = {"scheduled": True, "running": ev.node_seen,
                    "progressing": ev.times and ev.mark_seen}
    for claim in CLAIMS:
        c = run["claims"][claim]
        obs, verdict, reason = c["observed"], c["verdict"], c.get("reason", "")
        want: bool = getattr(t, claim)
        label = "true" if want else ("false-in-tolerance" if t.in_tolerance(claim, tol) else "false")
        rep.observed[(source, claim, label, obs)] += 1
        kind = ""
        if obs == "true" and claim == "progressing" and ev.forged_only:
            rep.undecidable[source] += 1
        elif obs == "true" and t.true_is_error(claim, tol):
            kind = "false-verified" if verdict == "verified" else "false-true"
        elif obs == "true" and not evidence_for[claim]:
            kind = "true-without-evidence"
        if claim == "progressing" and obs == "false" and reason.startswith("STALLED") and want and t.running:
            # not an error of the fail-closed kind (no false true), but a false page: counted and shown
            rep.false_stalls[source] += 1
            if len(rep.stall_examples) < STALL_EXAMPLES:
                rep.stall_examples.append(Failure("false-stall", source, claim, d.index, "true", f"false ({verdict})",
                                                  reason, _facts(d, t)))
        if kind:
            f = Failure(kind, source, claim, d.index, "false" if not want else "unknown (evidence absent)",
                        f"{obs} ({verdict})", reason, _facts(d, t))
            rep.errors[(kind, source, claim)] += 1
            found.append(f)
    blocked = run.get("blocked") or None
    got = blocked["stage"] if blocked else None
    rep.stages[(source, t.stage or "none", got or "none")] += 1
    if t.stage and got and got != t.stage:
        why = blocked.get("reason", "") if blocked else ""
        f = Failure("wrong-owner", source, "blocked", d.index, t.stage, got, why, _facts(d, t))
        rep.errors[("wrong-owner", source, "blocked")] += 1
        found.append(f)
    # Healthy: true on all three, the evidence there, no clock perturbation, and no restart within the
    # collector's restart window (DESIGN §3: a container restarting within the window is not running).
    recent = bool(t.restarts) and t.restarts[-1].ago <= RESTART_WINDOW
    if t.scheduled and t.running and t.progressing and ev.healthy() and not d.skew and not d.forge and \
            not (d.future_taucluster and d.tau_run) and not recent:
        fl = rep.floor[source]
        fl["healthy"] += 1
        ok = [run["claims"][c]["verdict"] == "verified" or
              (run["claims"][c]["verdict"] == "unasserted" and run["claims"][c]["observed"] == "true") for c in CLAIMS]
        for c, good in zip(CLAIMS, ok, strict=True):
            fl[c] += int(good)
        fl["all"] += int(all(ok))
        if not all(ok) and source in FLOOR_SOURCES:
            rep.floor_misses.append((source, d.index, "; ".join(
                f"{c} {run['claims'][c]['verdict']}: {run['claims'][c].get('reason', '')}"
                for c, good in zip(CLAIMS, ok, strict=True) if not good), _facts(d, t)))
    rep.failures += found
    return found


# ----------------------------------------------------------------------------- playing
def _set_mtimes(dump: Path, when: float) -> None:
    """Files written at the capture instant, as kubectl's are on a machine whose clock agrees."""
    for top, dirs, names in os.walk(dump):
        for n in [*names, *dirs]:
            os.utime(os.path.join(top, n), (when, when))


def play(draws: list[Draw], workdir: Path, rep: SearchReport, sources: Iterable[str] = SOURCES,
         real_kubectl: bool = False) -> dict[int, list[Failure]]:
    """Play `draws` in one simulator, judge each from every source; returns the failures by draw."""
    wanted = tuple(sources)
    t0 = time.monotonic()
    name = f"search-{draws[0].seed}-{draws[0].scenario}"
    scenario, t_judge = scenario_of(draws, draws[0].seed, name)
    by_name = {(d.namespace, d.name): d for d in draws}
    out: dict[int, list[Failure]] = defaultdict(list)
    clock = ManualClock(scenario.start)
    results: dict[str, dict[str, Any]] = {}
    evidence: dict[str, dict[int, Evidence]] = defaultdict(dict)
    with Simulator(clock=clock, settings=SimulatorSettings(seed=draws[0].seed, bookmark_interval_s=0.5)) as sim:
        url = sim.start()
        engine = ScenarioEngine(scenario, url, clock=clock)
        engine.step_to(t_judge)
        if engine.errors:
            raise RuntimeError(f"scenario errors: {engine.errors[:5]}")
        truth = engine.truth()
        alive = {p["metadata"]["uid"] for p in sim.store.list_page(sim.resource("v1", "Pod"), "").items}
        # Without its RayJob (a bare dump) a Ray run can only be named after its RayCluster.
        aliases = {key: [f"{key[0]}/{key[1]}"] + ([f"{key[0]}/{r.raycluster.name}"] if r.raycluster else [])
                   for key, r in engine.runs.items()}
        rep.timings["simulate"] += time.monotonic() - t0
        if "controller" in wanted:
            t1 = time.monotonic()
            ctl = LiveController(url, clock, 600.0)
            try:
                ctl.open()
                results["controller"] = ctl.settle()
            finally:
                ctl.close()
            for d in draws:
                evidence["controller"][d.index] = live_evidence(d, truth[(d.namespace, d.name)], alive)
            rep.timings["controller"] += time.monotonic() - t1
        dumps = [s for s in wanted if s != "controller"]
        if dumps:
            t1 = time.monotonic()
            kubectl = Kubectl(url, workdir)
            base = bare(kubectl, workdir / "bare")
            at = scenario.start.timestamp() + t_judge if scenario.start else time.time()
            extra = ""  # the draws create no DRA claims, NodeClaims or AdmissionChecks
            paths: dict[str, Path] = {"bare": base}
            if "full" in wanted:
                paths["full"] = procedure(kubectl, base, workdir / "full", extra_kinds=extra, real_kubectl=real_kubectl)
            if "user" in wanted:
                skip = set(draws[0].global_skip)
                owners = [(d.namespace, d.name + "-", d) for d in draws]

                def pod_skip(ns: str, pod: str) -> frozenset[str]:
                    return next((d.pod_skip for n, prefix, d in owners if n == ns and pod.startswith(prefix)),
                                frozenset())
                user = procedure(kubectl, base, workdir / "user", skip, pod_skip, extra, real_kubectl)
                plans = []
                for d in draws:
                    t = truth[(d.namespace, d.name)]
                    printers = [p for p, uid, _ in t.pods if uid in t.printers] or [p for p, _, _ in t.pods]
                    plans += [Degradation(what, d.namespace, d.name, d.nodes, printers[-1] if printers else "")
                              for what in sorted(d.degrade)]
                degrade(user, plans)
                paths["user"] = user
            for src, p in paths.items():
                if src not in wanted:
                    continue
                _set_mtimes(p, at + FILE_TIMES.get(draws[0].file_times, 0.0))
                uids, nodes = _pods_by_uid(p), _nodes_in(p)
                for d in draws:
                    evidence[src][d.index] = dump_evidence(p, d, truth[(d.namespace, d.name)], uids, nodes)
            kubectl.close()
            rep.timings["dump"] += time.monotonic() - t1
            t1 = time.monotonic()
            for src, p in paths.items():
                if src in wanted:
                    results[src], _ = explain_claims(p, None)
            rep.timings["explain"] += time.monotonic() - t1
        engine.client.close()
    claimed: dict[str, set[str | None]] = {src: set() for src in wanted}
    for (ns, nm), d in by_name.items():
        t = truth[(ns, nm)]
        for src in wanted:
            runs = results.get(src, {})
            key = next((k for k in aliases[(ns, nm)] if k in runs), None)
            claimed[src].add(key)
            out[d.index] += judge(rep, d, t, src, runs.get(key) if key else None, evidence[src][d.index])
    for src in wanted:  # runs reported under no current run's name: earlier generations' leftovers
        for key, run in results.get(src, {}).items():
            if key not in claimed[src]:
                rep.ghosts[src] += 1
                if any(c["observed"] == "true" for c in run["claims"].values()):
                    rep.ghosts[f"{src} with a true claim"] += 1
    for d in draws:
        rep.dims[f"fate {d.fate}"] += 1
        rep.dims[f"kind {d.kind}"] += 1
        for dim in d.dims():
            rep.dims[dim if dim != "restart" else f"restart {d.restart}"] += 1
    rep.timings["total"] += time.monotonic() - t0
    return out


def search(draws: int, seed: int, per_scenario: int, workdir: Path, shrink: int = 8,
           sources: Iterable[str] = SOURCES, progress: bool = True) -> SearchReport:
    tol = tolerance()
    rep = SearchReport(seed, draws, per_scenario, tol)
    first: dict[tuple[str, str, str], list[tuple[Failure, Draw]]] = defaultdict(list)
    all_draws = [draw(seed, i, per_scenario, tol) for i in range(draws)]
    for s in range(0, draws, per_scenario):
        chunk = all_draws[s: s + per_scenario]
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            found = play(chunk, Path(tmp), rep, sources)
        for d in chunk:
            for f in found.get(d.index, []):
                seen = first[(f.kind, f.source, f.claim)]
                if len(seen) < 3 and all(x.index != d.index for _, x in seen):
                    seen.append((f, d))
        if progress:
            print(f"  draws {s + len(chunk)}/{draws}: {rep.error_count()} errors, {rep.timings['total']:.0f} s",
                  file=sys.stderr, flush=True)
    for _, candidates in sorted(first.items())[:shrink]:
        t0 = time.monotonic()
        # The first of (up to three) draws with this failure that fails alone too; a failure that needs
        # the other draws of its scenario (their lines, their stamps) is reported with its scenario.
        for f, d in candidates:
            small, dims, reproduced = shrink_draw(d, f, workdir)
            if reproduced:
                break
        rep.shrunk.append((f, small, dims, reproduced))
        rep.timings["shrink"] += time.monotonic() - t0
    return rep


def fails(d: Draw, f: Failure, workdir: Path) -> bool:
    """Whether the draw, played alone, fails the same way (same kind, source and claim)."""
    rep = SearchReport(d.seed, 1, 1, tolerance())
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        found = play([d], Path(tmp), rep, (f.source,))
    return any(g.kind == f.kind and g.claim == f.claim for g in found.get(d.index, []))


def shrink_draw(d: Draw, f: Failure, workdir: Path) -> tuple[Draw, dict[str, str], bool]:
    """The draw with as few dimensions as still fail the same way: none at all, else one alone, else
    each removed in turn while it still fails. Returns (draw, its dimensions, whether it failed alone)."""
    if not fails(d, f, workdir):
        return d, d.dims(), False
    dims = list(d.dims())
    candidates = [d.keep_only(set())] + ([d.keep_only({x}) for x in dims] if len(dims) > 1 else [])
    for small in candidates:
        if fails(small, f, workdir):
            return small, small.dims(), True
    for dim in dims:
        smaller = d.without(dim)
        if fails(smaller, f, workdir):
            d = smaller
    return d, d.dims(), True


def command(seed: int, index: int, per_scenario: int, keep: Iterable[str] | None = None) -> str:
    cmd = f"python bench/accuracy_search.py --seed {seed} --draw {index}"
    if per_scenario != 100:
        cmd += f" --per-scenario {per_scenario}"
    if keep is not None:
        cmd += f" --keep '{','.join(keep)}'"
    return cmd


# ----------------------------------------------------------------------------- report
def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _esc(text: str, n: int = 240) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:n]


def render(rep: SearchReport) -> list[str]:
    tol = rep.tol
    per_min = rep.draws / max(rep.timings["total"] / 60, 1e-9)
    lines = [
        f"{rep.draws} draws (seed {rep.seed}, {rep.per_scenario} to a simulator), each judged by the live "
        "controller and by `explain` without `--at` on three dumps: `bare` (`kubectl cluster-info dump` as kubectl "
        "writes it), `full` (the fuller procedure below) and `user` (the same with steps skipped and the draw's "
        "evidence degraded).",
        "",
        f"Tolerance (from ClaimSettings): a `true` is an error once the last valid advance is older than "
        f"max({tol.stall_floor:.0f} s, min({tol.stall_ceiling_multiplier:g} × step interval, "
        f"{tol.stall_window_max:.0f} s)) + {tol.scrape_interval:.0f} s scrape + {tol.slack:.0f} s, or a node has "
        f"been silent longer than {tol.node_edge():.0f} s (Lease {tol.lease_duration:.0f} s + renew "
        f"{tol.lease_renew:.0f} s + scrape + slack).",
        "",
        "Runtime: " + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(rep.timings.items()))
        + f" ({per_min:.0f} draws/minute without shrinking).",
        "",
        "### What must be zero",
        "",
    ]
    rows = []
    for kind in ERRORS:
        for claim in (("blocked",) if kind == "wrong-owner" else CLAIMS):
            rows.append([kind, claim] + [rep.errors[(kind, src, claim)] for src in SOURCES])
    lines += _table(["error", "claim", *SOURCES], rows)
    lines += ["", "`true-without-evidence`: observed `true` where the source lacks what that claim needs: the Node of "
              "a pod (running), times on the step lines (kubelet stamps or the trainer's own, unforged), or after a "
              "restart a log holding the pre-restart high-water mark (progressing).", "",
              "### Coverage floor (healthy runs: true on all three claims, needed evidence present, no clock "
              "perturbation, no restart within the restart window)", ""]
    rows = []
    for src in SOURCES:
        c = rep.floor[src]
        rows.append([src, c["healthy"], *(f"{100 * rep.floor_rate(src, k):.1f}%" for k in (*CLAIMS, "all")),
                     "floor" if src in FLOOR_SOURCES else ""])
    lines += _table(["source", "healthy runs", "scheduled", "running", "progressing", "all three", ""], rows)
    lines += ["", "### Observed per claim and source (truth: true / false / false but inside the tolerance)", ""]
    rows = []
    for src in SOURCES:
        for claim in CLAIMS:
            for label in ("true", "false", "false-in-tolerance"):
                n = [rep.observed[(src, claim, label, o)] for o in ("true", "false", "unknown", "missing")]
                if sum(n):
                    rows.append([src, claim, label, *n, f"{100 * (n[2] + n[3]) / sum(n):.0f}%"])
    lines += _table(["source", "claim", "truth", "true", "false", "unknown", "missing", "unknown share"], rows)
    lines += ["", "### Dimensions drawn", "", ", ".join(f"{k} {v}" for k, v in sorted(rep.dims.items())), ""]
    if rep.ghosts:
        lines += ["Runs reported under the name of no current run (an earlier generation's pods, a RayCluster "
                  "without its RayJob): " + ", ".join(f"{k} {v}" for k, v in sorted(rep.ghosts.items())) + ".", ""]
    lines += ["False stalls (progressing judged STALLED while the run was running and advancing, within 1.5 step "
              "intervals): " + (", ".join(f"{k} {v}" for k, v in sorted(rep.false_stalls.items())) or "none") + ".",
              ""]
    lines += [f"- draw {f.draw} · {f.source}: {f.reason[:200]} ({f.facts})" for f in rep.stall_examples]
    if rep.stall_examples:
        lines.append("")
    lines += ["Undecidable, not counted as errors: progressing `true` where the step lines' only times are a "
              "trainer's forged own times (no kubelet timestamps in that source): "
              + (", ".join(f"{k} {v}" for k, v in sorted(rep.undecidable.items())) or "none") + ". A trainer "
              "that prints times ahead by as much as its stall's age hides the stall from any reader of such a "
              "log; the live controller and dumps with `kubectl logs --timestamps` judge by the kubelet's stamps.",
              ""]
    lines += ["### Minimal failing cases", ""]
    if not rep.shrunk:
        lines += ["None.", ""]
    for f, _, dims, reproduced in rep.shrunk:
        lines += [f"- **{f.kind}** · {f.source} · {f.claim}: expected {f.expected}, got {f.got}",
                  f"  - reason: {_esc(f.reason, 400)}",
                  f"  - draw {f.draw}: {_esc(f.facts, 600)}",
                  f"  - minimal dimensions: {', '.join(f'{k}={v}' for k, v in dims.items()) or 'none beyond its fate'}"
                  + ("" if reproduced else " (did not fail alone: seen only among the other draws)"),
                  f"  - reproduce: `{command(rep.seed, f.draw, rep.per_scenario, dims if reproduced else None)}"
                  f"{'' if reproduced else ' --whole-scenario'}`"]
    lines += ["", "### Healthy runs not verified (controller and full dumps, first 30)", ""]
    rows = [[src, i, _esc(why, 300), _esc(facts, 200)] for src, i, why, facts in rep.floor_misses[:30]]
    lines += _table(["source", "draw", "claims not verified", "facts"], rows) if rows else ["None."]
    lines += ["", "### Every error (first 60)", ""]
    rows = [[f.kind, f.source, f.claim, f.draw, f.got, _esc(f.reason, 160), _esc(f.facts, 200)]
            for f in rep.failures[:60]]
    lines += _table(["error", "source", "claim", "draw", "got", "reason", "facts"], rows) if rows else ["None."]
    return lines


KEPT_BY_HAND = "This section is kept by hand"


def kept_sections(text: str) -> list[str]:
    """The `## ` sections of an earlier docs/accuracy.md that say they are kept by hand (their figures
    come from another bench): a regenerated document carries them over as they are."""
    parts = text.split("\n## ")
    return ["## " + p.rstrip("\n") for p in parts[1:] if KEPT_BY_HAND in p.split("\n\n", 2)[1][:200]]


def document(rep: SearchReport, classes_text: str | None, class_reports: list[Any], wall: float,
             kept: list[str] | None = None) -> str:
    """docs/accuracy.md: the current figures first (and the sections `kept` by hand after them), then
    how dumps are made, the search, the classes."""
    lines = [
        "# Accuracy against ground truth",
        "",
        f"Generated by `make accuracy` (`bench/accuracy_search.py --classes ... --draws {rep.draws} --seed "
        f"{rep.seed}`, {wall / 60:.0f} min on this machine); do not edit by hand. The simulator knows what is true "
        "of every run it plays (`kubesim/truth.py`); the class suite (`kubesim/generate.py`) and a seeded randomized "
        "search (`bench/accuracy_draws.py`) compare the collector's claims with it.",
        "",
        "## Current figures",
        "",
    ]
    rows: list[list[Any]] = []
    for r in class_reports:
        what = "classes: stale TauCluster" if r.stale_taucluster else (
            "classes: controller watching throughout" if r.watch_throughout else "classes")
        rows.append([what, f"{r.runs} runs", r.count("false-verified"), r.count("false-true"), "—",
                     r.count("wrong-owner"), "—", "—"])
    ferr = {k: sum(v for (kk, _, _), v in rep.errors.items() if kk == k) for k in ERRORS}
    rows.append(["randomized search", f"{rep.draws} draws", ferr["false-verified"], ferr["false-true"],
                 ferr["true-without-evidence"], ferr["wrong-owner"],
                 f"{100 * rep.floor_rate('controller'):.1f}%", f"{100 * rep.floor_rate('full'):.1f}%"])
    lines += _table(["pass", "size", "false verified", "false true", "true without evidence", "wrong owner",
                     "floor: controller", "floor: full dumps"], rows)
    lines += ["", f"Must be zero: every count but the floors; the floors at least {100 * FLOOR:.0f}% (healthy runs "
              "verified on all three claims). Seed "
              f"{rep.seed}; one draw replays with `python bench/accuracy_search.py --seed {rep.seed} --draw N"
              f"{'' if rep.per_scenario == 100 else f' --per-scenario {rep.per_scenario}'}`.", ""]
    for section in kept or ():
        lines += [section, ""]
    lines += ["## Dumps as users make them", "",
              "`explain --from-dump` is never given `--at`. Three dumps of one instant are judged:", "",
              "- `bare`: `kubectl cluster-info dump --all-namespaces --output-directory DIR`, as kubectl writes it "
              "(logs without kubelet timestamps, no custom kinds);",
              "- `full`: the fuller procedure, every step:", "", "```",
              *PROCEDURE_LINES, "```", "",
              "- `user`: the fuller procedure with some steps skipped (crds, cluster, leases for a whole dump; the "
              "log steps per run) and each draw's files degraded as a user's tooling might leave them: previous logs "
              "removed, its Node objects removed from nodes.json, its Events removed (aged out), kubectl's banners "
              "stripped from a single-container pod's logs.txt, kubelet timestamps stripped, one rank's logs missing.",
              "",
              "Files carry the capture instant as their modification time (in 15 % of the scenarios a later or an "
              "earlier one: a dump copied two days later, or written on a workstation an hour behind). "
              "Per-container logs are fetched with the request kubectl makes "
              "(byte-equal to its output, `tests/simulator/test_realism.py`).", "",
              "## Randomized search", ""]
    lines += render(rep)
    if classes_text:
        lines += ["", "## Classes", ""]
        body = classes_text.splitlines()
        start = next((i for i, ln in enumerate(body) if ln.startswith(f"{class_reports[0].runs} generated runs")), 0)
        renamed = {"# Watching throughout": "# Classes, the controller watching throughout",
                   "# With a stale TauCluster": "# Classes with a stale TauCluster"}
        lines += [("#" + renamed.get(ln, ln)) if ln.startswith("#") else ln for ln in body[start:]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--draws", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-scenario", type=int, default=100)
    ap.add_argument("--shrink", type=int, default=8, help="kinds of failure to shrink to a minimal case")
    ap.add_argument("--draw", type=int, default=None, help="replay this one draw alone")
    ap.add_argument("--keep", default=None, help="with --draw: keep only these dimensions (comma-separated)")
    ap.add_argument("--whole-scenario", action="store_true",
                    help="with --draw: replay every draw of its scenario (the draw's failures are printed)")
    ap.add_argument("--sources", default=",".join(SOURCES))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--failures", type=Path, default=None, help="write every failure here as JSON lines")
    ap.add_argument("--classes", type=int, default=0,
                    help="also play the class suite with this many runs (docs/accuracy.md: both, figures first)")
    args = ap.parse_args()
    t_start = time.monotonic()
    sources = tuple(s for s in args.sources.split(",") if s)
    with tempfile.TemporaryDirectory(prefix="taugrid-search-") as tmp:
        if args.draw is not None:
            d = draw(args.seed, args.draw, args.per_scenario, tolerance())
            if args.keep is not None:
                d = d.keep_only({k for k in args.keep.split(",") if k})
            together = [d]
            if args.whole_scenario:
                first = d.scenario * args.per_scenario
                together = [d if i == d.index else draw(args.seed, i, args.per_scenario, tolerance())
                            for i in range(first, first + args.per_scenario)]
            rep = SearchReport(args.seed, len(together), len(together), tolerance())
            found = play(together, Path(tmp), rep, sources)
            print(f"draw {d.index}: {_facts(d, RunTruth('', '', False, False, False, None))}")
            for f in found.get(d.index, []):
                print(f"{f.kind} [{f.source}] {f.claim}: expected {f.expected}, got {f.got}: {f.reason}")
            print("no error" if not found.get(d.index) else "")
            return
        rep = search(args.draws, args.seed, args.per_scenario, Path(tmp), args.shrink, sources)
    classes_text: str | None = None
    class_reports: list[Any] = []
    if args.classes:
        n = len(CLASS_NAMES)
        classes_text, class_reports = classes_report(args.classes, args.seed, 3 * n, 3 * n)
        for r in class_reports:
            print(accuracy_summary(r), file=sys.stderr)
    kept = kept_sections(args.out.read_text()) if args.out is not None and args.out.exists() else []
    text = (document(rep, classes_text, class_reports, time.monotonic() - t_start, kept) if args.classes
            else "\n".join(render(rep)) + "\n")
    if args.failures:
        with args.failures.open("w") as fh:
            for f in rep.failures:
                fh.write(json.dumps({k: getattr(f, k) for k in Failure.__slots__}) + "\n")
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    print(f"seed {rep.seed}: {rep.draws} draws, {rep.error_count()} errors, floor "
          f"{'holds' if rep.floor_ok() else 'FAILS'}", file=sys.stderr)


if __name__ == "__main__":
    main()
