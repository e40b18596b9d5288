"""Server-side `meta.k8s.io/v1` Table rendering, so `kubectl get` prints the usual columns."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubesim.clock import parse_time
from kubesim.registry import Column, ResourceType

Obj = dict[str, Any]


def human_duration(seconds: float) -> str:
    """Kubernetes' HumanDuration: 45s, 3m20s, 2h5m, 3d4h, 400d, 2y30d."""
    if seconds < -1:
        return "<invalid>"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        d = h // 24 - 365 * (h // 24 // 365)
        return f"{h // 24 // 365}y{d}d" if d else f"{h // 24 // 365}y"
    return f"{h // 24 // 365}y"


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _since(now: datetime, stamp: Any) -> str:
    if not isinstance(stamp, str) or not stamp:
        return "<unknown>"
    try:
        return human_duration((now - parse_time(stamp)).total_seconds())
    except ValueError:
        return "<unknown>"


def _age(obj: Obj, now: datetime) -> str:
    return _since(now, _get(obj, "metadata.creationTimestamp"))


def _pod_ready(obj: Obj, now: datetime) -> str:
    statuses = _get(obj, "status.containerStatuses") or []
    total = len(_get(obj, "spec.containers") or []) or len(statuses)
    ready = sum(1 for c in statuses if c.get("ready") and "running" in (c.get("state") or {}))
    return f"{ready}/{total}"


def _pod_status(obj: Obj, now: datetime) -> str:
    status = obj.get("status") or {}
    reason = str(status.get("reason") or status.get("phase") or "")
    has_running = False
    for c in reversed(status.get("containerStatuses") or []):
        state = c.get("state") or {}
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            term = state["terminated"]
            reason = term.get("reason") or (
                f"Signal:{term['signal']}" if term.get("signal") else f"ExitCode:{term.get('exitCode', 0)}"
            )
        elif c.get("ready") and "running" in state:
            has_running = True
    if reason == "Completed" and has_running:
        reason = "Running"
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason


def _pod_restarts(obj: Obj, now: datetime) -> str:
    restarts, last = 0, ""
    for c in _get(obj, "status.containerStatuses") or []:
        restarts += int(c.get("restartCount") or 0)
        finished = _get(c, "lastState.terminated.finishedAt")
        if isinstance(finished, str) and finished > last:
            last = finished
    if restarts and last:
        return f"{restarts} ({_since(now, last)} ago)"
    return str(restarts)


def _node_status(obj: Obj, now: datetime) -> str:
    state = "Unknown"
    for cond in _get(obj, "status.conditions") or []:
        if cond.get("type") == "Ready":
            state = {"True": "Ready", "False": "NotReady"}.get(str(cond.get("status")), "Unknown")
    if _get(obj, "spec.unschedulable"):
        state += ",SchedulingDisabled"
    return state


def _node_roles(obj: Obj, now: datetime) -> str:
    roles = sorted(
        k.split("/", 1)[1] for k in (_get(obj, "metadata.labels") or {}) if k.startswith("node-role.kubernetes.io/")
    )
    return ",".join(roles) or "<none>"


def _node_ip(obj: Obj, now: datetime) -> str:
    for addr in _get(obj, "status.addresses") or []:
        if addr.get("type") == "InternalIP":
            return str(addr.get("address"))
    return "<none>"


def _event_last_seen(obj: Obj, now: datetime) -> str:
    stamp = (
        obj.get("lastTimestamp")
        or _get(obj, "series.lastObservedTime")
        or obj.get("eventTime")
        or obj.get("deprecatedLastTimestamp")
    )
    return _since(now, stamp)


def _event_object(obj: Obj, now: datetime) -> str:
    ref = obj.get("involvedObject") or obj.get("regarding") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def _event_note(obj: Obj, now: datetime) -> str:
    return str(obj.get("note") or obj.get("message") or "")


def _job_status(obj: Obj, now: datetime) -> str:
    conds = {c.get("type"): c.get("status") for c in _get(obj, "status.conditions") or []}
    for kind in ("Complete", "Failed", "Suspended"):
        if conds.get(kind) == "True":
            return kind
    return "Running"


def _job_completions(obj: Obj, now: datetime) -> str:
    return f"{_get(obj, 'status.succeeded') or 0}/{_get(obj, 'spec.completions') or 1}"


def _last_condition(obj: Obj, now: datetime) -> str:
    true = [c.get("type") for c in _get(obj, "status.conditions") or [] if c.get("status") == "True"]
    return str(true[-1]) if true else ""


_COMPUTED: dict[str, Callable[[Obj, datetime], str]] = {
    "@age": _age,
    "@pod_ready": _pod_ready,
    "@pod_status": _pod_status,
    "@pod_restarts": _pod_restarts,
    "@node_status": _node_status,
    "@node_roles": _node_roles,
    "@node_ip": _node_ip,
    "@event_last_seen": _event_last_seen,
    "@event_object": _event_object,
    "@event_note": _event_note,
    "@job_status": _job_status,
    "@job_completions": _job_completions,
    "@last_condition": _last_condition,
}


def _cell(obj: Obj, col: Column, now: datetime) -> Any:
    if col.path.startswith("@cond:"):
        want = col.path[6:]
        for cond in _get(obj, "status.conditions") or []:
            if cond.get("type") == want:
                return cond.get("status")
        return None
    if col.path.startswith("@"):
        return _COMPUTED[col.path](obj, now)
    value = _get(obj, col.path)
    return value if isinstance(value, str | int | float | bool) else None


def _columns(rt: ResourceType) -> tuple[Column, ...]:
    return rt.columns or (Column("Age", "@age", "date"),)


def column_definitions(rt: ResourceType) -> list[Obj]:
    defs: list[Obj] = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": "Name must be unique within a namespace.",
            "priority": 0,
        }
    ]
    for col in _columns(rt):
        defs.append(
            {
                "name": col.name,
                "type": col.type if col.type != "date" else "string",
                "format": "",
                "description": col.name,
                "priority": col.priority,
            }
        )
    return defs


def table_row(rt: ResourceType, obj: Obj, now: datetime, include_object: str) -> Obj:
    meta = obj.get("metadata") or {}
    row: Obj = {"cells": [meta.get("name", ""), *(_cell(obj, c, now) for c in _columns(rt))]}
    if include_object == "Object":
        row["object"] = obj
    elif include_object != "None":
        row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
    return row


def to_table(
    rt: ResourceType,
    objs: list[Obj],
    now: datetime,
    list_meta: Obj,
    include_object: str,
    table_version: str = "v1",
) -> Obj:
    """A Table holding one row per object."""
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{table_version}",
        "metadata": list_meta,
        "columnDefinitions": column_definitions(rt),
        "rows": [table_row(rt, o, now, include_object) for o in objs],
    }
