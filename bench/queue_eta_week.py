"""Backtest of the admission estimate on a simulated week: how often did the real admission fall
inside the band?

`kubesim.queueplay` plays a Kueue ClusterQueue for a week on a manual clock (arrivals that swing
over the day, high-priority arrivals that jump the queue, log-normal durations, StrictFIFO
admission under a GPU quota). Every `--every` of scenario time, the collector's own path reads the
simulator over HTTP: the visibility API for the queue's pending Workloads and their positions
(collector/sources/visibility.py), the Workloads for the queue's history (normalized by
collector.kube), and `admission_eta` gives each pending Workload a band. The player knows when each
was really admitted: a prediction holds when the admission fell inside its band. Predictions whose
band reaches past the week's end while the Workload is still pending are censored (left out).

Usage: .venv/bin/python bench/queue_eta_week.py [--days 7] [--every 1h] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

for _p in (Path(__file__).resolve().parents[1],):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from collector import kube  # noqa: E402
from collector.claims.queue_eta import LEVEL, admission_eta  # noqa: E402
from collector.claims.queue_status import history, pending_waits  # noqa: E402
from collector.model import Blocked, Claim, ObjectRecord, Observed, Ref, RunClaims, Stage, verdict_for  # noqa: E402
from collector.queuefacts import AdmissionEta, QueueStatus  # noqa: E402
from collector.sources.kube_api import KubeApi, Resource, api_client_for  # noqa: E402
from collector.sources.visibility import read_cluster_queue  # noqa: E402
from exporters.adx.rows import snapshot_row  # noqa: E402
from kubesim import ManualClock, Simulator  # noqa: E402
from kubesim.queueplay import QueuePlay, QueuePlayer  # noqa: E402

T0 = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)  # a Monday
WORKLOADS = Resource("Workload", "kueue.x-k8s.io", "v1beta1", "workloads")


@dataclass(frozen=True, slots=True)
class Prediction:
    namespace: str
    workload: str
    at: datetime
    position: int
    low_s: float
    mid_s: float
    high_s: float


@dataclass(slots=True)
class Backtest:
    level: float
    predictions: list[Prediction] = field(default_factory=list)
    unknown: int = 0  # pending Workloads sampled while the history was too short
    inside: int = 0
    below: int = 0  # admitted sooner than the band's low bound
    above: int = 0  # later than its high bound (or still pending past it)
    censored: int = 0
    arrivals: int = 0
    admissions: int = 0
    samples: int = 0
    admitted_at: dict[str, datetime] = field(default_factory=dict)  # the truth: each Workload's admission
    end: datetime = T0

    @property
    def judged(self) -> int:
        return self.inside + self.below + self.above

    @property
    def coverage(self) -> float:
        return self.inside / self.judged if self.judged else float("nan")

    def summary(self) -> str:
        return (f"{self.arrivals} arrivals, {self.admissions} admissions, {self.samples} samples; "
                f"{self.judged} estimates judged ({self.censored} censored, {self.unknown} unknown): "
                f"{self.coverage:.1%} inside the {self.level:.0%} band, {self.below} admitted sooner, "
                f"{self.above} later")


def backtest(days: float = 7, every: timedelta = timedelta(hours=1), seed: int = 1,
             play: QueuePlay | None = None) -> Backtest:
    play = play or QueuePlay(seed=seed)
    clock = ManualClock(T0)
    out = Backtest(LEVEL)
    with Simulator(clock=clock) as sim:
        url = sim.start("127.0.0.1:0")
        api = KubeApi(api_client_for(url))
        player = QueuePlayer(sim, clock, play)
        player.setup()

        def sample(now: datetime) -> None:
            out.samples += 1
            summary = read_cluster_queue(api, play.cluster_queue)
            records = [r for obj in api.iter_list(WORKLOADS)
                       if isinstance(r := kube.normalize(obj).record, ObjectRecord)]
            admissions, finishes, waits, oldest = history(records, play.cluster_queue)
            waits += pending_waits(summary, records, now)
            for item in summary.items:
                eta = admission_eta(item.position_cq, admissions, finishes, now, waits=waits, observed_since=oldest,
                                    queue=play.cluster_queue)
                if eta.low_s is None or eta.mid_s is None or eta.high_s is None:
                    out.unknown += 1
                    continue
                out.predictions.append(Prediction(item.namespace, item.name, now, item.position_cq, eta.low_s,
                                                  eta.mid_s, eta.high_s))

        end = T0 + timedelta(days=days)
        player.run(timedelta(days=days), every, sample)
    out.arrivals = len(player.admissions) + sum(1 for w in player.workloads.values() if w.admitted is None)
    out.admissions = len(player.admissions)
    out.admitted_at = dict(player.admissions)
    out.end = end
    for p in out.predictions:
        admitted = player.admissions.get(p.workload)
        if admitted is None:
            if p.at + timedelta(seconds=p.high_s) < end:
                out.above += 1
            else:
                out.censored += 1
            continue
        wait = (admitted - p.at).total_seconds()
        if wait < p.low_s:
            out.below += 1
        elif wait > p.high_s:
            out.above += 1
        else:
            out.inside += 1
    return out


def snapshot_rows(res: Backtest, cluster: str = "sim") -> list[dict[str, Any]]:
    """The RunSnapshots rows the controller's ADX exporter would have written for this week (through
    exporters.adx.rows): one per estimate while waiting, one as each run leaves the queue (a
    snapshot is written when the blocked stage changes)."""
    out = []
    ns_of = {p.workload: p.namespace for p in res.predictions}
    for p in res.predictions:
        eta = AdmissionEta(p.low_s, p.mid_s, p.high_s, res.level, "")
        q = QueueStatus("gpu", "", f"{p.namespace}/{p.workload}", p.position, None, None, (), (), eta, "")
        out.append(snapshot_row(_claims(p.namespace, p.workload, p.at, queued=True, queue=q), cluster, None))
    for name, at in res.admitted_at.items():
        if name in ns_of:
            out.append(snapshot_row(_claims(ns_of[name], name, at, queued=False), cluster, None))
    return out


def _claims(ns: str, name: str, at: datetime, *, queued: bool, queue: QueueStatus | None = None) -> RunClaims:
    c = Claim(None, Observed.FALSE, verdict_for(None, Observed.FALSE), None, "")
    blocked = Blocked(Stage.QUEUE_ADMISSION if queued else Stage.POD_SCHEDULING, "", None)
    return RunClaims(Ref("Job", ns, name, f"uid-{name}"), c, c, c, blocked, at, queue=queue)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--every", type=float, default=60, help="minutes between samples")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    res = backtest(a.days, timedelta(minutes=a.every), a.seed)
    print(res.summary())


if __name__ == "__main__":
    main()
