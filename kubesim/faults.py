"""Fault injection: rules that make matching requests fail, slow down, expire or lose their stream."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal

from kubesim.clock import Clock

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
        for key, types in _FIELD_TYPES.items():
            if key not in kw:
                continue
            value = kw[key]
            if key in ("verbs", "resources", "namespaces"):
                if isinstance(value, str):
                    value = [v for v in value.replace("+", ",").split(",") if v]
                if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"fault {key}: expected a list of names, got {value!r}")
                kw[key] = tuple(value)
                continue
            if isinstance(value, bool) or not isinstance(value, types):
                if value is None and key == "count":
                    continue
                raise ValueError(f"fault {key}: expected {'/'.join(t.__name__ for t in types)}, got {value!r}")
            if isinstance(value, int | float) and value < 0:
                raise ValueError(f"fault {key}: must not be negative, got {value!r}")
        ratio = kw.get("ratio", 1.0)
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"fault ratio: expected a share in (0, 1], got {ratio!r}")
        return cls(**kw)


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "status": (int,),
    "delay_s": (int, float),
    "retry_after_s": (int,),
    "after_events": (int,),
    "count": (int,),
    "ratio": (int, float),
    "verbs": (list, tuple, str),
    "resources": (list, tuple, str),
    "namespaces": (list, tuple, str),
}


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


# ---------------------------------------------------------------------- faults on the scenario clock


@dataclass(frozen=True, slots=True)
class ScheduledFault:
    """A fault rule that starts `at_s` scenario seconds from time zero and, with `for_s`, is removed
    that long after. `fields` are the `Fault` fields (as `/_sim/faults` takes them, validated)."""

    at_s: float
    for_s: float | None
    fields: Mapping[str, Any]

    def build(self) -> Fault:
        return Fault.from_json(dict(self.fields))


@dataclass(frozen=True, slots=True)
class ServerPlan:
    """What a scenario says of the API server itself rather than of the cluster: faults on its
    timeline (`faults:`) and how long Events live (`eventTTL:`, like kube-apiserver's --event-ttl)."""

    faults: tuple[ScheduledFault, ...] = ()
    event_ttl_s: float | None = None


def _scheduled(raw: Any, where: str) -> ScheduledFault:
    """One `{at: 30s, for: 1m, action: status, status: 503, ...}` entry; ValueError naming `where`."""
    from kubesim.scenario import ScenarioError, parse_duration  # scenario.py imports this module

    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping like {{at: 30s, for: 1m, action: status, status: 503}}")
    data = {str(k): v for k, v in raw.items()}
    if "at" not in data:
        raise ValueError(f"{where}: missing 'at'")
    try:
        at_s = parse_duration(data.pop("at"), f"{where}.at")
        for_raw = data.pop("for", None)
        for_s = None if for_raw is None else parse_duration(for_raw, f"{where}.for")
    except ScenarioError as exc:
        raise ValueError(str(exc)) from None
    if for_s is not None and for_s <= 0:
        raise ValueError(f"{where}.for: must be a positive duration, got {for_raw!r}")
    try:
        fault = Fault.from_json(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    # Keep the validated fields (lists as tuples): each application builds a fresh rule from them.
    fields = {k: v for k, v in fault.to_json().items() if k in data}
    return ScheduledFault(at_s, for_s, fields)


def parse_server_plan(top: Mapping[str, Any], source: str) -> ServerPlan:
    """The scenario's `faults:` and `eventTTL:` keys; raises ScenarioError naming the file and place."""
    from kubesim.scenario import ScenarioError, parse_duration  # scenario.py imports this module

    raw = top.get("faults")
    if raw is not None and not isinstance(raw, list):
        raise ScenarioError(f"{source}: faults: expected a list, got {type(raw).__name__}")
    faults = []
    for i, entry in enumerate(raw or []):
        try:
            faults.append(_scheduled(entry, f"faults[{i}]"))
        except ValueError as exc:
            raise ScenarioError(f"{source}: {exc}") from None
    ttl = None
    if top.get("eventTTL") is not None:
        try:
            ttl = parse_duration(top["eventTTL"], "eventTTL")
        except ScenarioError as exc:
            raise ScenarioError(f"{source}: {exc}") from None
        if ttl <= 0:
            raise ScenarioError(f"{source}: eventTTL: must be a positive duration, got {top['eventTTL']!r}")
    return ServerPlan(tuple(sorted(faults, key=lambda f: f.at_s)), ttl)


def parse_fault_spec(text: str) -> ScheduledFault:
    """A `--fault` option: JSON (`{"at": "30s", "action": "status", "status": 503}`) or the compact
    `at=30s,for=1m,action=status,status=503,verbs=list+watch,resources=pods` (lists joined by `+`).
    ValueError naming the spec and the problem."""
    text = text.strip()
    data: dict[str, Any]
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--fault {text!r}: not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"--fault {text!r}: expected a JSON object")
        data = parsed
    else:
        data = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"--fault {text!r}: expected key=value pairs separated by commas, got {part!r}")
            data[key.strip()] = _scalar(key.strip(), value.strip())
    data.setdefault("at", 0)
    try:
        return _scheduled(data, f"--fault {text!r}")
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def _scalar(key: str, value: str) -> Any:
    if key in ("verbs", "resources", "namespaces"):
        return [v for v in value.split("+") if v]
    if key in ("at", "for", "action"):
        return value
    if key == "count" and value.lower() in ("", "none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            continue
    return value


class FaultScheduler:
    """Adds and removes scheduled faults as the scenario clock passes their times (`apply_due`), in a
    background thread (`start`) for real and accelerated clocks; tests on a manual clock may call
    `apply_due` themselves after moving it."""

    POLL_S = 0.05  # wall seconds between checks

    def __init__(self, faults: Faults, plan: Sequence[ScheduledFault], clock: Clock, origin: datetime) -> None:
        self.faults, self.clock, self.origin = faults, clock, origin
        self.plan = tuple(sorted(plan, key=lambda f: f.at_s))
        self._pending = list(self.plan)
        self._active: list[tuple[float, int]] = []  # (end scenario seconds, rule id)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.applied: list[Fault] = []

    def apply_due(self) -> None:
        now_s = (self.clock.now() - self.origin).total_seconds()
        with self._lock:
            while self._pending and self._pending[0].at_s <= now_s:
                item = self._pending.pop(0)
                end = float("inf") if item.for_s is None else item.at_s + item.for_s
                if now_s >= end:
                    continue  # its whole span already passed (a manual clock jumped over it)
                rule = self.faults.add(item.build())
                self.applied.append(rule)
                if item.for_s is not None:
                    self._active.append((end, rule.id))
            for end, rule_id in [a for a in self._active if a[0] <= now_s]:
                self.faults.remove(rule_id)
                self._active.remove((end, rule_id))

    def _run(self) -> None:
        while not self._stop.wait(self.POLL_S):
            self.apply_due()

    def start(self) -> None:
        self.apply_due()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="simulator-faults", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
