"""Fault injection: rules that make matching requests fail, slow down, expire or lose their stream."""

from __future__ import annotations

import random
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FaultAction = Literal["status", "delay", "gone", "drop", "nobookmarks"]
ACTIONS: tuple[str, ...] = ("status", "delay", "gone", "drop", "nobookmarks")
ENGINE_USER_AGENT = "taugrid-simulator-engine"


@dataclass(slots=True)
class Fault:
    """One rule. Requests match on verb and resource; `count` and `ratio` bound how many it hits.

    action:
      status  answer `status` (429 carries Retry-After: `retry_after_s`; 500/503 an InternalError)
      delay   sleep `delay_s` before handling
      gone    lists answer 410 Expired; watches send one ERROR event (Status 410 Expired) and end
      drop    watches send `after_events` events, then half of the next line, then close the connection;
              other requests lose their connection before any response
      nobookmarks  watches that ask for bookmarks (allowWatchBookmarks) get no periodic BOOKMARK
              events (the `k8s.io/initial-events-end` bookmark of sendInitialEvents is still sent)
    """

    action: FaultAction
    status: int = 500
    delay_s: float = 0.0
    retry_after_s: int = 1
    after_events: int = 0
    count: int | None = None  # applications left; None = unlimited
    ratio: float = 1.0  # share of matching requests hit
    verbs: tuple[str, ...] = ()  # get, list, watch, create, update, patch, delete, logs, discovery; () = all
    resources: tuple[str, ...] = ()  # plural names such as "pods"; () = all
    namespaces: tuple[str, ...] = ()  # () = all
    id: int = 0
    hits: int = 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verbs"], out["resources"], out["namespaces"] = (
            list(self.verbs),
            list(self.resources),
            list(self.namespaces),
        )
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fault:
        """Build from the admin endpoint's JSON (unknown keys are an error)."""
        known = {f for f in cls.__dataclass_fields__ if f not in ("id", "hits")}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        if data.get("action") not in ACTIONS:
            raise ValueError(f"fault action must be one of {', '.join(ACTIONS)}, got {data.get('action')!r}")
        kw = dict(data)
        for key in ("verbs", "resources", "namespaces"):
            if key in kw:
                kw[key] = tuple(kw[key])
        return cls(**kw)


@dataclass(slots=True)
class Faults:
    """The active fault rules; thread-safe, changed at runtime through this API or `/_sim/faults`."""

    seed: int = 0
    exempt_user_agents: tuple[str, ...] = (ENGINE_USER_AGENT,)
    _rules: list[Fault] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _rng: random.Random = field(init=False)
    _next_id: int = 1

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def add(self, fault: Fault) -> Fault:
        """Activate a rule; returns it with its id set."""
        with self._lock:
            fault.id = self._next_id
            self._next_id += 1
            self._rules.append(fault)
            return fault

    def fail(
        self,
        status: int,
        *,
        count: int | None = None,
        ratio: float = 1.0,
        verbs: tuple[str, ...] = (),
        resources: tuple[str, ...] = (),
        retry_after_s: int = 1,
    ) -> Fault:
        """Answer matching requests with an error status (429, 500, 503, ...)."""
        return self.add(
            Fault(
                "status",
                status=status,
                count=count,
                ratio=ratio,
                verbs=verbs,
                resources=resources,
                retry_after_s=retry_after_s,
            )
        )

    def delay(
        self,
        seconds: float,
        *,
        count: int | None = None,
        ratio: float = 1.0,
        verbs: tuple[str, ...] = (),
        resources: tuple[str, ...] = (),
    ) -> Fault:
        """Slow matching requests down by `seconds`."""
        return self.add(Fault("delay", delay_s=seconds, count=count, ratio=ratio, verbs=verbs, resources=resources))

    def gone(self, count: int, *, verbs: tuple[str, ...] = ("list", "watch"), resources: tuple[str, ...] = ()) -> Fault:
        """A 410 storm: the next `count` matching lists/watches answer 410 Expired."""
        return self.add(Fault("gone", count=count, verbs=verbs, resources=resources))

    def drop_watch(self, *, after_events: int = 0, count: int | None = 1, resources: tuple[str, ...] = ()) -> Fault:
        """Cut watch streams mid-object after `after_events` complete events."""
        return self.add(Fault("drop", after_events=after_events, count=count, verbs=("watch",), resources=resources))

    def drop(
        self, *, count: int | None = 1, ratio: float = 1.0, verbs: tuple[str, ...] = (), resources: tuple[str, ...] = ()
    ) -> Fault:
        """Close matching connections without answering (watches: mid-object, see `drop_watch`)."""
        return self.add(Fault("drop", count=count, ratio=ratio, verbs=verbs, resources=resources))

    def no_bookmarks(self, *, count: int | None = None, resources: tuple[str, ...] = ()) -> Fault:
        """Watches that ask for bookmarks get none (an older or overloaded API server)."""
        return self.add(Fault("nobookmarks", count=count, verbs=("watch",), resources=resources))

    def remove(self, fault_id: int) -> bool:
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if r.id != fault_id]
            return len(self._rules) != before

    def clear(self) -> None:
        """Remove every rule."""
        with self._lock:
            self._rules.clear()

    def rules(self) -> list[Fault]:
        with self._lock:
            return list(self._rules)

    def pick(self, verb: str, resource: str, namespace: str, user_agent: str) -> list[Fault]:
        """The rules that fire for this request, consuming their counts (at most one per action)."""
        if any(user_agent.startswith(ua) for ua in self.exempt_user_agents):
            return []
        fired: list[Fault] = []
        with self._lock:
            for rule in self._rules:
                if rule.verbs and verb not in rule.verbs:
                    continue
                if not rule.verbs and verb == "discovery":
                    continue
                if rule.resources and resource not in rule.resources:
                    continue
                if rule.namespaces and namespace not in rule.namespaces:
                    continue
                if rule.action == "gone" and verb not in ("list", "watch"):
                    continue
                if rule.action == "nobookmarks" and verb != "watch":
                    continue
                if rule.count is not None and rule.count <= 0:
                    continue
                if any(f.action == rule.action for f in fired):
                    continue
                if rule.ratio < 1.0 and self._rng.random() >= rule.ratio:
                    continue
                if rule.count is not None:
                    rule.count -= 1
                rule.hits += 1
                fired.append(rule)
            self._rules = [r for r in self._rules if r.count is None or r.count > 0]
        return fired
