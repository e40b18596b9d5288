"""The controller's runs as JSON: `/runs` and `/runs/NAMESPACE/NAME`, and the client side of it.

The controller serves each run's current claims (the `explain` JSON contract, docs/explain.md) with
its `history`: the latest claim transitions it saw (observed and verdict changes, blocked stage
changes), so a researcher sees what the alert saw, even once the evidence is older than any log
tail. `explain RUN --controller URL` decodes the document at a typed boundary (msgspec) back into
`RunClaims` and prints it with `explain`'s own renderer.

Names in the path are checked as Kubernetes checks them (namespace: a DNS-1123 label; name: a
DNS-1123 subdomain) before they are used; anything else is 400 with no echo of the input.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from operator import attrgetter
from typing import Any

import msgspec
import orjson

from collector.interning import Interner
from collector.kube import dns1123_label, dns1123_subdomain, parse_time
from collector.model import (
    Blocked,
    Claim,
    Energy,
    Evidence,
    Goodput,
    Observed,
    Plane,
    Ref,
    RunClaims,
    Stage,
    Straggler,
    Stragglers,
    Verdict,
    rfc3339,
)
from collector.queuefacts import AdmissionEta, AheadWorkload, QueueStatus, QuotaShort
from collector.render import to_json
from collector.riskfacts import NodeRisk, WorkAtRisk

HISTORY_PER_RUN = 16  # transitions kept per run (at 10,000 runs: ≤ 160,000 entries of ≤ ~0.5 KB)
REASON_CHARS = 300  # of each transition's reason
MAX_DOCUMENT_BYTES = 64 << 20  # the most a client reads of a /runs answer

Answer = tuple[int, str, bytes]
Key = tuple[str, str, str]  # (kind, namespace, name)


# --- the server side -----------------------------------------------------------------------------


State = tuple[tuple[str, tuple[str, str]], ...]  # (claim, (observed, verdict)) and ("blocked", (stage, ""))
# (at, claim, what it was, what it became, reason): a transition as kept; `_entry` renders it
Transition = tuple[datetime, str, "tuple[str, str] | None", tuple[str, str], str]

# Each distinct state, once: a fleet's runs are in a few dozen of them, and every run's last one is
# held (~0.5 KB a run as a dict of tuples). Bounded by clearing.
_STATES: Interner[State] = Interner(1 << 12)


def _state(rc: RunClaims) -> State:
    now = (*((k, (c.observed.value, c.verdict.value)) for k, c in rc.claims.items()),
           ("blocked", (rc.blocked.stage.value if rc.blocked else "", "")))
    return _STATES(now)


def _entry(t: Transition) -> dict[str, Any]:
    """A kept transition as `/runs` serves it."""
    at, name, old, new, reason = t
    if name == "blocked":
        return {"at": rfc3339(at), "claim": "blocked", "from": old[0] if old else None, "to": new[0] or None,
                "reason": reason}
    return {"at": rfc3339(at), "claim": name,
            "from": {"observed": old[0], "verdict": old[1]} if old else None,
            "to": {"observed": new[0], "verdict": new[1]}, "reason": reason}


class RunHistory:
    """The latest transitions of each run's claims, as the controller evaluated them (bounded). Kept
    as tuples (the last state shared, `_STATES`), rendered as JSON only when asked: at fleet size the
    dicts were ~2 KB a run, held for the whole fleet."""

    def __init__(self, per_run: int = HISTORY_PER_RUN, key_of: Callable[[Ref], Key] = attrgetter("key")) -> None:
        self.per_run = per_run
        self._key_of = key_of  # a run's key: the live index's own tuple (`RunIndex.key_of`), not a copy
        self._last: dict[Key, State] = {}
        self._history: dict[Key, tuple[Transition, ...]] = {}
        self._lock = threading.Lock()

    def record(self, claims: Iterable[RunClaims]) -> None:
        with self._lock:
            for rc in claims:
                now = _state(rc)
                key = self._key_of(rc.ref)
                before = self._last.get(key)
                self._last[key] = now
                if before is now:
                    continue  # no transition (most evaluations): at once
                was = dict(before) if before is not None else {}
                added: list[Transition] = []
                for name, pair in now:
                    old = was.get(name)
                    if old == pair:
                        continue
                    if name == "blocked":
                        if before is None and not pair[0]:
                            continue
                        reason = rc.blocked.reason if rc.blocked else ""
                    else:
                        reason = rc.claims[name].reason
                    added.append((rc.evaluated_at, name, old, pair, reason[:REASON_CHARS]))
                if added:
                    self._history[key] = (*self._history.get(key, ()), *added)[-self.per_run:]

    def forget(self, key: Key) -> None:
        """Drop a run no longer evaluated (gone from the cluster)."""
        with self._lock:
            self._last.pop(key, None)
            self._history.pop(key, None)

    def of(self, key: Key) -> list[dict[str, Any]]:
        with self._lock:
            kept = self._history.get(key, ())
        return [_entry(t) for t in kept]


def _document(claims: list[RunClaims], now: datetime, history: RunHistory) -> bytes:
    claims = [rc.at(now) for rc in claims]  # goodput and work at risk as of now, not of the last evaluation
    doc = to_json(claims, now)
    for rc, entry in zip(claims, doc["runs"], strict=True):
        entry["history"] = history.of(rc.ref.key)
    return orjson.dumps(doc)


def _error(code: int, message: str) -> Answer:
    return code, "application/json", orjson.dumps({"error": message})


def runs_answer(path: str, claims: Callable[[], Mapping[Key, RunClaims]], now: Callable[[], datetime],
                history: RunHistory, ready: bool = True) -> Answer:
    """The answer for `/runs`, `/runs/NAMESPACE` (one namespace's runs: a fleet's whole document is tens
    of MB) or `/runs/NAMESPACE/NAME` (anything else under /runs: 404; before the first sync: 503, no
    claims yet)."""
    if not ready:
        return _error(503, "not synced")
    parts = path.split("/")[2:] if path.startswith("/runs/") else []
    if path == "/runs":
        runs = sorted(claims().values(), key=lambda rc: (rc.ref.namespace, rc.ref.name, rc.ref.kind))
        return 200, "application/json", _document(runs, now(), history)
    if len(parts) == 1:
        (namespace,) = parts
        if not dns1123_label(namespace):
            return _error(400, "namespace must be a DNS-1123 label")
        runs = sorted((rc for rc in claims().values() if rc.ref.namespace == namespace),
                      key=lambda rc: (rc.ref.name, rc.ref.kind))
        return 200, "application/json", _document(runs, now(), history)  # none: an empty list, not 404
    if len(parts) != 2:
        return _error(404, "not found: /runs, /runs/NAMESPACE or /runs/NAMESPACE/NAME")
    namespace, name = parts
    if not dns1123_label(namespace) or not dns1123_subdomain(name):
        return _error(400, "namespace must be a DNS-1123 label and name a DNS-1123 subdomain")
    found = [rc for rc in claims().values() if rc.ref.namespace == namespace and rc.ref.name == name]
    if not found:
        return _error(404, f"no run {namespace}/{name}")
    return 200, "application/json", _document(found, now(), history)


# --- the client side: the document back into RunClaims ----------------------------------------------


class _Evidence(msgspec.Struct):
    plane: str
    ref: str
    field: str
    value: Any = None
    at: str | None = None
    cluster: str = ""


class _Claim(msgspec.Struct):
    asserted: bool | None
    observed: str
    verdict: str
    since: str | None = None
    reason: str = ""
    cause: str = ""
    evidence: list[_Evidence] = []


class _Blocked(msgspec.Struct):
    stage: str
    reason: str = ""
    since: str | None = None
    evidence: list[_Evidence] = []
    owner: str = ""


class _Goodput(msgspec.Struct):
    ratio: float | None
    allocated_seconds: float = 0.0
    productive_seconds: float = 0.0
    badput_seconds: dict[str, float] = {}


class _Eta(msgspec.Struct):
    low_seconds: float | None = None
    mid_seconds: float | None = None
    high_seconds: float | None = None
    level: float = 0.8
    basis: str = ""


class _Ahead(msgspec.Struct):
    namespace: str
    name: str
    priority: int = 0
    position_in_cluster_queue: int = 0
    requests: dict[str, float] = {}


class _Short(msgspec.Struct):
    flavor: str
    resource: str
    needed: float
    free: float
    nominal: float


class _Queue(msgspec.Struct):
    cluster_queue: str = ""
    local_queue: str = ""
    workload: str = ""
    position_in_cluster_queue: int | None = None
    position_in_local_queue: int | None = None
    pending_in_cluster_queue: int | None = None
    ahead: list[_Ahead] = []
    quota_short: list[_Short] = []
    admission_eta: _Eta = msgspec.field(default_factory=_Eta)
    source: str = ""


def _queue(q: _Queue) -> QueueStatus:
    e = q.admission_eta
    known = e.low_seconds is not None and e.mid_seconds is not None and e.high_seconds is not None
    eta = AdmissionEta(e.low_seconds if known else None, e.mid_seconds if known else None,
                       e.high_seconds if known else None, e.level, e.basis)
    return QueueStatus(q.cluster_queue, q.local_queue, q.workload, q.position_in_cluster_queue,
                       q.position_in_local_queue, q.pending_in_cluster_queue,
                       tuple(AheadWorkload(a.namespace, a.name, a.priority, a.position_in_cluster_queue,
                                           tuple(sorted(a.requests.items()))) for a in q.ahead[:16]),
                       tuple(QuotaShort(x.flavor, x.resource, x.needed, x.free, x.nominal) for x in q.quota_short[:16]),
                       eta, q.source)


class _NodeRisk(msgspec.Struct):
    node: str
    score: float = 0.0
    signals: list[str] = []
    reasons: list[str] = []
    gpus: int = 0
    gpu_hours_at_risk: float | None = None


class _Checkpoint(msgspec.Struct):
    step: int | None = None
    at: str | None = None


class _WorkAtRisk(msgspec.Struct):
    gpus: int
    gpu_hours: float | None = None
    since: str | None = None
    basis: str | None = None
    reason: str = ""
    checkpoint: _Checkpoint | None = None
    nodes: list[_NodeRisk] = []
    missing_signals: list[str] = []


def _work_at_risk(w: _WorkAtRisk, where: str) -> WorkAtRisk:
    ck = w.checkpoint
    return WorkAtRisk(w.gpu_hours, w.gpus, _time(w.since, where), w.basis or "", w.reason,
                      ck.step if ck is not None else None, _time(ck.at, where) if ck is not None else None,
                      tuple(NodeRisk(n.node, n.score, tuple(n.signals[:16]), tuple(n.reasons[:16]), n.gpus,
                                     n.gpu_hours_at_risk) for n in w.nodes[:64]),
                      tuple(w.missing_signals[:16]))


class _Straggler(msgspec.Struct):
    kind: str
    rank: str = ""
    pod: str = ""
    node: str = ""
    gpu: str | None = None
    lag_ratio: float = 0.0
    lag_seconds: float | None = None
    since: str | None = None
    basis: str = ""
    evidence: str = ""


class _Stragglers(msgspec.Struct):
    suspects: list[_Straggler] = []
    compared: int = 0
    steps: int = 0
    reason: str = ""
    untrusted_readings: list[str] = []


def _stragglers(s: _Stragglers, where: str) -> Stragglers:
    return Stragglers(tuple(Straggler(x.kind, x.rank, x.pod, x.node, x.lag_ratio, _time(x.since, where), x.basis,
                                      x.evidence, x.lag_seconds, x.gpu or "") for x in s.suspects[:16]),
                      s.compared, s.steps, s.reason, tuple(s.untrusted_readings[:16]))


class _Energy(msgspec.Struct):
    gpus: int
    joules_per_step: float | None = None
    watts: float | None = None
    steps: float | None = None
    window_seconds: float | None = None
    joules_per_token: float | None = None
    reason: str = ""


class _Run(msgspec.Struct):
    namespace: str
    name: str
    kind: str
    claims: dict[str, _Claim]
    uid: str = ""
    finished: bool = False
    blocked: _Blocked | None = None
    goodput: _Goodput | None = None
    context: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    queue: _Queue | None = None
    work_at_risk: _WorkAtRisk | None = None
    stragglers: _Stragglers | None = None
    energy: _Energy | None = None


class _Document(msgspec.Struct):
    evaluated_at: str
    runs: list[_Run]


class BadDocument(ValueError):
    """The controller's answer is not the runs document."""


def _time(value: str | None, where: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except (ValueError, OverflowError) as e:
        raise BadDocument(f"{where}: not an RFC3339 time") from e


def _evidence(items: list[_Evidence], where: str) -> tuple[Evidence, ...]:
    try:
        return tuple(Evidence(Plane(e.plane), e.ref, e.field, e.value, _time(e.at, where), e.cluster) for e in items)
    except ValueError as e:
        raise BadDocument(f"{where}: {e}") from e


def _claim(c: _Claim, where: str) -> Claim:
    try:
        observed, verdict = Observed(c.observed), Verdict(c.verdict)
    except ValueError as e:
        raise BadDocument(f"{where}: {e}") from e
    return Claim(c.asserted, observed, verdict, _time(c.since, where), c.reason, _evidence(c.evidence, where), c.cause)


def decode_runs(data: bytes) -> tuple[datetime, list[tuple[RunClaims, list[dict[str, Any]]]]]:
    """The `/runs` document as (evaluated_at, [(claims, history)]); BadDocument when it is not one."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise BadDocument(f"answer larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        doc = msgspec.json.decode(data, type=_Document)
    except msgspec.ValidationError as e:
        raise BadDocument(f"not the runs document: {e}") from e
    except msgspec.DecodeError as e:
        raise BadDocument(f"not JSON: {e}") from e
    now = _time(doc.evaluated_at, "evaluated_at")
    if now is None:
        raise BadDocument("evaluated_at: missing")
    out = []
    for i, r in enumerate(doc.runs):
        where = f"runs[{i}] {r.namespace}/{r.name}"
        missing = {"scheduled", "running", "progressing"} - set(r.claims)
        if missing:
            raise BadDocument(f"{where}: no {', '.join(sorted(missing))} claim")
        blocked = None
        if r.blocked is not None:
            try:
                stage = Stage(r.blocked.stage)
            except ValueError as e:
                raise BadDocument(f"{where}.blocked: {e}") from e
            blocked = Blocked(stage, r.blocked.reason, _time(r.blocked.since, where),
                              _evidence(r.blocked.evidence, where))
        goodput = None
        if r.goodput is not None:
            g = r.goodput
            goodput = Goodput(g.allocated_seconds, g.productive_seconds, dict(g.badput_seconds), g.ratio)
        rc = RunClaims(Ref(r.kind, r.namespace, r.name, r.uid),
                       _claim(r.claims["scheduled"], where), _claim(r.claims["running"], where),
                       _claim(r.claims["progressing"], where), blocked, now, r.finished, goodput, dict(r.context),
                       queue=_queue(r.queue) if r.queue is not None else None,
                       work_at_risk=_work_at_risk(r.work_at_risk, where) if r.work_at_risk is not None else None,
                       stragglers=_stragglers(r.stragglers, where) if r.stragglers is not None else None,
                       energy=None if (en := r.energy) is None else Energy(
                           en.joules_per_step, en.watts, en.gpus, en.steps, en.window_seconds, en.reason,
                           en.joules_per_token))
        out.append((rc, r.history))
    return now, out


def render_history(rc: RunClaims, history: list[dict[str, Any]]) -> list[str]:
    """Text lines for a run's transitions, oldest first."""
    lines = []
    for h in history:
        to, before = h.get("to"), h.get("from")
        if isinstance(to, dict):
            was = f"{before.get('verdict')} → " if isinstance(before, dict) else ""
            change = f"{was}{to.get('verdict')} (observed {to.get('observed')})"
        else:
            change = f"{before or 'none'} → {to or 'none'}"
        lines.append(f"  {h.get('at')}  {h.get('claim'):<12} {change}: {str(h.get('reason') or '')[:160]}")
    return [f"{rc.ref.namespace}/{rc.ref.name} history (the controller's, oldest first):", *lines] if lines else []
