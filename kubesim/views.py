"""Second views of shared storage: `events.k8s.io/v1` Events over stored `core/v1` Events."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

# events.k8s.io/v1 field  <->  core/v1 field
_EVENT_FIELDS = (
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("eventTime", "eventTime"),
    ("action", "action"),
    ("reason", "reason"),
    ("type", "type"),
    ("related", "related"),
)


def _series_to_v1(series: Any) -> Any:
    if not isinstance(series, dict):
        return None
    return {"count": series.get("count"), "lastObservedTime": series.get("lastObservedTime")}


def core_event_to_events_v1(obj: Obj) -> Obj:
    """The events.k8s.io/v1 view of a stored core/v1 Event."""
    out: Obj = {"kind": "Event", "apiVersion": "events.k8s.io/v1", "metadata": obj.get("metadata", {})}
    for v1_name, core_name in _EVENT_FIELDS:
        value = obj.get(core_name)
        if value not in (None, "", {}):
            out[v1_name] = value
    if "eventTime" not in out:
        out["eventTime"] = None
    series = _series_to_v1(obj.get("series"))
    if series:
        out["series"] = series
    return out


def events_v1_to_core_event(obj: Obj) -> Obj:
    """The stored core/v1 shape of an events.k8s.io/v1 Event written through that API."""
    out: Obj = {"kind": "Event", "apiVersion": "v1", "metadata": obj.get("metadata", {})}
    for v1_name, core_name in _EVENT_FIELDS:
        value = obj.get(v1_name)
        if value is not None:
            out[core_name] = value
    series = _series_to_v1(obj.get("series"))
    if series:
        out["series"] = series
    if "source" not in out and out.get("reportingComponent"):
        out["source"] = {"component": out["reportingComponent"]}
    return out


TO_VIEW = {"events.k8s.io/v1/events": core_event_to_events_v1}
FROM_VIEW = {"events.k8s.io/v1/events": events_v1_to_core_event}
