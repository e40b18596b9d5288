"""Progress from a Ray head's metrics: `RayProgress` turns successive scrapes into samples.

Two sources, the run's own first:

- a step counter (default `ray_train_steps_total`, a `ray.util.metrics.Counter("train_steps")` the
  training code increments): its raw value (summed over its label sets) is the step; a counter that
  falls after a restart and climbs again is replay, not progress, until it passes its old
  high-water mark (exactly how `collector.claims.progress.analyze` reads steps at or below the
  maximum already seen);
- where the run exports none, Ray Train's own metrics (`RayTrainReports`, below).

Ray Train (v2) exports, without any code in the training function (docs: Ray Train metrics):

- `ray_train_controller_state{ray_train_run_name, ray_train_run_id, ray_train_controller_state}`:
  1 for the controller's current state (INITIALIZING, SCHEDULING, RESCHEDULING, RUNNING, RESTARTING,
  RESIZING, ERRORED, FINISHED, ...), 0 for the others;
- `ray_train_report_total_blocked_time_s{..., ray_train_worker_world_rank, ray_train_worker_actor_id}`:
  per worker, the cumulative seconds its `ray.train.report()` calls took. It grows with every
  report, so a total that grew between two scrapes says "this worker reported since": activity,
  never a step number (it says nothing of how far the run got).

`RayTrainReports` reads successive scrapes and fails closed:

- activity counts only while the controller is RUNNING (its last state seen; the gauge comes and
  goes) and for a worker seen in the previous scrape (a first reading says nothing of when its
  reports were made);
- a worker's total that falls, a rank that reappears on a new actor, a new run id, or a controller
  RESTARTING/RESCHEDULING/RESIZING is a restart: what follows may replay reports already made, and
  with no step number nothing can show it passed its old mark (`RayProgress` records the restart so
  the claims read later activity as replay-or-progress: unknown);
- a sample stamped ahead of the scrape (a clock from the future) or no newer than the previous
  scrape (a stale value served again) is no activity.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from prometheus_client.metrics_core import Metric

from collector.progress import HangFinding, LogScan, ProgressSample
from collector.progress.model import ResumeFinding

DEFAULT_COUNTER = "ray_train_steps_total"  # ray.util.metrics.Counter("train_steps")
DEFAULT_LOSS = "ray_train_loss"  # ray.util.metrics.Gauge("train_loss")
SOURCE = "ray-metrics"
SAMPLE_FORMAT = "ray-metric"
HISTORY = 512  # progress samples kept per cluster
_NOTES = 16  # lasting notes (counter resets) kept per cluster

CONTROLLER_STATE = "ray_train_controller_state"
REPORT_TIME = "ray_train_report_total_blocked_time_s"
RUNNING = "RUNNING"
RESTARTING = frozenset({"RESTARTING", "RESCHEDULING", "RESIZING"})
FORMAT = "ray-train-report"
FUTURE_SLACK = timedelta(seconds=5)  # a scrape's own latency: a stamp this far ahead is still now

_RUN, _RANK, _ACTOR = "ray_train_run_id", "ray_train_worker_world_rank", "ray_train_worker_actor_id"


@dataclass(frozen=True, slots=True)
class TrainReading:
    """What one scrape of Ray Train's metrics says."""

    present: bool  # the report totals are exposed at all
    active: bool = False  # a worker reported since the previous scrape, the controller RUNNING
    restart: str = ""  # why what follows may be replay ("" when nothing started over)
    diagnostic: str = ""


@dataclass(slots=True)
class RayTrainReports:
    """Ray Train's report totals and controller state across scrapes (one instance per cluster)."""

    totals: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (run id, rank, actor)
    actors: dict[tuple[str, str], str] = field(default_factory=dict)  # (run id, rank) -> actor
    runs: set[str] = field(default_factory=set)
    last_at: datetime | None = None
    state: str = ""  # the controller's last state seen ("" never)
    restarting: bool = False  # the controller said RESTARTING (or the like) and is not RUNNING again yet

    def observe(self, families: Iterable[Metric], at: datetime) -> TrainReading:
        totals: dict[tuple[str, str, str], float] = {}
        states: list[str] = []
        future = stale = False
        horizon = (at + FUTURE_SLACK).timestamp()
        since = self.last_at.timestamp() if self.last_at is not None else None
        for fam in families:
            for smp in fam.samples:
                if smp.name not in (REPORT_TIME, CONTROLLER_STATE):
                    continue
                ts = _stamp(smp.timestamp)
                if ts is not None and ts > horizon:
                    future = True
                elif ts is not None and since is not None and ts <= since:
                    stale = True
                if smp.name == CONTROLLER_STATE:
                    if smp.value == 1:
                        states.append(smp.labels.get(CONTROLLER_STATE, ""))
                elif math.isfinite(smp.value) and smp.value >= 0:
                    key = (smp.labels.get(_RUN, ""), smp.labels.get(_RANK, ""), smp.labels.get(_ACTOR, ""))
                    totals[key] = max(totals.get(key, 0.0), smp.value)
                else:
                    return TrainReading(True, diagnostic=f"{REPORT_TIME} has invalid value {smp.value}: not progress")
        if not totals:
            return TrainReading(False)
        if future:
            return TrainReading(True, diagnostic=f"{REPORT_TIME} is stamped ahead of the scrape: not progress")
        if len(states) > 1:
            return TrainReading(True, diagnostic=f"Ray Train reports not counted: controller in {len(states)} states"
                                                 " at once")
        # Ray exports the state gauge around its changes only (Ray 2.60: gone from the scrape seconds
        # after the last transition): absent, the last state seen stands; never seen, the totals'
        # growth stands alone (workers report only while the controller runs them).
        state = states[0] if states else self.state
        self.state = state
        restart = self._restart(totals, state)
        grew = any(v > self.totals[k] for k, v in totals.items() if k in self.totals)
        self.totals, self.last_at = totals, at
        self.runs |= {run for run, _, _ in totals}
        for run, rank, actor in totals:
            self.actors[(run, rank)] = actor
        if restart:
            return TrainReading(True, restart=restart)
        if state not in (RUNNING, ""):
            return TrainReading(True, diagnostic=f"Ray Train reports not counted: controller {state}")
        if stale:
            return TrainReading(True, diagnostic=f"{REPORT_TIME} stamped no later than the previous scrape: stale")
        return TrainReading(True, active=grew)

    def _restart(self, totals: dict[tuple[str, str, str], float], state: str) -> str:
        if state in RESTARTING:
            self.restarting = True
            return f"Ray Train controller {state}"
        if self.restarting:
            # the restart the controller announced: its new actors and totals are that same restart
            self.restarting = state != RUNNING
            return ""
        for (run, rank, actor), value in totals.items():
            before = self.totals.get((run, rank, actor))
            if before is not None and value < before:
                return f"rank {rank}'s report time fell from {before:g}s to {value:g}s"
            old = self.actors.get((run, rank))
            if old is not None and old != actor:
                return f"rank {rank} reports from a new actor"
        new_runs = {run for run, _, _ in totals} - self.runs
        if self.runs and new_runs:
            return f"a new Ray Train run id {sorted(new_runs)[0]}"
        return ""


def _stamp(value: object) -> float | None:
    """A sample's exposition timestamp in seconds (prometheus_client gives a Timestamp or a float)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    sec, nsec = getattr(value, "sec", None), getattr(value, "nsec", 0)
    return float(sec) + float(nsec) / 1e9 if isinstance(sec, int) else None


def _series(families: Iterable[Metric], name: str) -> list[float]:
    names = {name} if name.endswith("_total") else {name, name + "_total"}
    return [s.value for fam in families for s in fam.samples if s.name in names]


class RayProgress:
    """Successive scrapes of one cluster → progress samples (one instance per cluster).

    The step is the counter's value summed over its label sets (WorkerId, SessionName, ...),
    as an int. A sample is kept for the first reading and then only when the step changes; a step
    that falls (a restart: the series of a restarted node start again from zero) is kept too and
    noted, and the analysis counts what follows as replay until it passes the old maximum.
    """

    def __init__(self, counter: str = DEFAULT_COUNTER, loss: str | None = DEFAULT_LOSS,
                 history: int = HISTORY) -> None:
        self.counter = counter
        self.loss = loss
        self._samples: deque[ProgressSample] = deque(maxlen=history)
        self._high: ProgressSample | None = None  # kept even after it leaves the history
        self._notes: deque[str] = deque(maxlen=_NOTES)
        self.scrapes = 0
        self.resets = 0
        self.last_value: int | None = None
        self.last_seen: datetime | None = None
        self.train = RayTrainReports()
        self._resumes: deque[ResumeFinding] = deque(maxlen=_NOTES)
        self._blind = False  # a Ray Train restart before any report activity was in view

    def observe(self, families: Sequence[Metric], at: datetime) -> tuple[ProgressSample | None, str]:
        """One scrape; returns (the new sample or None, a diagnostic for this scrape or "")."""
        self.scrapes += 1
        values = _series(families, self.counter)
        if not values and self.last_value is None:
            # No step counter of the run's own (yet): Ray Train's built-in report totals, where exposed.
            reading = self.train.observe(families, at)
            if reading.present:
                return self._train_reports(reading, families, at)
        if not values:
            if self.last_seen is None:
                return None, f"metric {self.counter} not exposed ({len(families)} metric families read)"
            return None, f"metric {self.counter} not exposed since {self.last_seen.isoformat()}"
        bad = [v for v in values if not math.isfinite(v) or v < 0]
        if bad:
            return None, f"metric {self.counter} has invalid value {bad[0]}: not progress"
        step = int(math.fsum(values))
        self.last_seen = at
        if step == self.last_value:
            return None, ""
        prev = self.last_value
        self.last_value = step
        sample = ProgressSample(step=step, at=at, loss=self._loss(families), line=0, format=SAMPLE_FORMAT)
        if prev is not None and step < prev:
            self.resets += 1
            high = self._high.step if self._high else prev
            self._notes.append(f"{self.counter} fell from {prev} to {step} at {at.isoformat()} (restart); "
                               f"steps up to {high} are replay")
        if self._high is None or step > (self._high.step or 0):
            self._high = sample
        self._samples.append(sample)
        return sample, ""

    def _train_reports(self, reading: TrainReading, families: Sequence[Metric],
                       at: datetime) -> tuple[ProgressSample | None, str]:
        """Ray Train's report activity as stepless samples; a restart is kept as a resume, so the
        claims read what follows as replay-or-progress (unknown), never as progress."""
        if reading.restart:
            self.resets += 1
            self._notes.append(f"{reading.restart} at {at.isoformat()} (restart): later reports may replay ones"
                               " made before it")
            if self._samples:
                # (past line 0: after the samples, for `restarts_inside`)
                self._resumes.append(ResumeFinding(line=self.scrapes, at=at, step=None, format=FORMAT))
            else:
                self._blind = True
            return None, ""
        if not reading.active:
            return None, reading.diagnostic
        if self._blind:
            return None, "Ray Train reports after a restart, none before it in view: replay or progress unknown"
        # line 0 as the counter's: the signal's hang findings carry job-log line numbers, not scrapes
        sample = ProgressSample(step=None, at=at, loss=self._loss(families), line=0, format=FORMAT)
        self.last_seen = at
        self._samples.append(sample)
        return sample, ""

    def _loss(self, families: Sequence[Metric]) -> float | None:
        if not self.loss:
            return None
        values = [s.value for fam in families for s in fam.samples if s.name == self.loss]
        if not values:
            return None
        bad = [v for v in values if not math.isfinite(v)]
        return bad[0] if bad else math.fsum(values) / len(values)

    @property
    def samples(self) -> tuple[ProgressSample, ...]:
        out = tuple(self._samples)
        high = self._high
        if high is not None and out and (high.step or 0) > max(s.step or 0 for s in out):
            out = (high, *out)  # keep the high-water mark so replay stays replay
        return out

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(self._notes)

    def scan(self, *, hangs: Sequence[HangFinding] = (), diagnostics: Sequence[str] = (),
             with_samples: bool = True) -> LogScan:
        samples = self.samples if with_samples else ()
        return LogScan(
            source=SOURCE,
            format=SAMPLE_FORMAT if samples else None,
            samples=samples,
            hangs=tuple(hangs),
            xids=(),
            diagnostics=(*self.notes, *(d for d in diagnostics if d)),
            lines=self.scrapes,  # scrapes read, the metrics analogue of log lines
            resumes=tuple(self._resumes),
        )
