"""Stragglers from logs: the rank (or pod) of a run that is consistently behind its peers.

No trainer change: what the log scanner already reads is enough. A *track* is one rank's recent
steps with the instant it first printed each: the ranks of one log whose lines carry rank prefixes
(`LogScan.ranks`, one clock), or the pods of a multi-pod run (one log each, on its node's clock,
already moved onto the evaluation clock by the engine).

Two ways a rank shows it is slow, each judged with robust statistics over the run's ranks:
- *arrival*: ranks that synchronize every step (data parallel) print each step at nearly the same
  time, and the slow one prints it last: its median offset from the step's median arrival, against
  the others' offsets (robust z over ranks), and the share of steps it was the last. A lag of a
  step or more at equal pace is a counter offset (a log that lags), not slowness: not a suspect.
- *pace*: ranks that do not synchronize every step drift apart; the slow one's own steps take
  longer (median seconds per step, against the others').

Fail closed: fewer than MIN_TRACKS ranks or MIN_STEPS compared steps name nobody; a suspect must
sit apart by MIN_Z robust deviations *and* by MIN_RATIO of a step; across nodes an arrival lag must
also exceed what unsynchronized clocks can explain (CLOCK_TOLERANCE). Bounded: at most MAX_TRACKS
tracks and the last WINDOW steps of each; at most MAX_SUSPECTS named. Pure: data and a clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from collector.claims.lineage import Lineage
from collector.claims.progress_walk import ByScan
from collector.correlate import Key, RunEvidence, Signal
from collector.model import PodFacts, Straggler, Stragglers
from collector.progress import LogScan

MIN_TRACKS = 3  # with two ranks, either could be the slow one
MIN_STEPS = 12  # steps printed by enough ranks, in the window
WINDOW = 40  # the most recent steps compared (an intermittent straggler is judged on its current stretch)
SHORT_WINDOW = 16  # ... and the newest of them alone (a straggler that began lately)
MAX_TRACKS = 512
MAX_SUSPECTS = 3
MIN_Z = 5.0  # robust deviations (MAD × 1.4826) from the ranks' median
MIN_RATIO = 0.05  # of the run's step time: less is within what jitter and clocks make
MIN_LAST_SHARE = 0.5  # arrival: last to print at least this share of the steps compared ...
SHORT_LAST_SHARE = 0.75  # ... and of the newest SHORT_WINDOW (fewer steps: a median a few slow ones can move)
CLOCK_TOLERANCE = timedelta(milliseconds=250)  # between two nodes' clocks, after the measured skew
RECENT = timedelta(minutes=10)  # steps older than this before the newest are not the current stretch
MAD_SCALE = 1.4826
T = TypeVar("T")
MEDIAN_SE = 1.2533  # a median's standard error is this × σ / √n (normal noise)


@dataclass(frozen=True, slots=True)
class Track:
    """One rank's recent steps: step → when it first printed it (rising steps only)."""

    rank: str
    pod: str
    node: str
    steps: tuple[int, ...]
    at: tuple[datetime, ...]


def rising_run(pairs: Iterable[tuple[int, T]]) -> tuple[list[int], list[T]]:
    """The last run of rising steps of (step, when) pairs, as (steps, whens): a step that went back starts
    it over (a restart: its current incarnation only), one no higher than the last is skipped."""
    steps: list[int] = []
    ats: list[T] = []
    for step, at in pairs:
        if steps and step <= steps[-1]:
            if step < steps[-1]:
                steps, ats = [], []
            continue
        steps.append(step)
        ats.append(at)
    return steps, ats


def _rising(pairs: Iterable[tuple[int, datetime]]) -> tuple[tuple[int, ...], tuple[datetime, ...]]:
    """The last run of rising steps, last WINDOW*2 of them."""
    steps, ats = rising_run(pairs)
    return tuple(steps[-2 * WINDOW:]), tuple(ats[-2 * WINDOW:])


def tracks(ev: RunEvidence, signals: Sequence[Signal],
           lineage: Mapping[tuple[Key, str], Lineage] | None = None) -> list[Track]:
    """The run's rank tracks: the ranks of its logs' rank prefixes where any log has them, else its
    pods' logs (one track per rank stream: a replacement pod continues its predecessor's)."""
    if not signals:
        return []  # (at once: a run without signals is evaluated on every watch event of its pods)
    pods = {p.ref.key: p for p in ev.pods}
    live = [s for s in signals if not s.retired and not s.durable and s.ref.kind == "Pod"]

    def where(sig: Signal) -> tuple[str, str, str]:
        p = pods.get(sig.ref.key)
        f = p.facts if p is not None else None
        if isinstance(f, PodFacts):
            return sig.ref.name, f.node_name, f.rank
        return sig.ref.name, "", ""

    def role(sig: Signal) -> str:
        p = pods.get(sig.ref.key)
        return p.facts.role if p is not None and isinstance(p.facts, PodFacts) else ""

    # A Ray head's driver reports a step once its workers have: last by construction, no peer of theirs.
    workers = [s for s in live if role(s) != "ray/head"]
    if len(workers) >= MIN_TRACKS:
        live = workers

    ranked = [s for s in live if len(s.scan.ranks) >= 2]
    out: dict[str, Track] = {}
    if ranked:
        for sig in sorted(ranked, key=lambda s: s.read_at):
            pod, node, _ = where(sig)
            for rank, (steps, at) in _rank_tracks(sig.scan):
                out[rank] = Track(rank, pod, node, steps, at)  # the newest read wins
    else:
        for sig in sorted(live, key=lambda s: s.read_at):
            pod, node, rank = where(sig)
            lin = lineage.get((sig.ref.key, sig.source)) if lineage else None
            key = lin.stream if lin is not None else f"{pod}/{sig.source}"
            out[key] = Track(rank or pod, pod, node, *_sample_track(sig.scan))
    return [t for t in out.values() if len(t.steps) >= 2][:MAX_TRACKS]


Rising = tuple[tuple[int, ...], tuple[datetime, ...]]
# what `_rising` made of a scan, kept while the scan is held (one log poll changes one scan)
_BY_RANK: ByScan[tuple[tuple[str, Rising], ...]] = ByScan()
_BY_SAMPLES: ByScan[Rising] = ByScan()
_NO_STEPS: Rising = ((), ())


def _rank_tracks(scan: LogScan) -> tuple[tuple[str, Rising], ...]:
    got = _BY_RANK.get(scan)
    if got is None:
        got = tuple((str(r.rank), _rising(zip(r.steps, r.at, strict=False))) for r in scan.ranks)
        _BY_RANK.put(scan, got)
    return got


def _sample_track(scan: LogScan) -> Rising:
    if not scan.samples:
        return _NO_STEPS  # (no memo on a quiet container's scan: most of a fleet's)
    got = _BY_SAMPLES.get(scan)
    if got is None:
        got = _rising((x.step, x.at) for x in scan.samples[-4 * WINDOW:]
                      if x.step is not None and x.at is not None and not x.skipped)
        _BY_SAMPLES.put(scan, got)
    return got


def _mad(xs: Sequence[float], center: float) -> float:
    return statistics.median(abs(x - center) for x in xs)


LEAVE_ONE_OUT = 32  # up to this many ranks each is judged against the others alone; past it, against
# all of them (one rank moves a median of that many by little, and n² work would not stay bounded)


def _peers(values: Mapping[int, float]) -> dict[int, tuple[float, float, int]]:
    """rank → (median, MAD) of the other ranks' values, and how many they are."""
    if len(values) > LEAVE_ONE_OUT:
        center = statistics.median(values.values())
        mad = _mad(list(values.values()), center)
        return {i: (center, mad, len(values) - 1) for i in values}
    out = {}
    for i in values:
        others = [v for j, v in values.items() if j != i]
        center = statistics.median(others)
        out[i] = (center, _mad(others, center), len(others))
    return out


def detect(ts: Sequence[Track], now: datetime) -> Stragglers | None:
    """The suspects among `ts` at `now` (steps stamped after `now` are not known yet). None: fewer
    than two tracks (nothing to compare)."""
    ts = [Track(t.rank, t.pod, t.node, *_upto(t, now)) for t in ts]
    ts = [t for t in ts if len(t.steps) >= 2]
    if len(ts) < 2:
        return None
    if len(ts) < MIN_TRACKS:
        return Stragglers((), len(ts), 0, f"only {len(ts)} ranks print steps: too few to tell which is slow")
    newest = max(t.at[-1] for t in ts)
    # steps printed by at least MIN_TRACKS ranks (and by most of them), recent, newest WINDOW
    by_step: dict[int, dict[int, datetime]] = {}
    for i, t in enumerate(ts):
        for step, at in zip(t.steps, t.at, strict=True):
            if newest - at <= RECENT:
                by_step.setdefault(step, {})[i] = at
    need = max(MIN_TRACKS, (len(ts) + 1) // 2)
    common = sorted(k for k, v in by_step.items() if len(v) >= need)[-WINDOW:]
    pace = _pace(ts, newest)
    if len(common) < MIN_STEPS:
        if pace is not None:
            return pace
        return Stragglers((), len(ts), len(common), f"{len(common)} recent steps printed by {need}+ of the "
                          f"{len(ts)} ranks; {MIN_STEPS} needed to compare them")
    med = {k: _median_time(list(by_step[k].values())) for k in common}
    step_s = statistics.median(
        (med[b] - med[a]).total_seconds() / (b - a) for a, b in zip(common, common[1:], strict=False))
    if step_s <= 0:
        return pace or Stragglers((), len(ts), len(common), "ranks print steps with no time between them")
    # the whole window, then its newest SHORT_WINDOW steps: a straggler that began (or came back)
    # lately is named once it lags most of those, not only once it lags most of the window
    for window, share in ((common, MIN_LAST_SHARE), (common[-SHORT_WINDOW:], SHORT_LAST_SHARE)):
        suspects = _arrival(ts, by_step, med, window, step_s, share)
        if suspects:
            return _verdict(suspects, len(ts), len(window), step_s)
    if pace is not None and pace.suspects:
        return pace
    return _verdict([], len(ts), len(common), step_s)


def _arrival(ts: Sequence[Track], by_step: Mapping[int, Mapping[int, datetime]], med: Mapping[int, datetime],
             window: Sequence[int], step_s: float, min_share: float) -> list[tuple[float, Straggler]]:
    """Ranks consistently last over the steps of `window` (each step's arrivals against its median)."""
    offsets: dict[int, list[tuple[int, float]]] = {}
    last_of: dict[int, int] = {}
    for k in window:
        arr = by_step[k]
        for i, at in arr.items():
            offsets.setdefault(i, []).append((k, (at - med[k]).total_seconds()))
        last = max(arr, key=lambda i: arr[i])
        last_of[last] = last_of.get(last, 0) + 1
    lags = {i: statistics.median(o for _, o in xs) for i, xs in offsets.items() if len(xs) >= MIN_STEPS // 2}
    suspects: list[tuple[float, Straggler]] = []
    floor = 0.01 * step_s
    noise = _noise({i: [o for _, o in offsets[i]] for i in lags}, lags)
    nodes = {t.node for t in ts}
    for i, (center, mad, n_others) in _peers(lags).items():
        if n_others < MIN_TRACKS - 1:
            continue
        lag = lags[i]
        behind = lag - center
        # the spread of the ranks' lags, never below what each step's own noise leaves in a median of
        # this many steps (a few ranks' lags can agree by chance far more closely than that)
        z = behind / max(MAD_SCALE * mad, floor, noise / math.sqrt(len(offsets[i])))
        share = last_of.get(i, 0) / len(offsets[i])
        t = ts[i]
        if z < MIN_Z or behind < MIN_RATIO * step_s or share < min_share or behind >= step_s:
            continue
        if len(nodes) > 1 and behind < CLOCK_TOLERANCE.total_seconds():
            continue  # another node's clock may be this far off: not decidable
        since = _since(offsets[i], behind, center, by_step, i)
        # The step ends once the last rank is in: the others' own share of it is the step less the lag.
        ratio = behind / (step_s - behind)
        suspects.append((ratio, Straggler(
            "rank", t.rank, t.pod, t.node, ratio, since, "arrival",
            f"{_who(t)} printed {share:.0%} of the last {len(offsets[i])} steps last, a median {behind:.2f} s "
            f"after the other ranks: {ratio:.0%} slower than they are, {behind / step_s:.0%} of the run's "
            f"{step_s:.2f} s step spent waiting for it ({z:.0f} robust deviations from the {n_others} others)",
            lag_s=behind)))
    return suspects


def _noise(samples: Mapping[int, Sequence[float]], centers: Mapping[int, float]) -> float:
    """How far one step's value strays from its rank's own median (robust, pooled over the ranks),
    times the factor that makes it a median's standard error once divided by √steps."""
    residuals = [abs(x - centers[i]) for i, xs in samples.items() for x in xs]
    return MEDIAN_SE * MAD_SCALE * statistics.median(residuals) if residuals else 0.0


def _upto(t: Track, now: datetime) -> tuple[tuple[int, ...], tuple[datetime, ...]]:
    keep = [(s, a) for s, a in zip(t.steps, t.at, strict=True) if a <= now]
    return tuple(s for s, _ in keep), tuple(a for _, a in keep)


def _median_time(ats: list[datetime]) -> datetime:
    ats.sort()
    n = len(ats)
    return ats[n // 2] if n % 2 else ats[n // 2 - 1] + (ats[n // 2] - ats[n // 2 - 1]) / 2


def _since(offsets: list[tuple[int, float]], behind: float, center: float,
           by_step: Mapping[int, Mapping[int, datetime]], i: int) -> datetime | None:
    """The first step of the stretch it has been behind for: back from the newest step while its
    offset stays past half its lag (two steps off in a row end the stretch)."""
    first = None
    misses = 0
    for k, o in reversed(offsets):
        if o - center >= behind / 2:
            first, misses = k, 0
        else:
            misses += 1
            if misses >= 2:
                break
    return by_step[first][i] if first is not None else None


def _pace(ts: Sequence[Track], newest: datetime) -> Stragglers | None:
    """Ranks that do not move in lockstep: a rank whose own steps take longer than the others'."""
    per: dict[int, float] = {}
    each: dict[int, list[float]] = {}
    n_steps = 0
    for i, t in enumerate(ts):
        pts = [(s, a) for s, a in zip(t.steps, t.at, strict=True) if newest - a <= RECENT][-WINDOW:]
        rates = [(b[1] - a[1]).total_seconds() / (b[0] - a[0]) for a, b in zip(pts, pts[1:], strict=False)]
        if len(rates) >= MIN_STEPS:
            per[i] = statistics.median(rates)
            each[i] = rates
            n_steps = max(n_steps, len(rates) + 1)
    if len(per) < MIN_TRACKS:
        return None
    base = statistics.median(per.values())
    if base <= 0:
        return None
    suspects = []
    noise = _noise(each, per)
    for i, (center, mad, n_others) in _peers(per).items():
        p = per[i]
        spread = max(MAD_SCALE * mad, 0.01 * center, noise / math.sqrt(len(each[i])))
        z = (p - center) / spread if center > 0 else 0.0
        ratio = p / center - 1 if center > 0 else 0.0
        if z < MIN_Z or ratio < MIN_RATIO:
            continue
        t = ts[i]
        suspects.append((ratio, Straggler(
            "rank", t.rank, t.pod, t.node, ratio, None, "pace",
            f"{_who(t)} takes a median {p:.2f} s per step against {center:.2f} s for the other {n_others} ranks "
            f"({ratio:.0%} slower; {z:.0f} robust deviations)", lag_s=p - center)))
    return _verdict(suspects, len(ts), n_steps, base)


def _verdict(suspects: list[tuple[float, Straggler]], n: int, steps: int, step_s: float) -> Stragglers:
    if not suspects:
        return Stragglers((), n, steps, f"no rank apart: the {n} ranks kept within {MIN_RATIO:.0%} of a "
                                        f"{step_s:.2f} s step of each other over the last {steps} steps")
    if len(suspects) > max(1, n // 4):
        # a quarter of the ranks behind is not one slow rank (two groups, a topology, a shared cause)
        return Stragglers((), n, steps, f"{len(suspects)} of {n} ranks lag: not a straggler pattern "
                                        "(a group of ranks behind others); none named")
    suspects.sort(key=lambda x: -x[0])
    named = tuple(s for _, s in suspects[:MAX_SUSPECTS])
    return Stragglers(named, n, steps, "; ".join(s.evidence for s in named))


def _who(t: Track) -> str:
    where = f"pod {t.pod}" + (f" on node {t.node}" if t.node else "")
    return f"rank {t.rank} ({where})" if t.rank and t.rank != t.pod else where


KEPT_VERDICTS = 65536  # runs whose last verdict is kept (the oldest go first)
_VERDICTS: dict[Key, tuple[tuple[Track, ...], Stragglers | None]] = {}


def stragglers(ev: RunEvidence, signals: Sequence[Signal], now: datetime,
               lineage: Mapping[tuple[Key, str], Lineage] | None = None) -> Stragglers | None:
    """The engine's hook: the run's rank tracks from its progress signals, judged at `now`.

    A run's verdict is kept with the tracks it was judged from: while they are the same and none
    holds a step stamped after `now` (`detect` reads the clock for nothing else), it stands."""
    ts = tuple(tracks(ev, signals, lineage))
    if any(t.at[-1] > now for t in ts):
        return detect(ts, now)
    key = ev.key
    kept = _VERDICTS.get(key)
    if kept is not None and kept[0] == ts:
        return kept[1]
    verdict = detect(ts, now)
    _VERDICTS.pop(key, None)
    _VERDICTS[key] = (ts, verdict)
    if len(_VERDICTS) > KEPT_VERDICTS:
        del _VERDICTS[next(iter(_VERDICTS))]
    return verdict
