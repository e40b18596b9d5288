"""The simulator's object store: one lock, one resourceVersion sequence, a retained event window.

Stored objects are never mutated in place: every write builds a new dict, so readers (list pages,
watch streams, snapshots) can hold references without copying. Callers must treat returned
objects as read-only.
"""

from __future__ import annotations

import base64
import bisect
import heapq
import random
import re
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from kubesim.clock import Clock, SystemClock, parse_time, rfc3339, rfc3339_micro, rfc3339_nano
from kubesim.errors import ApiError
from kubesim.registry import Registry, ResourceType
from kubesim.selectors import Selector
from kubesim.views import FROM_VIEW, TO_VIEW

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SERVER_META = ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds")
_INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_EVENTS = "/v1/events"


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Store behaviour that tests and benchmarks tune."""

    # Number of most recent writes kept for watch resumption and continue tokens; a watch or
    # continue token older than this window answers 410 Gone (Expired).
    watch_window: int = 10_000
    # Per-container log text kept (oldest lines dropped first).
    log_max_bytes: int = 1 << 20
    # Seed for uids and generated names, so a scenario replays identically.
    seed: int = 0
    # core/v1 Events are deleted this many (scenario) seconds after their last write, as
    # kube-apiserver's --event-ttl (1 h by default) does through etcd leases; None keeps them.
    event_ttl_s: float | None = None


@dataclass(slots=True)
class Entry:
    """One write in the event log. `prev` is the object before the write (None for ADDED)."""

    rv: int
    storage: str
    type: str
    obj: Obj
    prev: Obj | None


@dataclass(slots=True)
class _ContainerLog:
    lines: deque[tuple[datetime, str]] = field(default_factory=deque)
    size: int = 0
    previous: list[tuple[datetime, str]] | None = None


@dataclass(slots=True)
class ListResult:
    items: list[Obj]
    resource_version: int
    continue_token: str
    remaining: int | None


class Expired(Exception):
    """A watch fell behind the retained window."""

    def __init__(self, rv: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {rv} ({oldest})")


class TooLarge(Exception):
    """A list or watch asked for a resourceVersion this store has not reached (a restored or
    replaced store, or a client that saw another server). The server answers it as Kubernetes' watch
    cache does: 504 Timeout "Too large resource version" (k8s.io/apiserver storage errors)."""

    def __init__(self, rv: int, current: int) -> None:
        super().__init__(f"Too large resource version: {rv}, current: {current}")
        self.rv, self.current = rv, current


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _without(obj: Obj, *keys: str) -> Obj:
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


def _canonical_times(storage: str, obj: Obj) -> Obj:
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


def encode_continue(rv: int, key: Key) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": f"{key[0]}/{key[1]}\x00"})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, Key]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = orjson.loads(raw)
        ns, _, name = str(data["start"]).rstrip("\x00").partition("/")
        return int(data["rv"]), (ns, name)
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError.bad_request(f"continue key is not valid: {exc}") from exc


class Store:
    """Thread-safe object store with Kubernetes write, list and watch semantics."""

    def __init__(
        self,
        registry: Registry | None = None,
        clock: Clock | None = None,
        settings: StoreSettings | None = None,
    ) -> None:
        self.registry = registry or Registry()
        self.clock: Clock = clock or SystemClock()
        self.settings = settings or StoreSettings()
        self.cond = threading.Condition(threading.RLock())
        self._rng = random.Random(self.settings.seed)
        self._objects: dict[str, dict[Key, Obj]] = {rt.storage_key: {} for rt in self.registry.types}
        self._log: list[Entry] = []
        self._rv = 0
        self._dependents: dict[str, set[tuple[str, Key]]] = {}
        self._logs: dict[tuple[str, str, str], _ContainerLog] = {}
        self._ttl: list[tuple[datetime, int, Key]] = []  # heap of (expiry, resourceVersion, key) of Events
        # A paged list's sorted keys at its resourceVersion (what a version holds never changes), so
        # that each page is a bisect, not a sort of the whole type: lists of 300k Events were O(n^2).
        self._sorted_keys: OrderedDict[tuple[str, int, str], list[Key]] = OrderedDict()
        self.log_version = 0
        self.closed = False
        ns_type = self.registry.lookup("", "v1", "namespaces")
        if ns_type is not None:
            for ns in _INITIAL_NAMESPACES:
                self.create(ns_type, "", {"metadata": {"name": ns}})

    # ------------------------------------------------------------------ basics
    @property
    def resource_version(self) -> int:
        """The latest resourceVersion handed out."""
        with self.cond:
            return self._rv

    @property
    def oldest_retained(self) -> int:
        """Oldest resourceVersion a watch or continue token may still start from."""
        with self.cond:
            return max(0, self._rv - self.settings.watch_window)

    def wait_for(self, rv: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the store to reach `rv` (the watch cache's short wait
        before it answers "too large"); True when it has."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self._rv < rv and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return self._rv >= rv

    def close(self) -> None:
        """Wake and end every watch."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def to_view(self, rt: ResourceType, obj: Obj) -> Obj:
        conv = TO_VIEW.get(rt.key)
        return conv(obj) if conv and rt.storage_of else obj

    def _from_view(self, rt: ResourceType, obj: Obj) -> Obj:
        conv = FROM_VIEW.get(rt.key)
        return conv(obj) if conv and rt.storage_of else obj

    def _new_uid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _bucket(self, rt: ResourceType) -> dict[Key, Obj]:
        return self._objects[rt.storage_key]

    def _key(self, rt: ResourceType, namespace: str, name: str) -> Key:
        return (namespace if rt.namespaced else "", name)

    def _record(self, storage: str, type_: str, obj: Obj, prev: Obj | None) -> None:
        self._log.append(Entry(self._rv, storage, type_, obj, prev))
        window = self.settings.watch_window
        if len(self._log) > window + max(64, window // 4):
            del self._log[: len(self._log) - window]
        self.cond.notify_all()

    def _index_owners(self, storage: str, key: Key, old: Obj | None, new: Obj | None) -> None:
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            for ref in _meta(obj).get("ownerReferences") or ():
                uid = ref.get("uid") if isinstance(ref, dict) else None
                if not uid:
                    continue
                deps = self._dependents.setdefault(uid, set())
                if add:
                    deps.add((storage, key))
                else:
                    deps.discard((storage, key))
                    if not deps:
                        del self._dependents[uid]

    # ------------------------------------------------------------------ reads
    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        """The object (view of `rt`), or ApiError 404."""
        with self.cond:
            obj = self._bucket(rt).get(self._key(rt, namespace, name))
        if obj is None:
            raise ApiError.not_found(rt.plural, name, rt.group)
        return self.to_view(rt, obj)

    def _snapshot(self, rt: ResourceType, rv: int) -> dict[Key, Obj]:
        """The type's objects as they were at `rv` (lock held)."""
        bucket = self._bucket(rt)
        if rv >= self._rv:
            return bucket
        if rv < self._rv - self.settings.watch_window or (self._log and self._log[0].rv > rv + 1):
            raise ApiError.expired(
                "The provided continue parameter is too old to display a consistent list result. "
                "You can start a new list without the continue parameter."
            )
        snap = dict(bucket)
        storage = rt.storage_key
        for entry in reversed(self._log):
            if entry.rv <= rv:
                break
            if entry.storage != storage:
                continue
            key = (_meta(entry.obj).get("namespace", ""), _meta(entry.obj)["name"])
            if entry.prev is None:
                snap.pop(key, None)
            else:
                snap[key] = entry.prev
        return snap

    def list_page(
        self,
        rt: ResourceType,
        namespace: str = "",
        selector: Selector | None = None,
        limit: int = 0,
        continue_token: str = "",
        resource_version: str = "",
        resource_version_match: str = "",
    ) -> ListResult:
        """A list page with the API server's resourceVersion, limit and continue semantics."""
        start: Key | None = None
        with self.cond:
            if continue_token:
                rv, start = decode_continue(continue_token)
            elif resource_version_match == "Exact" and resource_version:
                rv = self._parse_rv(resource_version)
                if rv > self._rv:
                    raise TooLarge(rv, self._rv)
                if rv < self._rv - self.settings.watch_window:
                    raise ApiError.expired(f"too old resource version: {rv} ({self.oldest_retained})")
            else:
                if resource_version not in ("", "0"):
                    # "Not older than" (the default for a set version, or NotOlderThan): a version
                    # this store has not reached cannot be served.
                    wanted = self._parse_rv(resource_version)
                    if wanted > self._rv:
                        raise TooLarge(wanted, self._rv)
                rv = self._rv
            snap = self._snapshot(rt, rv)
            ns = namespace if namespace and rt.namespaced else ""
            keys = self._keys_at(rt, rv, ns, snap)
            first = 0 if start is None else bisect.bisect_right(keys, start)
            if selector is None or selector.empty:
                # Only the page (and one past it, to know whether more remain) is read.
                end = len(keys) if not limit else min(len(keys), first + limit + 1)
                objs = [snap[k] for k in keys[first:end]]
                more = len(keys) - first
            else:
                objs = [o for k in keys[first:] if selector.matches(o := snap[k])]
                more = len(objs)
        token, remaining = "", None
        if limit and more > limit:
            last = objs[limit - 1]
            token = encode_continue(rv, (_meta(last).get("namespace", ""), _meta(last)["name"]))
            remaining = more - limit
            objs = objs[:limit]
        return ListResult([self.to_view(rt, o) for o in objs], rv, token, remaining)

    def _keys_at(self, rt: ResourceType, rv: int, namespace: str, snap: dict[Key, Obj]) -> list[Key]:
        """The sorted keys of `snap` (the type at `rv`, in `namespace` or all), cached (lock held)."""
        cache_key = (rt.storage_key, rv, namespace)
        keys = self._sorted_keys.get(cache_key)
        if keys is None:
            keys = sorted(k for k in snap if k[0] == namespace) if namespace else sorted(snap)
            if rv <= self._rv:  # a version this store has not reached yet may still change
                self._sorted_keys[cache_key] = keys
            while len(self._sorted_keys) > 16:
                self._sorted_keys.popitem(last=False)
        else:
            self._sorted_keys.move_to_end(cache_key)
        return keys

    @staticmethod
    def _parse_rv(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ApiError.bad_request(f"invalid resource version: {text!r}") from None
        if value < 0:
            raise ApiError.bad_request(f"invalid resource version: {text!r}")
        return value

    # ------------------------------------------------------------------ writes
    def _check_namespace(self, rt: ResourceType, namespace: str) -> None:
        if not rt.namespaced:
            return
        if not namespace:
            raise ApiError.bad_request("the server could not find the requested resource: a namespace is required")
        ns_bucket = self._objects.get("/v1/namespaces")
        if ns_bucket is not None and ("", namespace) not in ns_bucket:
            raise ApiError.not_found("namespaces", namespace)
        if ns_bucket is not None and _meta(ns_bucket[("", namespace)]).get("deletionTimestamp"):
            raise ApiError(
                403,
                f"unable to create new content in namespace {namespace} because it is being terminated",
                reason="Forbidden",
            )

    def _validate(self, rt: ResourceType, name: str) -> None:
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

    def _check_type(self, rt: ResourceType, body: Obj) -> None:
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if kind and kind != rt.kind:
            raise ApiError.bad_request(f"the kind of the object ({kind}) does not match the resource ({rt.kind})")
        if api_version and api_version != rt.group_version:
            raise ApiError.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({rt.group_version})"
            )

    def _default_status(self, rt: ResourceType) -> Obj | None:
        if rt.key == "/v1/pods":
            return {"phase": "Pending", "qosClass": "BestEffort"}
        if rt.key == "/v1/namespaces":
            return {"phase": "Active"}
        return None

    def create(self, rt: ResourceType, namespace: str, body: Obj, *, dry_run: bool = False) -> Obj:
        """Create an object; the server sets uid, creationTimestamp, generation and resourceVersion."""
        if not isinstance(body, dict):
            raise ApiError.bad_request("the body must be a JSON object")
        stored_rt = self.registry.by_key(rt.storage_key) if rt.storage_of else rt
        body = dict(self._from_view(rt, body))
        self._check_type(stored_rt, body)
        meta = dict(_meta(body))
        if rt.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise ApiError.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            namespace = namespace or str(meta.get("namespace") or "")
        with self.cond:
            self._check_namespace(rt, namespace)
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = str(meta["generateName"]) + "".join(
                    self._rng.choice(_GENERATE_ALPHABET) for _ in range(5)
                )
            name = str(meta.get("name") or "")
            self._validate(rt, name)
            key = self._key(rt, namespace, name)
            bucket = self._bucket(rt)
            if key in bucket:
                raise ApiError.already_exists(rt.plural, name, rt.group)
            for drop in (
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
            ):
                meta.pop(drop, None)
            if rt.namespaced:
                meta["namespace"] = namespace
            else:
                meta.pop("namespace", None)
            meta["uid"] = self._new_uid()
            meta["creationTimestamp"] = rfc3339(self.clock.now())
            if stored_rt.status_subresource:
                meta["generation"] = 1
            if stored_rt.plural == "namespaces":
                meta["labels"] = {**(meta.get("labels") or {}), "kubernetes.io/metadata.name": name}
            body["apiVersion"], body["kind"] = stored_rt.group_version, stored_rt.kind
            if stored_rt.status_subresource:
                body.pop("status", None)
                default = self._default_status(stored_rt)
                if default is not None:
                    body["status"] = default
            if stored_rt.plural == "namespaces":
                body.setdefault("spec", {"finalizers": ["kubernetes"]})
            body = _canonical_times(rt.storage_key, body)
            if dry_run:
                meta["resourceVersion"] = str(self._rv)
                body["metadata"] = meta
                return self.to_view(rt, body)
            body["metadata"] = meta
            self._write(rt, bucket, key, body, None)
        return self.to_view(rt, body)

    def _write(self, rt: ResourceType, bucket: dict[Key, Obj], key: Key, new: Obj, old: Obj | None) -> None:
        """Store a created (old None) or replaced object under the next resourceVersion, and log it."""
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        bucket[key] = new
        if self.settings.event_ttl_s is not None and rt.storage_key == _EVENTS:
            # Every write renews the lease, as the API server attaches a fresh TTL lease on update.
            expires = self.clock.now() + timedelta(seconds=self.settings.event_ttl_s)
            heapq.heappush(self._ttl, (expires, self._rv, key))
        self._index_owners(rt.storage_key, key, old, new)
        self._record(rt.storage_key, "MODIFIED" if old is not None else "ADDED", new, old)

    def replace(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Obj,
        *,
        subresource: str = "",
        dry_run: bool = False,
    ) -> Obj:
        """PUT: optimistic concurrency on metadata.resourceVersion (409 Conflict on mismatch)."""
        if not isinstance(body, dict):
            raise ApiError.bad_request("the body must be a JSON object")
        stored_rt = self.registry.by_key(rt.storage_key) if rt.storage_of else rt
        body = dict(self._from_view(rt, body))
        self._check_type(stored_rt, body)
        meta = dict(_meta(body))
        if meta.get("name") and meta["name"] != name:
            raise ApiError.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        if rt.namespaced and meta.get("namespace") and meta["namespace"] != namespace:
            raise ApiError.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        with self.cond:
            key = self._key(rt, namespace, name)
            bucket = self._bucket(rt)
            old = bucket.get(key)
            if old is None:
                raise ApiError.not_found(rt.plural, name, rt.group)
            old_meta = _meta(old)
            if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta["resourceVersion"]:
                raise ApiError.conflict(rt.plural, name, rt.group)
            if meta.get("uid") and meta["uid"] != old_meta["uid"]:
                raise ApiError(
                    409,
                    f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {old_meta['uid']}",
                    reason="Conflict",
                )
            if subresource == "status":
                new = dict(old)
                if "status" in body:
                    new["status"] = body["status"]
                else:
                    new.pop("status", None)
                new_meta = dict(old_meta)
            else:
                new = body
                new_meta = meta
                for k in _SERVER_META:
                    if k in old_meta:
                        new_meta[k] = old_meta[k]
                    else:
                        new_meta.pop(k, None)
                new_meta["name"] = name
                if rt.namespaced:
                    new_meta["namespace"] = namespace
                else:
                    new_meta.pop("namespace", None)
                new_meta.pop("managedFields", None)
                new["apiVersion"], new["kind"] = stored_rt.group_version, stored_rt.kind
                if stored_rt.status_subresource:
                    if "status" in old:
                        new["status"] = old["status"]
                    else:
                        new.pop("status", None)
                if stored_rt.status_subresource and _without(new, "metadata", "status") != _without(
                    old, "metadata", "status"
                ):
                    new_meta["generation"] = int(old_meta.get("generation") or 1) + 1
            new = _canonical_times(rt.storage_key, new)
            new_meta["resourceVersion"] = old_meta["resourceVersion"]
            new["metadata"] = new_meta
            if new == old:
                return self.to_view(rt, old)
            if dry_run:
                return self.to_view(rt, new)
            if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
                self._remove(stored_rt, key, old, cascade=True)
                return self.to_view(rt, new)
            self._write(rt, bucket, key, new, old)
        return self.to_view(rt, new)

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        patch_fn: Callable[[Obj], Obj],
        *,
        subresource: str = "",
        dry_run: bool = False,
        create_missing: bool = False,
    ) -> Obj:
        """Apply `patch_fn` to the current object (view of `rt`) and store the result.

        A resourceVersion the patch sets explicitly is a precondition (409 when stale).
        """
        with self.cond:
            current = self._bucket(rt).get(self._key(rt, namespace, name))
            if current is None:
                if create_missing:
                    body = patch_fn({})
                    return self.create(rt, namespace, body, dry_run=dry_run)
                raise ApiError.not_found(rt.plural, name, rt.group)
            view = self.to_view(rt, current)
            patched = patch_fn(view)
            if not isinstance(patched, dict):
                raise ApiError(422, "the patch did not produce an object")
            rv = _meta(current)["resourceVersion"]
            pmeta = _meta(patched)
            if pmeta.get("resourceVersion") not in (None, rv):
                raise ApiError.conflict(rt.plural, name, rt.group)
            if "metadata" not in patched:
                patched = {**patched, "metadata": {"resourceVersion": rv}}
            else:
                patched = {**patched, "metadata": {**pmeta, "resourceVersion": rv}}
            return self.replace(rt, namespace, name, patched, subresource=subresource, dry_run=dry_run)

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        *,
        uid: str = "",
        resource_version: str = "",
        propagation: str = "Background",
        dry_run: bool = False,
    ) -> Obj:
        """Delete an object (honouring finalizers) and, unless orphaning, its dependents."""
        with self.cond:
            key = self._key(rt, namespace, name)
            old = self._bucket(rt).get(key)
            if old is None:
                raise ApiError.not_found(rt.plural, name, rt.group)
            meta = _meta(old)
            if (uid and uid != meta["uid"]) or (resource_version and resource_version != meta["resourceVersion"]):
                raise ApiError(409, f'Precondition failed: the object "{name}" has changed', reason="Conflict")
            if dry_run:
                return self.to_view(rt, old)
            stored_rt = self.registry.by_key(rt.storage_key) if rt.storage_of else rt
            if stored_rt.plural == "namespaces" and name in ("default", "kube-system", "kube-public"):
                raise ApiError(
                    403,
                    f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                    reason="Forbidden",
                )
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return self.to_view(rt, old)
                new_meta = {
                    **meta,
                    "deletionTimestamp": rfc3339(self.clock.now()),
                    "deletionGracePeriodSeconds": 0,
                }
                self._rv += 1
                new_meta["resourceVersion"] = str(self._rv)
                new = {**old, "metadata": new_meta}
                self._bucket(rt)[key] = new
                self._record(rt.storage_key, "MODIFIED", new, old)
                return self.to_view(rt, new)
            gone = self._remove(stored_rt, key, old, cascade=propagation != "Orphan")
        return self.to_view(rt, gone)

    def _remove(self, rt: ResourceType, key: Key, old: Obj, *, cascade: bool) -> Obj:
        """Remove a stored object, recording DELETED (lock held)."""
        bucket = self._objects[rt.storage_key]
        bucket.pop(key, None)
        self._rv += 1
        gone = {**old, "metadata": {**_meta(old), "resourceVersion": str(self._rv)}}
        self._index_owners(rt.storage_key, key, old, None)
        self._record(rt.storage_key, "DELETED", gone, old)
        if rt.key == "/v1/pods":
            for log_key in [k for k in self._logs if k[0] == key[0] and k[1] == key[1]]:
                del self._logs[log_key]
        if rt.key == "/v1/namespaces":
            for other in self.registry.types:
                if other.namespaced and not other.storage_of:
                    ob = self._objects[other.storage_key]
                    for k in [k for k in ob if k[0] == key[1]]:
                        if k in ob:
                            self._remove(other, k, ob[k], cascade=False)
        if cascade:
            uid = _meta(old).get("uid", "")
            for storage, dep_key in sorted(self._dependents.get(uid, ())):
                dep = self._objects[storage].get(dep_key)
                if dep is not None:
                    self._remove(self.registry.by_key(storage), dep_key, dep, cascade=True)
        return gone

    def delete_collection(self, rt: ResourceType, namespace: str, selector: Selector | None = None) -> list[Obj]:
        """Delete every object of the type (in the namespace) that the selector matches."""
        with self.cond:
            victims = self.list_page(rt, namespace, selector).items
            out = []
            for obj in victims:
                meta = _meta(obj)
                try:
                    out.append(self.delete(rt, str(meta.get("namespace", "")), str(meta["name"])))
                except ApiError:
                    continue
            return out

    def expire_events(self, now: datetime | None = None) -> int:
        """Delete the Events whose TTL has passed at `now` (default: the clock's); watchers see
        DELETED. Returns how many went."""
        now = now or self.clock.now()
        gone = 0
        with self.cond:
            events_rt = self.registry.by_key(_EVENTS) if self._ttl else None
            while self._ttl and self._ttl[0][0] <= now:
                _, rv, key = heapq.heappop(self._ttl)
                assert events_rt is not None
                current = self._objects[_EVENTS].get(key)
                if current is None or _meta(current).get("resourceVersion") != str(rv):
                    continue  # deleted already, or written since (a later lease covers it)
                self._remove(events_rt, key, current, cascade=False)
                gone += 1
        return gone

    # ------------------------------------------------------------------ watch
    def watch(
        self,
        rt: ResourceType,
        namespace: str = "",
        selector: Selector | None = None,
        resource_version: str = "",
        initial_events: bool = False,
    ) -> Watch:
        """Start a watch after `resource_version`; with `initial_events`, current state first as ADDED.

        Raises Expired when the version is older than the retained window.
        """
        with self.cond:
            if initial_events or resource_version in ("", "0"):
                start = self._rv
                initial = self.list_page(rt, namespace, selector).items if initial_events else []
            else:
                start = self._parse_rv(resource_version)
                initial = []
                if start > self._rv:
                    raise TooLarge(start, self._rv)
                if start < self._rv - self.settings.watch_window:
                    raise Expired(start, self._rv - self.settings.watch_window)
            return Watch(self, rt, namespace if rt.namespaced else "", selector, start, initial)

    def _events_after(self, pos: int) -> list[Entry]:
        """Log entries with rv > pos (lock held); raises Expired when pos fell out of the window."""
        if pos < self._rv - self.settings.watch_window:
            raise Expired(pos, self._rv - self.settings.watch_window)
        if not self._log or pos >= self._rv:
            return []
        base = self._log[0].rv
        return self._log[max(0, pos + 1 - base) :]

    # ------------------------------------------------------------------ pod logs
    def append_log(
        self, namespace: str, pod: str, container: str, lines: Iterable[str], when: datetime | None = None
    ) -> int:
        """Append lines to a container's current log; returns the number of lines kept."""
        when = when or self.clock.now()
        with self.cond:
            log = self._logs.setdefault((namespace, pod, container), _ContainerLog())
            for line in lines:
                # Like the container runtime: only "\n" ends a line; tqdm's "\r" frames stay in one.
                parts = line.split("\n")
                if len(parts) > 1 and parts[-1] == "":
                    parts.pop()
                for part in parts:
                    log.lines.append((when, part))
                    log.size += len(part) + 1
            while log.size > self.settings.log_max_bytes and log.lines:
                _, dropped = log.lines.popleft()
                log.size -= len(dropped) + 1
            self.log_version += 1
            self.cond.notify_all()
            return len(log.lines)

    def rotate_log(self, namespace: str, pod: str, container: str) -> None:
        """A container restarted: its current log becomes `previous`, the new one starts empty."""
        with self.cond:
            log = self._logs.setdefault((namespace, pod, container), _ContainerLog())
            log.previous = list(log.lines)
            log.lines = deque()
            log.size = 0
            self.log_version += 1
            self.cond.notify_all()

    def read_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        previous: bool = False,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
        timestamps: bool = False,
        since: datetime | None = None,
    ) -> tuple[bytes, int]:
        """Log text like the kubelet serves it, plus the number of lines available (for follow)."""
        with self.cond:
            log = self._logs.get((namespace, pod, container))
            if previous:
                if log is None or log.previous is None:
                    raise ApiError.bad_request(f'previous terminated container "{container}" in pod "{pod}" not found')
                lines = list(log.previous)
            else:
                lines = list(log.lines) if log else []
        total = len(lines)
        if since is not None:
            lines = [(t, line) for t, line in lines if t >= since]
        if tail_lines is not None:
            lines = lines[-tail_lines:] if tail_lines > 0 else []
        if timestamps:
            text = "".join(f"{rfc3339_nano(t)} {line}\n" for t, line in lines)
        else:
            text = "".join(f"{line}\n" for _, line in lines)
        data = text.encode()
        if limit_bytes is not None:
            data = data[:limit_bytes]
        return data, total

    def log_lines(self, namespace: str, pod: str, container: str) -> int:
        with self.cond:
            log = self._logs.get((namespace, pod, container))
            return len(log.lines) if log else 0


class Watch:
    """One watch stream's cursor over the store's event log."""

    def __init__(
        self,
        store: Store,
        rt: ResourceType,
        namespace: str,
        selector: Selector | None,
        start_rv: int,
        initial: list[Obj],
    ) -> None:
        self.store = store
        self.rt = rt
        self.namespace = namespace
        self.selector = selector if selector is not None and not selector.empty else None
        self.pos = start_rv
        self.initial: list[Obj] | None = initial

    def _match(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        if self.namespace and _meta(obj).get("namespace") != self.namespace:
            return False
        return self.selector is None or self.selector.matches(obj)

    def poll(self, timeout: float) -> list[tuple[str, Entry | Obj]]:
        """Events since the last poll, waiting up to `timeout` seconds for one.

        Items are (type, Entry) for logged writes, or (type, object) for the initial state.
        Raises Expired when the watch fell behind the retained window.
        """
        if self.initial is not None:
            initial, self.initial = self.initial, None
            if initial:
                return [("ADDED", o) for o in initial]
        store = self.store
        storage = self.rt.storage_key
        with store.cond:
            if store._rv <= self.pos and not store.closed and timeout > 0:
                store.cond.wait(timeout)
            entries = store._events_after(self.pos)
            self.pos = max(self.pos, store._rv)
        out: list[tuple[str, Entry | Obj]] = []
        for e in entries:
            if e.storage != storage:
                continue
            if e.type == "MODIFIED" and (self.namespace or self.selector):
                was, now = self._match(e.prev), self._match(e.obj)
                if was and now:
                    out.append(("MODIFIED", e))
                elif now:
                    out.append(("ADDED", e))
                elif was:
                    out.append(("DELETED", e))
            elif self._match(e.obj):
                out.append((e.type, e))
        return out
