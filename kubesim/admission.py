"""The checks and defaults an API server applies to a write before it stores it: the namespace
exists and is not terminating, the name is valid, apiVersion/kind match the URL, a new object's
default status, and Time/MicroTime fields in their stored (UTC) form."""

from __future__ import annotations

import re
from typing import Any

from kubesim.clock import parse_time, rfc3339, rfc3339_micro
from kubesim.errors import ApiError
from kubesim.objects import Key, Obj, meta_of
from kubesim.registry import ResourceType

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# Metadata the server owns: a replace keeps the stored values, whatever the body says.
SERVER_META = ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds")


def without(obj: Obj, *keys: str) -> Obj:
    return {k: v for k, v in obj.items() if k not in keys}


_TIME_FIELDS = {
    "/v1/events": (
        ("firstTimestamp", False),
        ("lastTimestamp", False),
        ("eventTime", True),
        ("series.lastObservedTime", True),
    ),
    "coordination.k8s.io/v1/leases": (("spec.acquireTime", True), ("spec.renewTime", True)),
}


def canonical_times(storage: str, obj: Obj) -> Obj:
    """Re-serialize Time/MicroTime fields the way an API server stores them (UTC, `Z`)."""
    fields = _TIME_FIELDS.get(storage)
    if not fields:
        return obj
    for path, micro in fields:
        *parents, leaf = path.split(".")
        holder: Any = obj
        for part in parents:
            holder = holder.get(part) if isinstance(holder, dict) else None
        value = holder.get(leaf) if isinstance(holder, dict) else None
        if not isinstance(value, str) or not value:
            continue
        try:
            when = parse_time(value)
        except ValueError:
            raise ApiError(422, f"{path}: Invalid value: {value!r}: must be an RFC 3339 time") from None
        text = rfc3339_micro(when) if micro else rfc3339(when)
        if text != value:
            assert isinstance(holder, dict)
            if holder is obj:
                obj = {**obj, leaf: text}
            else:
                # rebuild the one nested level we touch (stored objects are never mutated in place)
                top = parents[0]
                obj = {**obj, top: {**obj[top], leaf: text}} if len(parents) == 1 else obj
    return obj


def check_namespace(rt: ResourceType, namespace: str, ns_bucket: dict[Key, Obj] | None) -> None:
    """A namespaced write names a namespace that exists (in `ns_bucket`) and is not terminating."""
    if not rt.namespaced:
        return
    if not namespace:
        raise ApiError.bad_request("the server could not find the requested resource: a namespace is required")
    if ns_bucket is not None and ("", namespace) not in ns_bucket:
        raise ApiError.not_found("namespaces", namespace)
    if ns_bucket is not None and meta_of(ns_bucket[("", namespace)]).get("deletionTimestamp"):
        raise ApiError(
            403,
            f"unable to create new content in namespace {namespace} because it is being terminated",
            reason="Forbidden",
        )


def validate_name(rt: ResourceType, name: str) -> None:
    if not name:
        raise ApiError.invalid(
            rt.kind,
            name,
            [("metadata.name", "Required value: name or generateName is required")],
            rt.group,
        )
    limit = 63 if rt.plural in ("namespaces", "services") else 253
    if len(name) > limit or not _NAME.match(name):
        raise ApiError.invalid(
            rt.kind,
            name,
            [
                (
                    "metadata.name",
                    f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower '
                    "case alphanumeric characters, '-' or '.', and must start and end with an "
                    "alphanumeric character",
                )
            ],
            rt.group,
        )


def check_type(rt: ResourceType, body: Obj) -> None:
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if kind and kind != rt.kind:
        raise ApiError.bad_request(f"the kind of the object ({kind}) does not match the resource ({rt.kind})")
    if api_version and api_version != rt.group_version:
        raise ApiError.bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version ({rt.group_version})"
        )


def default_status(rt: ResourceType) -> Obj | None:
    if rt.key == "/v1/pods":
        return {"phase": "Pending", "qosClass": "BestEffort"}
    if rt.key == "/v1/namespaces":
        return {"phase": "Active"}
    return None
