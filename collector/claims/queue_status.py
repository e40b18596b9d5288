"""Where a run blocked in queue admission stands: its position in its LocalQueue and ClusterQueue
(Kueue's visibility API), the workloads ahead of it and what they request, the quota it needs that is
not free now (per flavor and resource), and an estimate of the time to admission (queue_eta.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from collector.claims.queue_eta import LEVEL, MIN_ADMISSIONS, WINDOW, QueueRate, eta_for, queue_rate
from collector.correlate import RunEvidence
from collector.model import ObjectRecord, QueueFacts, RunClaims, Stage, WorkloadFacts
from collector.queuefacts import AdmissionEta, AheadWorkload, PendingItem, PendingSummary, QueueStatus, QuotaShort

MAX_AHEAD = 5  # workloads ahead listed by name; the count covers them all
WAITED = timedelta(seconds=60)  # a Workload admitted later than this after its creation waited for quota


def pending_workload(ev: RunEvidence) -> ObjectRecord | None:
    """The run's Workload that waits for quota (active or not), if any."""
    for wl in ev.workloads:
        reserved, finished = wl.condition("QuotaReserved"), wl.condition("Finished")
        if isinstance(wl.facts, WorkloadFacts) and not (reserved is not None and reserved.is_true) \
                and not (finished is not None and finished.is_true):
            return wl
    return None


def cluster_queue_of(ev: RunEvidence, wl: ObjectRecord) -> str:
    f = wl.facts
    if isinstance(f, WorkloadFacts) and f.cluster_queue:
        return f.cluster_queue
    lq = ev.local_queue.facts if ev.local_queue is not None else None
    return lq.cluster_queue if isinstance(lq, QueueFacts) else ""


def history(workloads: Iterable[ObjectRecord], cluster_queue: str) -> tuple[list[datetime], list[datetime],
                                                                               list[tuple[datetime, datetime]],
                                                                               datetime | None]:
    """The ClusterQueue's admissions (quota reservations), finishes and waits (creation to admission,
    where it took over WAITED) among the Workloads still kept, and the oldest Workload's creation (the
    history begins no earlier)."""
    admissions: list[datetime] = []
    finishes: list[datetime] = []
    waits: list[tuple[datetime, datetime]] = []
    oldest: datetime | None = None
    for wl in workloads:
        f = wl.facts
        if not isinstance(f, WorkloadFacts):
            continue
        if wl.created is not None and (oldest is None or wl.created < oldest):
            oldest = wl.created
        if f.cluster_queue != cluster_queue:
            continue
        reserved, finished = wl.condition("QuotaReserved"), wl.condition("Finished")
        if reserved is not None and reserved.is_true and reserved.last_transition is not None:
            admissions.append(reserved.last_transition)
            if wl.created is not None and reserved.last_transition - wl.created > WAITED:
                waits.append((wl.created, reserved.last_transition))
        if finished is not None and finished.is_true and finished.last_transition is not None:
            finishes.append(finished.last_transition)
    return admissions, finishes, waits, oldest


def pending_waits(summary: PendingSummary | None, workloads: Iterable[ObjectRecord] | Workloads, now: datetime
                  ) -> list[tuple[datetime, datetime]]:
    """The waits still going on: each pending Workload's creation to now."""
    if summary is None:
        return []
    index = workloads if isinstance(workloads, Workloads) else Workloads(workloads)
    return [(w.created, now) for i in summary.items
            if (w := index.get(i.namespace, i.name)) is not None and w.created is not None and w.created < now]


class Workloads:
    """The Workloads a reader sees, indexed once for every queued run of one evaluation: by name, and
    each ClusterQueue's history, its admission rate and its pending list in order computed once (a
    queue of N waiting runs cost N times its history per pass: O(N^2), 10 % of a 50k-pod controller)."""

    def __init__(self, records: Iterable[ObjectRecord]) -> None:
        self.records = [r for r in records if isinstance(r.facts, WorkloadFacts)]
        self._by_name = {(w.ref.namespace, w.ref.name): w for w in self.records}
        self._history: dict[str, tuple[list[datetime], list[datetime], list[tuple[datetime, datetime]],
                                       datetime | None]] = {}
        # by everything the answer is computed from; the summary itself is kept beside it, so its id
        # cannot be another's while the entry stands
        self._rates: dict[tuple[object, ...], tuple[PendingSummary | None, QueueRate]] = {}
        # per summary: its items in queue order, and the first of each Workload by name
        self._views: dict[int, tuple[PendingSummary, list[PendingItem], dict[tuple[str, str], PendingItem]]] = {}

    def rate(self, cluster_queue: str, summary: PendingSummary | None, now: datetime, *, window: timedelta,
             min_admissions: int) -> QueueRate:
        """The ClusterQueue's `queue_rate` at `now`, with the waits still going on in `summary`."""
        key = (cluster_queue, id(summary), now, window, min_admissions)
        kept = self._rates.get(key)
        if kept is not None and kept[0] is summary:
            return kept[1]
        admissions, finishes, waits, oldest = self.history(cluster_queue)
        waits += pending_waits(summary, self, now)
        rate = queue_rate(admissions, finishes, now, waits=waits, window=window, min_admissions=min_admissions,
                          observed_since=oldest, queue=cluster_queue)
        self._rates[key] = (summary, rate)
        return rate

    def _view(self, summary: PendingSummary) -> tuple[PendingSummary, list[PendingItem],
                                                      dict[tuple[str, str], PendingItem]]:
        kept = self._views.get(id(summary))
        if kept is None or kept[0] is not summary:
            named: dict[tuple[str, str], PendingItem] = {}
            for i in summary.items:
                named.setdefault((i.namespace, i.name), i)
            kept = self._views[id(summary)] = (summary, sorted(summary.items, key=lambda i: i.position_cq), named)
        return kept

    def find(self, summary: PendingSummary, namespace: str, name: str) -> PendingItem | None:
        """The first item of `summary` for that Workload."""
        return self._view(summary)[2].get((namespace, name))

    def ordered(self, summary: PendingSummary) -> list[PendingItem]:
        """`summary.items` by their place in the ClusterQueue."""
        return self._view(summary)[1]

    def get(self, namespace: str, name: str) -> ObjectRecord | None:
        return self._by_name.get((namespace, name))

    def history(self, cluster_queue: str) -> tuple[list[datetime], list[datetime], list[tuple[datetime, datetime]],
                                                   datetime | None]:
        if cluster_queue not in self._history:
            self._history[cluster_queue] = history(self.records, cluster_queue)
        a, f, w, oldest = self._history[cluster_queue]
        return list(a), list(f), list(w), oldest


def queue_status(ev: RunEvidence, summary: PendingSummary | None, workloads: Sequence[ObjectRecord] | Workloads,
                 now: datetime,
                 *, note: str = "", window: timedelta = WINDOW, level: float = LEVEL,
                 min_admissions: int = MIN_ADMISSIONS) -> QueueStatus | None:
    """The run's queue status; None when it has no Workload waiting for quota. `summary`: the visibility
    API's answer for its ClusterQueue (or LocalQueue), None when not read (`note` says why)."""
    wl = pending_workload(ev)
    if wl is None:
        return None
    f = wl.facts
    assert isinstance(f, WorkloadFacts)
    cq = cluster_queue_of(ev, wl)
    ns, name = wl.ref.namespace, wl.ref.name
    index = workloads if isinstance(workloads, Workloads) else Workloads(workloads)
    mine = index.find(summary, ns, name) if summary else None
    ahead: list[AheadWorkload] = []
    if summary is not None and mine is not None:
        for i in index.ordered(summary):
            if i.position_cq >= mine.position_cq or len(ahead) >= MAX_AHEAD:
                break
            other = index.get(i.namespace, i.name)
            reqs = other.facts.requests if other is not None and isinstance(other.facts, WorkloadFacts) else ()
            ahead.append(AheadWorkload(i.namespace, i.name, i.priority, i.position_cq, reqs))
    if mine is None:
        why = note or (f"the visibility API does not list {ns}/{name} in {summary.queue}" if summary
                       else "the visibility API was not read")
        eta = AdmissionEta(None, None, None, level, f"unknown: the run's position is unknown ({why})")
        source = why
    else:
        rate = index.rate(cq, summary, now, window=window, min_admissions=min_admissions)
        eta = eta_for(rate, mine.position_cq, level=level, min_admissions=min_admissions)
        source = f"Kueue visibility API ({summary.queue if summary else ''})"
    cqf = ev.cluster_queue.facts if ev.cluster_queue is not None else None
    short = quota_short(dict(f.requests), cqf.quota, cqf.reserved) if isinstance(cqf, QueueFacts) else ()
    pending_cq = len(summary.items) if summary is not None and summary.queue.startswith("ClusterQueue/") else None
    return QueueStatus(cq, f.queue_name, f"{ns}/{name}", mine.position_cq if mine else None,
                       mine.position_lq if mine else None, pending_cq, tuple(ahead), short, eta, source)


def quota_short(requests: Mapping[str, float], quota: Iterable[tuple[str, str, float]],
                reserved: Iterable[tuple[str, str, float]]) -> tuple[QuotaShort, ...]:
    """Per flavor and resource the run requests: its need against the nominal quota not reserved now;
    only where the need exceeds what is free."""
    used = {(fl, res): v for fl, res, v in reserved}
    out = []
    for flavor, res, nominal in quota:
        need = requests.get(res)
        if need is None or need <= 0:
            continue
        free = max(0.0, nominal - used.get((flavor, res), 0.0))
        if need > free:
            out.append(QuotaShort(flavor, res, need, free, nominal))
    return tuple(out)


def attach(rc: RunClaims, ev: RunEvidence, summary: PendingSummary | None,
           workloads: Sequence[ObjectRecord] | Workloads,
           now: datetime, *, note: str = "") -> RunClaims:
    """`rc` with its queue status when it is blocked in queue admission (else unchanged)."""
    if rc.blocked is None or rc.blocked.stage is not Stage.QUEUE_ADMISSION or rc.finished:
        return rc
    status = queue_status(ev, summary, workloads, now, note=note)
    if status is None:
        return rc
    return replace(rc, queue=status)
