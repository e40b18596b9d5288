"""One evaluation's queued runs share their ClusterQueue's history, rate and pending list
(`queue_status.Workloads`): each run's estimate is the one `admission_eta` gives it alone."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from collector.claims.queue_eta import admission_eta, eta_for
from collector.claims.queue_status import Workloads, pending_waits
from collector.kube import normalize
from collector.model import ObjectRecord
from collector.queuefacts import PendingItem, PendingSummary

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def workload(name: str, cq: str, created: datetime, admitted: datetime | None,
             finished: datetime | None = None) -> ObjectRecord:
    conditions: list[dict[str, Any]] = []
    status: dict[str, Any] = {"conditions": conditions}
    if admitted is not None:
        status["admission"] = {"clusterQueue": cq, "podSetAssignments": []}
        conditions.append({"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "",
                           "lastTransitionTime": _stamp(admitted)})
    if finished is not None:
        conditions.append({"type": "Finished", "status": "True", "reason": "Succeeded", "message": "",
                           "lastTransitionTime": _stamp(finished)})
    rec = normalize({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                     "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                                  "creationTimestamp": _stamp(created)},
                     "spec": {"queueName": "lq", "podSets": [{"name": "main", "count": 1}]},
                     "status": status}).record
    assert rec is not None
    return rec


def fleet(seed: int) -> tuple[list[ObjectRecord], dict[str, PendingSummary]]:
    rng = random.Random(seed)
    records, summaries = [], {}
    for q in range(3):
        cq = f"cq-{q}"
        for i in range(rng.randrange(0, 40)):
            created = NOW - timedelta(minutes=rng.uniform(1, 30 * 60))
            admitted = created + timedelta(seconds=rng.choice([5, 30, 90, 600, 3600]))
            if admitted > NOW:
                admitted = NOW - timedelta(seconds=1)
            done = admitted + timedelta(minutes=rng.uniform(1, 120))
            records.append(workload(f"{cq}-done-{i}", cq, created, admitted, done if done < NOW else None))
        items = []
        for i in range(rng.randrange(0, 30)):
            name = f"{cq}-wait-{i}"
            records.append(workload(name, cq, NOW - timedelta(minutes=rng.uniform(1, 600)), None))
            items.append(PendingItem("team", name, "lq", rng.randrange(3), i, i))
        rng.shuffle(items)
        summaries[cq] = PendingSummary(f"ClusterQueue/{cq}", tuple(items), NOW)
    return records, summaries


def test_each_queued_run_gets_the_estimate_it_would_get_alone() -> None:
    for seed in range(20):
        records, summaries = fleet(seed)
        shared = Workloads(records)
        for later in (timedelta(0), timedelta(minutes=7)):  # one Workloads asked at two instants
            now = NOW + later
            for cq, summary in summaries.items():
                for item in summary.items:
                    alone = Workloads(records)
                    admissions, finishes, waits, oldest = alone.history(cq)
                    want = admission_eta(item.position_cq, admissions, finishes, now,
                                         waits=waits + pending_waits(summary, alone, now), observed_since=oldest,
                                         queue=cq)
                    got = shared.rate(cq, summary, now, window=timedelta(hours=24), min_admissions=5)
                    assert eta_for(got, item.position_cq) == want, (seed, cq, item)
                    assert shared.find(summary, "team", item.name) == item
                    assert shared.ordered(summary) == sorted(summary.items, key=lambda i: i.position_cq)
                assert shared.find(summary, "team", "no-such-workload") is None


def test_a_summary_read_again_is_not_served_the_last_ones_answer() -> None:
    records, summaries = fleet(3)
    shared = Workloads(records)
    cq, summary = next((k, v) for k, v in summaries.items() if v.items)
    first = shared.rate(cq, summary, NOW, window=timedelta(hours=24), min_admissions=5)
    fewer = PendingSummary(summary.queue, summary.items[:1], NOW)
    again = shared.rate(cq, fewer, NOW, window=timedelta(hours=24), min_admissions=5)
    alone = Workloads(records).rate(cq, fewer, NOW, window=timedelta(hours=24), min_admissions=5)
    assert again == alone
    last = summary.items[-1]
    assert shared.ordered(fewer) == list(fewer.items)
    assert shared.find(fewer, "team", last.name) == (last if last is fewer.items[0] else None)
    assert first.hist == again.hist
