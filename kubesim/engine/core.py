"""The engine's core: the scenario clock and its due-queue, the step loop, and the helpers every
part of the engine writes through (create, patch, status, conditions, Events, container logs, the
TauRun and Workload status writers). The concerns sit in mixins beside it; `ScenarioEngine`
(kubesim/engine/__init__.py) combines them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from kubesim.client import KubeClient
from kubesim.clock import Clock, ManualClock, ScaledClock, rfc3339, rfc3339_micro
from kubesim.engine.state import _SUFFIX, NodeState, Obj, PodState, QueueTally, Ref, RunState
from kubesim.errors import ApiError
from kubesim.registry import Registry
from kubesim.scenario import Scenario, Step

log = logging.getLogger(__name__)


class EngineCore:
    """State and write helpers shared by every part of the engine."""

    def __init__(
        self,
        scenario: Scenario,
        client_base_url: str,
        clock: Clock | None = None,
        speed: float = 1.0,
        registry: Registry | None = None,
    ) -> None:
        if clock is None:
            clock = ScaledClock(speed)
        elif speed != 1.0 and not (isinstance(clock, ScaledClock) and clock.speed == speed):
            raise ValueError("speed applies to the engine's own clock; pass ScaledClock(speed) instead")
        self.scenario = scenario
        self.clock: Clock = clock
        self.client = KubeClient(client_base_url, registry)
        self._rng = random.Random(scenario.seed)
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._origin: datetime | None = None
        self.elapsed = 0.0
        self.nodes: dict[str, NodeState] = {}
        self.runs: dict[tuple[str, str], RunState] = {}
        # flavor -> (node count when built, GPU nodes of that flavor, all GPU nodes): the scheduler's candidates
        self._gpu_node_cache: dict[str, tuple[int, list[NodeState], list[NodeState]]] = {}
        self._events: dict[tuple[str, str, str], tuple[str, int, str]] = {}
        self._queue_status: dict[str, Obj] = {}
        self._queues = QueueTally()  # the runs' counts per Kueue queue, kept as flags change
        self._taucluster: Ref | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.errors: list[str] = []

    @property
    def origin(self) -> datetime:
        """Scenario time zero."""
        if self._origin is None:
            if isinstance(self.clock, ManualClock) and self.scenario.start is not None:
                self.clock.set(self.scenario.start)
            self._origin = self.clock.now()
            self._setup()
        return self._origin

    def _setup(self) -> None:
        """Queue the scenario's actions (the Submission mixin); called once, when time zero is fixed."""
        raise NotImplementedError

    def _submit(self, r: RunState) -> None:
        """Create a run's objects (the Submission mixin)."""
        raise NotImplementedError

    def _run_action(self, r: RunState, step: Step) -> None:
        """Play one step of a run's timeline (ScenarioEngine dispatches it to the concern that owns it)."""
        raise NotImplementedError

    def _at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (t, next(self._seq), fn))

    def _after(self, delay: float, fn: Callable[[], None]) -> None:
        self._at(self.elapsed + delay, fn)

    def next_due(self) -> float | None:
        """Scenario seconds of the next pending action (None when nothing is left)."""
        _ = self.origin
        return self._queue[0][0] if self._queue else None

    def step_to(self, t: float) -> int:
        """Run every action due at or before `t` scenario seconds; returns how many ran.

        With a ManualClock the clock is moved to each action's time first, so timestamps are exact.
        """
        with self._lock:
            origin = self.origin
            done = 0
            while self._queue and self._queue[0][0] <= t:
                due, _, fn = heapq.heappop(self._queue)
                self.elapsed = max(self.elapsed, due)
                if isinstance(self.clock, ManualClock):
                    self.clock.set(origin + timedelta(seconds=due))
                try:
                    fn()
                except Exception as exc:  # a failed action must not end a demo; tests assert `errors` is empty
                    if len(self.errors) < 100:
                        self.errors.append(f"t={due:.0f}s: {type(exc).__name__}: {exc}")
                    log.warning("scenario action at %.0fs failed: %s", due, exc, exc_info=not isinstance(exc, ApiError))
                done += 1
            self.elapsed = max(self.elapsed, t)
            if isinstance(self.clock, ManualClock):
                self.clock.set(origin + timedelta(seconds=t))
            try:
                self._kubelet_sync()
                flush = getattr(self.client, "flush", None)  # clients that write at once have none
                if flush is not None:
                    flush()
            except Exception as exc:
                if len(self.errors) < 100:
                    self.errors.append(f"t={t:.0f}s: kubelet sync: {type(exc).__name__}: {exc}")
            return done

    def _kubelet_sync(self) -> None:
        """Bring periodic kubelet writes (node Leases, status reports) up to now (the Nodes mixin)."""

    def advance(self, seconds: float) -> int:
        """Step the scenario forward by `seconds` from where it is."""
        return self.step_to(self.elapsed + seconds)

    def run(self) -> None:
        """Play the scenario in real (or accelerated) time until `stop()`; holds the final state."""
        origin = self.origin
        while not self._stop.is_set():
            now = (self.clock.now() - origin).total_seconds()
            self.step_to(now)
            nxt = self.next_due()
            wait = 1.0 if nxt is None else max(0.0, nxt - (self.clock.now() - origin).total_seconds())
            if isinstance(self.clock, ScaledClock):
                wait /= self.clock.speed
            self._stop.wait(min(max(wait, 0.005), 1.0))

    def start(self) -> threading.Thread:
        """Run the scenario in a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name="scenario-engine", daemon=True)
            self._thread.start()
        return self._thread

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.client.close()

    def _now(self) -> str:
        return rfc3339(self.clock.now())

    def _node_time(self, node: str) -> datetime:
        """Now on a node's clock: what its kubelet and container runtime stamp (skewed nodes run off)."""
        n = self.nodes.get(node)
        now = self.clock.now()
        return now + timedelta(seconds=n.spec.clock_skew) if n is not None and n.spec.clock_skew else now

    def _suffix(self, n: int = 5) -> str:
        return "".join(self._rng.choice(_SUFFIX) for _ in range(n))

    def _hex(self, n: int) -> str:
        return f"{self._rng.getrandbits(4 * n):0{n}x}"

    def _uuidish(self) -> str:
        h = self._hex(32)
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"

    def _create(self, obj: Obj, status: Obj | None = None) -> Ref:
        out = self.client.create(obj)
        meta = out["metadata"]
        ref = Ref(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"], meta["uid"])
        if status:
            self._status(ref, status)
        return ref

    def _patch(self, ref: Ref, body: Obj) -> None:
        self.client.patch(ref.api_version, ref.kind, ref.namespace, ref.name, body)

    def _status(self, ref: Ref, status: Obj) -> None:
        self.client.patch(ref.api_version, ref.kind, ref.namespace, ref.name, {"status": status}, "status")

    def _cond(self, type_: str, status: bool | str, reason: str, message: str = "") -> Obj:
        value = status if isinstance(status, str) else ("True" if status else "False")
        return {"type": type_, "status": value, "reason": reason, "message": message, "lastTransitionTime": self._now()}

    @staticmethod
    def _set_cond(conds: dict[str, Obj], cond: Obj) -> None:
        old = conds.get(cond["type"])
        if old is not None and old["status"] == cond["status"]:
            cond = {**cond, "lastTransitionTime": old["lastTransitionTime"]}
        conds[cond["type"]] = cond

    def event(
        self, ref: Ref, type_: str, reason: str, message: str, component: str, host: str = "", field_path: str = ""
    ) -> None:
        """Record a core/v1 Event, aggregating repeats (count, lastTimestamp) like client-go's recorder."""
        key = (ref.uid or ref.name, reason, message)
        # A kubelet stamps its events on its own node's clock.
        stamp = self._node_time(host) if component == "kubelet" and host else self.clock.now()
        now = rfc3339(stamp)
        seen = self._events.get(key)
        if seen is not None:
            name, count, first = seen
            self._events[key] = (name, count + 1, first)
            try:
                self.client.patch(
                    "v1",
                    "Event",
                    ref.namespace or "default",
                    name,
                    {
                        "count": count + 1,
                        "lastTimestamp": now,
                        "series": {"count": count + 1, "lastObservedTime": rfc3339_micro(stamp)},
                    },
                )
                return
            except ApiError:
                pass
        name = f"{ref.name}.{self._hex(16)}"
        source: Obj = {"component": component}
        if host:
            source["host"] = host
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ref.namespace or "default"},
            "involvedObject": ref.involved(field_path),
            "reason": reason,
            "message": message,
            "type": type_,
            "source": source,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "eventTime": rfc3339_micro(stamp),
            "reportingComponent": component,
            "reportingInstance": host or f"{component}-aks-system-0",
            "action": reason,
        }
        self.client.create(body)
        self._events[key] = (name, 1, now)

    def _logs(self, pod: PodState, lines: Iterable[str], container: str = "") -> None:
        """Append to a container's log, stamped by the container runtime on the pod's node clock."""
        if pod.deleted:
            return
        self.client.append_log(pod.ref.namespace, pod.ref.name, container or pod.container, list(lines),
                               rfc3339_micro(self._node_time(pod.node)))

    def _tau_status(self, r: RunState, phase: str, extra: Obj | None = None) -> None:
        changed = phase != r.phase
        r.phase = phase
        if r.taurun is None:
            return
        status: Obj = {"phase": phase, "observedGeneration": 1, "conditions": list(r.conditions.values())}
        if extra:
            status.update({k: v for k, v in extra.items() if v})
        self._status(r.taurun, status)
        if changed or extra:
            latest = max(r.conditions.values(), key=lambda c: str(c["lastTransitionTime"]), default=None)
            detail = f": {latest['message']}" if latest and latest.get("message") else ""
            self.event(r.taurun, "Normal", phase, f"TauRun is {phase}{detail}", "taugrid-controller")

    def _wl_status(self, r: RunState, extra: Obj | None = None) -> None:
        if r.workload is None:
            return
        status: Obj = {"conditions": list(r.wl_conditions.values())}
        if extra is not None:
            status.update(extra)
        self._status(r.workload, status)
