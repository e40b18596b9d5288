"""A Kueue ClusterQueue played for days on a manual clock: workloads arrive, wait, are admitted when
the quota frees up, run and finish; the store holds what Kueue would (Workloads with their
QuotaReserved and Finished conditions, the ClusterQueue's flavorsReservation), so the visibility API
(kubesim/visibility.py) answers from it. What really happened (each Workload's admission time) is the
ground truth an admission estimate is judged against.

Admission is Kueue's StrictFIFO: the queue's head (higher priority first, then older) is admitted as
soon as its GPUs fit under the nominal quota; nothing behind it overtakes it. Arrivals are a Poisson
process whose rate swings over the day (busier in the working hours), sizes and durations are drawn
per workload (durations log-normal), and a share of arrivals comes at a higher priority, jumping the
queue: the things a real queue does to an estimate.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from kubesim.clock import ManualClock, rfc3339
from kubesim.server import Simulator

GV = "kueue.x-k8s.io/v1beta1"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class QueuePlay:
    """The queue and its load."""

    cluster_queue: str = "gpu"
    flavor: str = "a100"
    gpus: int = 64  # nominal quota
    local_queues: tuple[tuple[str, str], ...] = (("team-a", "a"), ("team-b", "b"), ("team-c", "c"))
    arrivals_per_hour: float = 1.2  # the mean; the hourly rate swings ±`swing` over the day
    swing: float = 0.5
    sizes: tuple[tuple[int, float], ...] = ((8, 0.5), (16, 0.3), (32, 0.2))  # GPUs, share
    median_hours: float = 2.5  # log-normal durations
    sigma: float = 0.8
    high_priority_share: float = 0.1
    keep_finished: timedelta = timedelta(hours=36)  # finished Workloads are deleted after this (their jobs' TTL)
    seed: int = 1


@dataclass(slots=True)
class _Wl:
    name: str
    namespace: str
    queue: str
    gpus: int
    hours: float
    priority: int
    arrived: datetime
    admitted: datetime | None = None
    finished: datetime | None = None


@dataclass(slots=True)
class QueuePlayer:
    """Plays `play` against `sim` from the clock's now; `sample(now)` is called every `every` of scenario time."""

    sim: Simulator
    clock: ManualClock
    play: QueuePlay = field(default_factory=QueuePlay)
    workloads: dict[str, _Wl] = field(default_factory=dict)
    admissions: dict[str, datetime] = field(default_factory=dict)  # every admission, kept after the Workload goes
    _used: int = 0
    _count: int = 0

    def setup(self) -> None:
        p = self.play
        self.sim.apply({"apiVersion": GV, "kind": "ResourceFlavor", "metadata": {"name": p.flavor}, "spec": {}})
        self.sim.apply({"apiVersion": GV, "kind": "ClusterQueue", "metadata": {"name": p.cluster_queue},
                        "spec": {"queueingStrategy": "StrictFIFO", "namespaceSelector": {}, "resourceGroups": [
                            {"coveredResources": [GPU], "flavors": [
                                {"name": p.flavor, "resources": [{"name": GPU, "nominalQuota": p.gpus}]}]}]}})
        for ns, lq in p.local_queues:
            self.sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            self.sim.apply({"apiVersion": GV, "kind": "LocalQueue", "metadata": {"name": lq, "namespace": ns},
                            "spec": {"clusterQueue": p.cluster_queue}})
        self._cq_status()

    def run(self, duration: timedelta, every: timedelta, sample: Callable[[datetime], None]) -> None:
        p = self.play
        rng = random.Random(p.seed)
        start = self.clock.now()
        end = start + duration
        events: list[tuple[datetime, int, str, str]] = []  # (when, order, kind, workload)
        seq = 0

        def push(when: datetime, kind: str, name: str = "") -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(events, (when, seq, kind, name))

        push(start + timedelta(hours=self._next_arrival(rng, 0.0)), "arrive")
        t = start + every
        while t <= end:
            push(t, "sample")
            t += every
        while events:
            when, _, kind, name = heapq.heappop(events)
            if when > end:
                break
            self.clock.set(when)
            if kind == "arrive":
                self._arrive(rng, when)
                push(when + timedelta(hours=self._next_arrival(rng, (when - start).total_seconds() / 3600)), "arrive")
            elif kind == "finish":
                self._finish(self.workloads[name], when)
            elif kind == "gc":
                self._delete(self.workloads.pop(name))
                continue
            else:
                sample(when)
                continue
            for admitted in self._admit(when):
                push(when + timedelta(hours=admitted.hours), "finish", admitted.name)
            if kind == "finish":
                push(when + p.keep_finished, "gc", name)

    # ----------------------------------------------------------------- the queue
    def _next_arrival(self, rng: random.Random, hour: float) -> float:
        """Hours to the next arrival of a Poisson process whose rate follows the day (thinning)."""
        p = self.play
        peak = p.arrivals_per_hour * (1 + p.swing)
        h = hour
        while True:
            h += rng.expovariate(peak)
            rate = p.arrivals_per_hour * (1 + p.swing * math.sin(2 * math.pi * (h % 24 - 8) / 24))
            if rng.random() * peak <= rate:
                return h - hour

    def _arrive(self, rng: random.Random, now: datetime) -> None:
        p = self.play
        ns, lq = rng.choice(p.local_queues)
        gpus = rng.choices([s for s, _ in p.sizes], [w for _, w in p.sizes])[0]
        hours = math.exp(math.log(p.median_hours) + p.sigma * rng.gauss(0, 1))
        prio = 100 if rng.random() < p.high_priority_share else 0
        self._count += 1
        wl = _Wl(f"job-{self._count:05d}", ns, lq, gpus, hours, prio, now)
        self.workloads[wl.name] = wl
        self.sim.apply({"apiVersion": GV, "kind": "Workload", "metadata": {"name": wl.name, "namespace": ns},
                        "spec": {"queueName": lq, "priority": prio, "active": True, "podSets": [
                            {"name": "main", "count": gpus // 8, "template": {"spec": {"containers": [
                                {"name": "main", "resources": {"requests": {GPU: "8"}}}]}}}]},
                        "status": {"conditions": [self._cond("QuotaReserved", False, "Pending", now,
                                                             f"couldn't assign flavors: insufficient unused quota for"
                                                             f" {GPU} in flavor {p.flavor}")]}})

    def _admit(self, now: datetime) -> list[_Wl]:
        """StrictFIFO: admit the head while it fits."""
        p = self.play
        out = []
        pending = sorted((w for w in self.workloads.values() if w.admitted is None),
                         key=lambda w: (-w.priority, w.arrived, w.name))
        for w in pending:
            if self._used + w.gpus > p.gpus:
                break
            w.admitted = now
            self.admissions[w.name] = now
            self._used += w.gpus
            out.append(w)
            self._status(w, [self._cond("QuotaReserved", True, "QuotaReserved", now,
                                        f"Quota reserved in ClusterQueue {p.cluster_queue}"),
                             self._cond("Admitted", True, "Admitted", now, "The workload is admitted")],
                         {"clusterQueue": p.cluster_queue, "podSetAssignments": [
                             {"name": "main", "count": w.gpus // 8, "flavors": {GPU: p.flavor},
                              "resourceUsage": {GPU: str(w.gpus)}}]})
        if out:
            self._cq_status()
        return out

    def _finish(self, w: _Wl, now: datetime) -> None:
        w.finished = now
        self._used -= w.gpus
        self._status(w, [self._cond("QuotaReserved", True, "QuotaReserved", w.admitted or now,
                                    f"Quota reserved in ClusterQueue {self.play.cluster_queue}"),
                         self._cond("Admitted", True, "Admitted", w.admitted or now, "The workload is admitted"),
                         self._cond("Finished", True, "Succeeded", now, "Job finished successfully")], None)
        self._cq_status()

    def _delete(self, w: _Wl) -> None:
        rt = self.sim.resource(GV, "Workload")
        self.sim.store.delete(rt, w.namespace, w.name)

    def _status(self, w: _Wl, conditions: list[dict[str, str]], admission: dict[str, object] | None) -> None:
        rt = self.sim.resource(GV, "Workload")
        status: dict[str, object] = {"conditions": conditions}
        if admission is not None:
            status["admission"] = admission

        def put(cur: dict[str, object]) -> dict[str, object]:
            old = cur.get("status")
            keep = {k: v for k, v in old.items() if k != "conditions"} if isinstance(old, dict) else {}
            return {**cur, "status": {**keep, **status}}

        self.sim.store.patch(rt, w.namespace, w.name, put, subresource="status")

    def _cq_status(self) -> None:
        p = self.play
        pending = sum(1 for w in self.workloads.values() if w.admitted is None)
        running = sum(1 for w in self.workloads.values() if w.admitted is not None and w.finished is None)
        used = [{"name": p.flavor, "resources": [{"name": GPU, "total": str(self._used), "borrowed": "0"}]}]
        rt = self.sim.resource(GV, "ClusterQueue")
        status = {"pendingWorkloads": pending, "reservingWorkloads": running, "admittedWorkloads": running,
                  "flavorsReservation": used, "flavorsUsage": used}
        self.sim.store.patch(rt, "", p.cluster_queue, lambda cur: {**cur, "status": status}, subresource="status")

    def _cond(self, kind: str, status: bool, reason: str, at: datetime, message: str) -> dict[str, str]:
        return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": message,
                "lastTransitionTime": rfc3339(at)}
