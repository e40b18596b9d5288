"""Prometheus export: every run's claims and the collector's own health, on one dedicated registry.

`ClaimsExporter` holds an in-memory snapshot of `RunClaims` and renders it at scrape time; the
collector's own health (`exporters.prometheus_health.HealthMetrics`) lands on the same registry.
Every family and label is documented, with its worst-case cardinality, in docs/metrics.md
(a test keeps the two in step). Label values stay bounded: names and enums only, never reasons,
messages or uids.
"""

from __future__ import annotations

import logging
import math
import threading
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import chain, compress, repeat
from operator import attrgetter, itemgetter, methodcaller, ne

from prometheus_client import (
    CollectorRegistry,
    Metric,
    generate_latest,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from collector.claims.workrisk import drain_advice
from collector.model import Observed, Plane, Ref, RunClaims
from collector.timeunits import epoch_us
from exporters.prometheus_accrual import CLOCK_FAMILIES, MAX_EXPOSED_NODES, Row, clocked_rows
from exporters.prometheus_accrual import render as render_rows
from exporters.prometheus_families import (
    AGE_FAMILIES,
    ENERGY,
    ENERGY_TOKEN,
    EVALUATED,
    FINISHED,
    RUN_BODY,
    TEMPLATES,
    run_families,
)
from exporters.prometheus_fleet import (
    HEALTHY_RUN_FAMILIES,
    RunSeries,
    RunState,
    fleet_family,
    fleet_family_of,
    fleet_key,
    node_families,
    run_state,
)
from exporters.prometheus_health import epoch_seconds
from exporters.prometheus_serve import Fixed, Group, new_registry, serve, shutdown

log = logging.getLogger("taugrid.prometheus")

__all__ = [
    "DEFAULT_RETENTION",
    "ClaimsExporter",
    "new_registry",
    "render",
    "serve",
    "shutdown",
]

# Long enough for alert rules (`for:` clauses) and dashboards to see a run's final verdicts;
# Prometheus keeps the history after the series go.
DEFAULT_RETENTION = timedelta(minutes=15)

def render(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format (0.0.4).

    A `ClaimsExporter` in it answers from its prepared text (`ClaimsExporter.exposition`): at fleet
    size formatting every run's series per scrape costs most of a core. Other collectors render
    as client_python does, in registration order.
    """
    # client_python keeps its collectors in a private dict; `restricted_registry` would render
    # the claims too, which is the work this avoids.
    collectors = list(registry._collector_to_names)
    if not any(isinstance(c, ClaimsExporter) for c in collectors):
        return generate_latest(registry)
    parts: list[bytes] = []
    others: list[Collector] = []
    for c in collectors:
        if isinstance(c, ClaimsExporter):
            if others:
                parts.append(generate_latest(Group(others)))
                others = []
            parts.append(c.exposition())
        else:
            others.append(c)
    if others:
        parts.append(generate_latest(Group(others)))
    return b"".join(parts)


# One block of runs' prepared text: by family, the joined lines; the age families' rows; the clock
# families' rows (exporters/prometheus_accrual.py); fleet counts.
_Block = tuple[dict[str, bytes], dict[str, list[tuple[bytes, float]]], dict[str, list[Row]],
               "Tally[tuple[str, str, str]]"]


@dataclass(frozen=True, slots=True)
class _Entry:
    claims: RunClaims
    newest: tuple[tuple[Plane, float], ...]  # newest Evidence.at per plane, unix seconds
    finished_at: float | None  # when we first saw the run finished (its evaluated_at)
    # The run's series as exposition text, by family, prepared once per update: lines that do not
    # depend on the clock as bytes; ages as (series name and labels, the time they count from).
    text: dict[str, bytes] = field(default_factory=dict, compare=False)
    ages: dict[str, tuple[tuple[bytes, float], ...]] = field(default_factory=dict, compare=False)
    # The families that grow with the clock (goodput, run time, work at risk): rows written at a clock.
    clocked: dict[str, tuple[Row, ...]] = field(default_factory=dict, compare=False)


def _fmt(v: float) -> str:
    return str(floatToGoString(v))  # type: ignore[no-untyped-call]


def _esc(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _every_time_text(rc: RunClaims, body: str) -> dict[str, bytes]:
    """The lines of the families that change with every evaluation of a running run (energy, finished,
    evaluated; goodput and run time: exporters/prometheus_accrual.py), written straight from the run's
    label text `body` (what `_template` renders for the run labels; checked where the templates are built)."""
    out: dict[str, bytes] = {}
    # --- energy per step (issue 28): a series only while known ---
    if rc.energy is not None and rc.energy.joules_per_step is not None:
        out["energy_per_step"] = f"{ENERGY}{{{body}}} {_fmt(rc.energy.joules_per_step)}\n".encode()
    if rc.energy is not None and rc.energy.joules_per_token is not None:
        out["energy_per_token"] = f"{ENERGY_TOKEN}{{{body}}} {_fmt(rc.energy.joules_per_token)}\n".encode()
    out["finished"] = f"{FINISHED}{{{body}}} {'1.0' if rc.finished else '0.0'}\n".encode()
    out["evaluated"] = f"{EVALUATED}{{{body}}} {_fmt(epoch_seconds(rc.evaluated_at))}\n".encode()
    return out


def _same_claims(a: RunClaims, b: RunClaims) -> bool:
    return (a.ref == b.ref and a.scheduled == b.scheduled and a.running == b.running
            and a.progressing == b.progressing and a.blocked == b.blocked and a.finished == b.finished)


# The families of one group are prepared together from the same inputs (`_group_keys`): an update
# reuses a group's lines from the run's previous entry while its inputs stay the same.
_GROUPS: dict[str, tuple[str, ...]] = {
    "claims": ("claim", "since", "progressing_cause"),
    "blocked": ("blocked", "blocked_age"),
    "evidence_age": ("evidence_age",),
    "last": ("last_step", "last_progress"),
    "queue": ("admission_eta", "queue_position"),
    "stragglers": ("straggler",),
}


def _step_value(value: object) -> float | None:
    """A step as a sample value; None for what is not a finite number (an int past a float's range)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _last_step(rc: RunClaims) -> tuple[float, float] | None:
    last = next((e for e in rc.progressing.evidence if e.field == "last_step"), None)
    if last is not None and last.at is not None and (step := _step_value(last.value)) is not None:
        return step, epoch_seconds(last.at)
    return None


def _group_keys(entry: _Entry) -> dict[str, object]:
    rc = entry.claims
    b = rc.blocked
    return {
        "claims": (tuple((name, c.observed, c.verdict, c.since) for name, c in rc.claims.items()),
                   rc.progressing.cause),
        "blocked": (b.stage, b.since) if b is not None else None,
        "evidence_age": entry.newest,
        "last": _last_step(rc),
        "queue": _queue_values(rc),
        "stragglers": _suspects(rc),
    }


def _queue_values(rc: RunClaims) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]] | None:
    """(admission estimate by bound, position by queue) of a run blocked in queue admission."""
    q = rc.queue
    if q is None:
        return None
    e = q.eta
    eta = tuple((b, v) for b, v in (("low", e.low_s), ("mid", e.mid_s), ("high", e.high_s)) if v is not None)
    pos = tuple((k, float(v)) for k, v in (("cluster", q.position_cq), ("local", q.position_lq)) if v is not None)
    return eta, pos


def _suspects(rc: RunClaims) -> tuple[tuple[str, str, str, str, str, float], ...]:
    """The run's named stragglers as (rank, pod, node, gpu, basis, lag ratio): only suspects are
    series (at most claims.stragglers.MAX_SUSPECTS per run), so the family stays small."""
    st = rc.stragglers
    if st is None:
        return ()
    return tuple((x.rank, x.pod, x.node, x.gpu, x.basis, round(x.lag_ratio, 4)) for x in st.suspects)


# --- work at risk (claims.workrisk; the drain advisor's node families: exporters.prometheus_fleet) -----


def _at_risk(rc: RunClaims) -> tuple[float | None, tuple[tuple[str, float], ...]]:
    """(GPU-hours at risk or None when unknown, (node, GPU-hours at risk there) for the run's nodes
    with a risk signal, at most MAX_EXPOSED_NODES)."""
    w = rc.work_at_risk
    if w is None:
        return None, ()
    exposed = tuple((n.node, n.gpu_hours) for n in w.nodes if n.score > 0 and n.gpu_hours is not None)
    return w.gpu_hours, exposed[:MAX_EXPOSED_NODES]


def _prepare(entry: _Entry, prev: _Entry | None = None) -> _Entry:
    """Fill `entry.text` and `entry.ages` with what `ClaimsExporter.collect` yields for its run.
    With `prev` (the same run's previous entry), a group of families whose inputs did not move
    keeps its lines; only the every-evaluation families (`_every_time_text`) and the groups that moved
    are formatted."""
    rc = entry.claims
    run = _run_labels(rc.ref)
    lines: dict[str, list[str]] = {}
    ages: dict[str, list[tuple[bytes, float]]] = {}
    tpl = TEMPLATES

    def add(fam: str, value: float, **extra: str) -> None:
        labels = {**run, **{k: _esc(v) for k, v in extra.items()}} if extra else run
        lines.setdefault(fam, []).append(f"{tpl[fam] % labels} {_fmt(value)}\n")

    keys = _group_keys(entry)
    moved = set(_GROUPS)
    if prev is not None:
        # The previous inputs are derived again rather than kept: a few small tuples per run
        # against ~0.6 KB per run held for the whole fleet.
        before = _group_keys(prev)
        text, kept_ages, prev_text, prev_ages = entry.text, entry.ages, prev.text, prev.ages
        for group, fams in _GROUPS.items():
            if before[group] == keys[group]:
                moved.discard(group)
                for f in fams:  # (a loop, not two comprehensions per group: their frames cost more)
                    if (t := prev_text.get(f)) is not None:
                        text[f] = t
                    if (a := prev_ages.get(f)) is not None:
                        kept_ages[f] = a
    if "claims" in moved:
        for name, claim in rc.claims.items():
            add("claim", 1.0, claim=name, observed=claim.observed.value, verdict=claim.verdict.value)
            if claim.since is not None:
                add("since", epoch_seconds(claim.since), claim=name)
        if rc.progressing.observed is Observed.FALSE and rc.progressing.cause:
            add("progressing_cause", 1.0, cause=rc.progressing.cause)
    if "blocked" in moved and rc.blocked is not None:
        stage = rc.blocked.stage
        add("blocked", 1.0, stage=stage.value, owner=stage.owner)
        if rc.blocked.since is not None:
            labels = {**run, "stage": _esc(stage.value), "owner": _esc(stage.owner)}
            ages["blocked_age"] = [((tpl["blocked_age"] % labels).encode(), epoch_seconds(rc.blocked.since))]
    if "evidence_age" in moved and entry.newest:
        ages["evidence_age"] = _age_rows(run, entry.newest)
    last = keys["last"]
    if "last" in moved and last is not None:
        assert isinstance(last, tuple)
        entry.text.update(_last_text(run, last))
    queue = keys["queue"]
    if "queue" in moved and isinstance(queue, tuple):
        for bound, v in queue[0]:
            add("admission_eta", v, bound=bound)
        for which, v in queue[1]:
            add("queue_position", v, queue=which)
    if "stragglers" in moved:
        for rank, pod, node, gpu, basis, ratio in _suspects(rc):
            add("straggler", ratio, rank=rank, pod=pod, node=node, uuid=gpu, basis=basis)
    body = RUN_BODY % run
    entry.clocked.update(clocked_rows(rc, body, run, _esc))
    entry.text.update(_every_time_text(rc, body))
    entry.text.update({fam: "".join(ls).encode() for fam, ls in lines.items()})
    entry.ages.update({fam: tuple(a) for fam, a in ages.items()})
    return entry


def _run_labels(ref: Ref) -> dict[str, str]:
    """A run's labels, escaped (what the families' templates take)."""
    return {"namespace": _esc(ref.namespace), "run": _esc(ref.name), "kind": _esc(ref.kind)}


def _age_rows(run: dict[str, str], newest: tuple[tuple[Plane, float], ...]) -> list[tuple[bytes, float]]:
    """The evidence age family's rows of a run (`run`: its labels escaped) from its newest evidence per plane."""
    tpl = TEMPLATES["evidence_age"]
    return [((tpl % {**run, "plane": _esc(plane.value)}).encode(), at) for plane, at in newest]


def _last_text(run: dict[str, str], last: tuple[float, float]) -> dict[str, bytes]:
    """The last step's and its time's lines of a run (`run`: its labels escaped)."""
    return {"last_step": f"{TEMPLATES['last_step'] % run} {_fmt(last[0])}\n".encode(),
            "last_progress": f"{TEMPLATES['last_progress'] % run} {_fmt(last[1])}\n".encode()}


def _newest_per_plane(rc: RunClaims) -> tuple[tuple[Plane, float], ...]:
    newest: dict[Plane, float] = {}
    evidence = [e for c in rc.claims.values() for e in c.evidence]
    if rc.blocked is not None:
        evidence.extend(rc.blocked.evidence)
    for e in evidence:
        if e.at is None:
            continue
        t = epoch_seconds(e.at)
        if t > newest.get(e.plane, float("-inf")):
            newest[e.plane] = t
    return tuple(sorted(newest.items()))


class ClaimsExporter(Collector):
    """The current claims of every run, rendered at scrape time.

    `update` upserts runs (or, with `replace=True`, makes the batch the whole snapshot); series of a
    run that finished are dropped once `retention` has passed since it was first seen finished, and
    stay dropped while the same run (same uid) keeps arriving finished. Ages are measured against
    the newest `now` given to `update`, so they keep growing for runs that are not re-evaluated and
    follow the controller's clock (real or accelerated), not the scraper's.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, retention: timedelta = DEFAULT_RETENTION,
        run_series: RunSeries = RunSeries.ALL, key_of: Callable[[Ref], tuple[str, str, str]] = attrgetter("key"),
    ):
        if retention < timedelta(0):
            raise ValueError("retention must not be negative")
        self.retention = retention
        # A run's key (`Ref.key`): the live controller's index's own tuple (`RunIndex.key_of`), so the
        # maps below hold no copy of their own
        self._key_of = key_of
        # UNHEALTHY: a healthy run writes only HEALTHY_RUN_FAMILIES (exporters/prometheus_fleet.py).
        self.run_series = RunSeries(run_series)
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str, str], _Entry] = {}
        # Finished runs already past retention, by key → uid, so a controller that keeps sending
        # them does not bring their series back. Cleared by `forget` and by `replace=True`.
        self._retired: dict[tuple[str, str, str], str] = {}
        # Keys of exported runs that finished, so retention scans only those, not every run.
        self._finished: set[tuple[str, str, str]] = set()
        self._now: float | None = None
        self._now_at: datetime | None = None  # the same instant (`_now`), for the clock families
        self.failed = 0  # runs whose claims could not be rendered (logged; the run is left out)
        # The claims families as exposition text, rebuilt on the first scrape after a change.
        self._text: bytes | None = None
        # What only a change of runs moves (not the clock): the families' text without the ages, by
        # family; the age families' (series, time counted from) rows; the clock families' rows; the runs
        # with work at risk on a risky node (the drain advisor's). None: rebuilt on the next scrape.
        self._still: _Still | None = None
        # Each exported run's (namespace, queue, state) in taugrid_fleet_runs, set by _upsert (and pruned
        # by _prepare_still of the runs no longer exported).
        self._fleet_keys: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        # The runs' keys in exposition order, cut in blocks of _BLOCK runs whose text is joined once and
        # kept until one of their runs moves: a tick that re-evaluates a few runs re-joins a few blocks.
        # None: the set of runs changed, every block is joined again.
        self._order: list[tuple[str, str, str]] | None = None
        self._blocks: list[_Block | None] = []
        self._moved: set[tuple[str, str, str]] = set()
        if registry is not None:
            registry.register(self)

    # --- writes -------------------------------------------------------------------------------

    def update(self, claims: Iterable[RunClaims], now: datetime, *, replace: bool = False) -> None:
        """Store these runs' claims as of `now`, then apply retention to every run."""
        batch = list(claims)
        with self._lock:
            now_s = self._advance(now)
            if replace:
                self._order = None
                keep = {rc.ref.key for rc in batch}
                self._runs = {k: v for k, v in self._runs.items() if k in keep}
                self._retired = {k: v for k, v in self._retired.items() if k in keep}
                self._finished &= keep
            for rc in batch:
                try:
                    self._upsert(rc)
                except Exception:  # one run's claims that cannot be rendered cost only that run
                    self.failed += 1
                    log.exception("run not exported", extra={"run": f"{rc.ref.namespace}/{rc.ref.name}"})
                    self._runs.pop(rc.ref.key, None)  # never its older (stale) series instead
                    self._order = None
                    self._finished.discard(rc.ref.key)
            exported = len(self._runs)
            self._expire(now_s)
            self._text = None
            if batch or replace or len(self._runs) != exported:
                self._still = None

    def _advance(self, now: datetime) -> float:
        """The exporter's clock moved to `now` if that is later (ages count to it); `now` in unix seconds."""
        now_s = epoch_seconds(now)
        if self._now is None or now_s > self._now:
            self._now, self._now_at = now_s, now
        return now_s

    def _upsert(self, rc: RunClaims) -> None:
        key = self._key_of(rc.ref)
        retired_uid = self._retired.get(key)
        if retired_uid is not None:
            if rc.finished and retired_uid == rc.ref.uid:
                return
            # Not finished any more, or a new run under the same name: export it again.
            del self._retired[key]
        old = self._runs.get(key)
        if old is None:
            self._order = None
        else:
            self._moved.add(key)
        finished_at: float | None = None
        if rc.finished:
            same_run = old is not None and old.claims.ref.uid == rc.ref.uid
            if same_run and old is not None and old.finished_at is not None:
                finished_at = old.finished_at
            else:
                finished_at = epoch_seconds(rc.evaluated_at)
            self._finished.add(key)
        else:
            self._finished.discard(key)
        if old is not None and _same_claims(old.claims, rc):  # same evidence: the same newest per plane
            self._runs[key] = _prepare(_Entry(rc, old.newest, finished_at), old)
        else:
            self._runs[key] = _prepare(_Entry(rc, _newest_per_plane(rc), finished_at), old)
        self._fleet_keys[key] = fleet_key(rc)

    def carry(self, rc: RunClaims, now: datetime) -> None:
        """`rc`: an exported run's claims with no more than its last step's evidence moved (its step,
        loss and their time: `planes.signals.carried`, between a deferred run's evaluations). Its entry
        is `update`'s for `rc`, written from the one before: every family's lines kept but the last
        step's and the evidence ages (a third of `update`'s work, on every agent pass of every healthy
        run). A run whose entry is not the same evaluation's (not exported, another under its name)
        goes through `update`."""
        key = self._key_of(rc.ref)
        with self._lock:
            old = self._runs.get(key)
            if (old is None or old.claims.ref != rc.ref or old.claims.evaluated_at != rc.evaluated_at
                    or rc.finished or old.finished_at is not None):
                old = None  # (kept lines only from the same evaluation's entry)
            else:
                run = _run_labels(rc.ref)
                newest = _newest_per_plane(rc)
                text = dict(old.text)
                for fam in ("last_step", "last_progress"):
                    text.pop(fam, None)
                if (last := _last_step(rc)) is not None:
                    text.update(_last_text(run, last))
                ages = dict(old.ages)
                rows = ages.pop("evidence_age", ())
                if newest:
                    # (each plane's series as the entry wrote it: `_age_rows` writes them in `newest`'s order)
                    series = {plane: row[0] for (plane, _), row in zip(old.newest, rows, strict=False)}
                    ages["evidence_age"] = tuple(
                        (series[plane], at) if plane in series else _age_rows(run, ((plane, at),))[0]
                        for plane, at in newest)
                self._runs[key] = _Entry(rc, newest, None, text, ages, old.clocked)
                self._moved.add(key)
                self._advance(now)
                self._text = None
                self._still = None
        if old is None:
            self.update((rc,), now)

    def _expire(self, now_s: float) -> None:
        horizon = now_s - self.retention.total_seconds()
        for key in list(self._finished):
            entry = self._runs[key]
            if entry.finished_at is not None and entry.finished_at <= horizon:
                del self._runs[key]
                self._finished.discard(key)
                self._retired[key] = entry.claims.ref.uid
                self._order = None

    def forget(self, ref: Ref) -> bool:
        """Drop a run's series now (its object was deleted); True if it was exported."""
        with self._lock:
            self._retired.pop(ref.key, None)
            self._finished.discard(ref.key)
            self._text = None
            self._still = None
            self._order = None
            return self._runs.pop(ref.key, None) is not None

    # --- reads --------------------------------------------------------------------------------

    def runs(self) -> list[Ref]:
        """Refs of the runs currently exported."""
        with self._lock:
            return [e.claims.ref for e in self._runs.values()]

    def exposition(self) -> bytes:
        """What `collect` yields, as Prometheus text: rendered from the runs' prepared lines once
        per change (claims or clock), then the same bytes for every scrape until the next one."""
        with self._lock:
            text = self._text
            if text is not None:
                return text
            if self._still is None:
                self._still = self._prepare_still()
            still, aged, clocked, risky = self._still
            now_s, now_at = self._now, self._now_at
            now_us = epoch_us(now_at) if now_at is not None else None
            out: list[bytes] = []
            for fam, metric in self._families().items():
                doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
                out.append(f"# HELP {metric.name} {doc}\n# TYPE {metric.name} gauge\n".encode())
                if fam in AGE_FAMILIES:
                    if now_s is not None:
                        # Clamped: evidence stamped ahead of our clock (skew) is fresh, not negative.
                        # `%a` of a float is its repr, what _fmt writes from 0 up to 1e6 (test_run_series.py).
                        out.extend(b"%s %a\n" % (series, age) if 0.0 < (age := now_s - at) < 1e6
                                   else b"%s %s\n" % (series, _fmt(max(0.0, age)).encode())
                                   for series, at in aged.get(fam, ()))
                elif fam in CLOCK_FAMILIES:
                    if now_us is not None:
                        out.append(render_rows(clocked.get(fam, []), now_us))
                else:
                    out.append(still[fam])
            out.append(still[""])
            # The drain advisor's node families, from the risky runs' work at risk at this clock.
            out.append(generate_latest(Group([Fixed([*node_families(drain_advice(
                rc.at(now_at) if now_at is not None else rc for rc in risky))])])))
            self._text = b"".join(out)
            return self._text

    def _prepare_still(self) -> _Still:
        if self._order is None:
            self._order = sorted(self._runs)
            self._blocks = [None] * -(-len(self._order) // _BLOCK)
            self._moved.clear()
            if len(self._fleet_keys) > len(self._order):
                self._fleet_keys = {k: self._fleet_keys[k] for k in self._order}
        elif self._moved:
            order = self._order
            for key in self._moved:
                i = bisect_left(order, key)
                if i < len(order) and order[i] == key:
                    self._blocks[i // _BLOCK] = None
            self._moved.clear()
        blocks: list[_Block] = []
        for i, block in enumerate(self._blocks):
            if block is None:
                block = self._blocks[i] = self._block(self._order[i * _BLOCK:(i + 1) * _BLOCK])
            blocks.append(block)
        still = {fam: b"".join(b[0][fam] for b in blocks) for fam in self._families()
                 if fam not in AGE_FAMILIES and fam not in CLOCK_FAMILIES}
        aged = {fam: list(chain.from_iterable(b[1][fam] for b in blocks)) for fam in AGE_FAMILIES}
        clocked = {fam: list(chain.from_iterable(b[2][fam] for b in blocks)) for fam in CLOCK_FAMILIES}
        tally: Tally[tuple[str, str, str]] = Tally()
        for b in blocks:
            tally.update(b[3])
        risky = [e.claims for e in self._runs.values()
                 if (w := e.claims.work_at_risk) is not None and any(n.score > 0 for n in w.nodes)]
        still[""] = generate_latest(Group([Fixed([fleet_family_of(tally)])]))
        return still, aged, clocked, risky

    def _block(self, keys: list[tuple[str, str, str]]) -> _Block:
        """One block's families (text; age rows) and fleet counts; the per-run steps stay in C."""
        every = list(map(self._runs.__getitem__, keys))
        marks = list(map(self._fleet_keys.__getitem__, keys))
        full = every if self.run_series is RunSeries.ALL else \
            list(compress(every, map(ne, map(itemgetter(2), marks), repeat(RunState.HEALTHY.value))))
        still: dict[str, bytes] = {}
        aged: dict[str, list[tuple[bytes, float]]] = {}
        clocked: dict[str, list[Row]] = {}
        texts = {id(entries): [e.text for e in entries] for entries in (every, full)}
        ages = {id(entries): [e.ages for e in entries] for entries in (every, full)}
        rows = {id(entries): [e.clocked for e in entries] for entries in (every, full)}
        for fam in self._families():
            entries = every if fam in HEALTHY_RUN_FAMILIES else full
            if fam in AGE_FAMILIES:
                aged[fam] = list(chain.from_iterable(map(methodcaller("get", fam, ()), ages[id(entries)])))
            elif fam in CLOCK_FAMILIES:
                clocked[fam] = list(chain.from_iterable(map(methodcaller("get", fam, ()), rows[id(entries)])))
            else:
                still[fam] = b"".join(filter(None, map(methodcaller("get", fam), texts[id(entries)])))
        return still, aged, clocked, Tally(marks)

    def describe(self) -> Iterable[Metric]:
        # Names only, so the registry can refuse a second collector with the same families.
        return [*self._families().values(), fleet_family(()), *node_families(())]

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            # Entries are immutable: copying the references is enough to render outside the lock.
            entries = list(self._runs.values())
            now_s, now_at = self._now, self._now_at
        entries.sort(key=lambda e: e.claims.ref.key)
        # goodput and work at risk at the exporter's clock
        current = [e.claims if now_at is None else e.claims.at(now_at) for e in entries]
        fam = self._families()
        brief = self.run_series is RunSeries.UNHEALTHY
        for entry, rc in zip(entries, current, strict=True):
            run = (rc.ref.namespace, rc.ref.name, rc.ref.kind)
            if brief and run_state(rc) is RunState.HEALTHY:
                if (last := _last_step(rc)) is not None:  # HEALTHY_RUN_FAMILIES
                    fam["last_step"].add_metric(list(run), last[0])
                for rank, pod, node, gpu, basis, ratio in _suspects(rc):
                    fam["straggler"].add_metric([*run, rank, pod, node, gpu, basis], ratio)
                for node, h in _at_risk(rc)[1]:
                    fam["drain_exposure"].add_metric([*run, node], round(h, 4))
                continue
            for name, claim in rc.claims.items():
                fam["claim"].add_metric([*run, name, claim.observed.value, claim.verdict.value], 1.0)
                if claim.since is not None:
                    fam["since"].add_metric([*run, name], epoch_seconds(claim.since))
            if rc.progressing.observed is Observed.FALSE and rc.progressing.cause:
                fam["progressing_cause"].add_metric([*run, rc.progressing.cause], 1.0)
            if rc.blocked is not None:
                stage = rc.blocked.stage
                fam["blocked"].add_metric([*run, stage.value, stage.owner], 1.0)
                if rc.blocked.since is not None and now_s is not None:
                    age = max(0.0, now_s - epoch_seconds(rc.blocked.since))
                    fam["blocked_age"].add_metric([*run, stage.value, stage.owner], age)
            if now_s is not None:
                for plane, at in entry.newest:
                    # Clamped: evidence stamped ahead of our clock (skew) is fresh, not negative.
                    fam["evidence_age"].add_metric([*run, plane.value], max(0.0, now_s - at))
            if (last := _last_step(rc)) is not None:
                fam["last_step"].add_metric(list(run), last[0])
                fam["last_progress"].add_metric(list(run), last[1])
            g = rc.goodput
            if g is not None:
                if g.ratio is not None:
                    fam["goodput"].add_metric(list(run), g.ratio)
                fam["run_time"].add_metric([*run, "productive"], g.productive_s)
                for cause, secs in g.badput_s.items():
                    if secs:
                        fam["run_time"].add_metric([*run, cause], secs)
            if (queue := _queue_values(rc)) is not None:
                for bound, v in queue[0]:
                    fam["admission_eta"].add_metric([*run, bound], v)
                for which, v in queue[1]:
                    fam["queue_position"].add_metric([*run, which], v)
            for rank, pod, node, gpu, basis, ratio in _suspects(rc):
                fam["straggler"].add_metric([*run, rank, pod, node, gpu, basis], ratio)
            at_risk, exposed = _at_risk(rc)
            if at_risk is not None:
                fam["work_at_risk"].add_metric(list(run), round(at_risk, 4))
            for node, h in exposed:
                fam["drain_exposure"].add_metric([*run, node], round(h, 4))
            if rc.energy is not None and rc.energy.joules_per_step is not None:  # energy per step (issue 28)
                fam["energy_per_step"].add_metric(list(run), rc.energy.joules_per_step)
            if rc.energy is not None and rc.energy.joules_per_token is not None:
                fam["energy_per_token"].add_metric(list(run), rc.energy.joules_per_token)
            fam["finished"].add_metric(list(run), 1.0 if rc.finished else 0.0)
            fam["evaluated"].add_metric(list(run), epoch_seconds(rc.evaluated_at))
        return [*fam.values(), fleet_family(e.claims for e in entries), *node_families(drain_advice(current))]

    _families = staticmethod(run_families)  # (the families: exporters/prometheus_families.py)


_Still = tuple[dict[str, bytes], dict[str, list[tuple[bytes, float]]], dict[str, list[Row]], list[RunClaims]]
_BLOCK = 64  # runs per block of prepared text (ClaimsExporter._blocks)
