"""The simulator's object store: one lock, one resourceVersion sequence, a retained event window.

Stored objects are never mutated in place: every write builds a new dict, so readers (list pages,
watch streams, snapshots) can hold references without copying. Callers must treat returned
objects as read-only.

Beside it: the types it hands out (objects.py), the checks a write passes (admission.py), list
pages and continue tokens (paging.py), watch cursors (watch.py) and container logs (podlogs.py).
"""

from __future__ import annotations

import heapq
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from kubesim.admission import (
    SERVER_META,
    canonical_times,
    check_namespace,
    check_type,
    default_status,
    validate_name,
    without,
)
from kubesim.clock import Clock, SystemClock, rfc3339
from kubesim.errors import ApiError
from kubesim.objects import (
    Entry,
    Expired,
    Key,
    ListResult,
    Obj,
    StoreSettings,
    TooLarge,
    meta_of,
    parse_rv,
)
from kubesim.paging import SortedKeys, cut, decode_continue, encode_continue, page, snapshot
from kubesim.podlogs import PodLogs
from kubesim.registry import Registry, ResourceType
from kubesim.selectors import Selector
from kubesim.views import FROM_VIEW, TO_VIEW
from kubesim.watch import Watch

# Importers take these from here (kubesim.store) as they did before the store was split.
__all__ = [
    "Entry",
    "Expired",
    "Key",
    "ListResult",
    "Obj",
    "Store",
    "StoreSettings",
    "TooLarge",
    "Watch",
    "decode_continue",
    "encode_continue",
]

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_EVENTS = "/v1/events"


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
        self.pod_logs = PodLogs(self.cond, self.clock, self.settings.log_max_bytes)
        self._ttl: list[tuple[datetime, int, Key]] = []  # heap of (expiry, resourceVersion, key) of Events
        self._sorted_keys = SortedKeys()
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
            for ref in meta_of(obj).get("ownerReferences") or ():
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
                rv = parse_rv(resource_version)
                if rv > self._rv:
                    raise TooLarge(rv, self._rv)
                if rv < self._rv - self.settings.watch_window:
                    raise ApiError.expired(f"too old resource version: {rv} ({self.oldest_retained})")
            else:
                if resource_version not in ("", "0"):
                    # "Not older than" (the default for a set version, or NotOlderThan): a version
                    # this store has not reached cannot be served.
                    wanted = parse_rv(resource_version)
                    if wanted > self._rv:
                        raise TooLarge(wanted, self._rv)
                rv = self._rv
            snap = snapshot(self._bucket(rt), self._log, rt.storage_key, rv, self._rv, self.settings.watch_window)
            ns = namespace if namespace and rt.namespaced else ""
            keys = self._sorted_keys.at(rt.storage_key, rv, ns, snap, self._rv)
            objs, more = page(snap, keys, start, limit, selector)
        objs, token, remaining = cut(objs, more, limit, rv)
        return ListResult([self.to_view(rt, o) for o in objs], rv, token, remaining)

    # ------------------------------------------------------------------ writes
    def create(self, rt: ResourceType, namespace: str, body: Obj, *, dry_run: bool = False) -> Obj:
        """Create an object; the server sets uid, creationTimestamp, generation and resourceVersion."""
        if not isinstance(body, dict):
            raise ApiError.bad_request("the body must be a JSON object")
        stored_rt = self.registry.by_key(rt.storage_key) if rt.storage_of else rt
        body = dict(self._from_view(rt, body))
        check_type(stored_rt, body)
        meta = dict(meta_of(body))
        if rt.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise ApiError.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            namespace = namespace or str(meta.get("namespace") or "")
        with self.cond:
            check_namespace(rt, namespace, self._objects.get("/v1/namespaces"))
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = str(meta["generateName"]) + "".join(
                    self._rng.choice(_GENERATE_ALPHABET) for _ in range(5)
                )
            name = str(meta.get("name") or "")
            validate_name(rt, name)
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
                default = default_status(stored_rt)
                if default is not None:
                    body["status"] = default
            if stored_rt.plural == "namespaces":
                body.setdefault("spec", {"finalizers": ["kubernetes"]})
            body = canonical_times(rt.storage_key, body)
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
        check_type(stored_rt, body)
        meta = dict(meta_of(body))
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
            old_meta = meta_of(old)
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
                for k in SERVER_META:
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
                if stored_rt.status_subresource and without(new, "metadata", "status") != without(
                    old, "metadata", "status"
                ):
                    new_meta["generation"] = int(old_meta.get("generation") or 1) + 1
            new = canonical_times(rt.storage_key, new)
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
            rv = meta_of(current)["resourceVersion"]
            pmeta = meta_of(patched)
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
        grace_seconds: int | None = None,
    ) -> Obj:
        """Delete an object (honouring finalizers) and, unless orphaning, its dependents.

        `grace_seconds` (DeleteOptions.gracePeriodSeconds) > 0 on a pod bound to a node is a graceful
        deletion, as the API server does it: the pod gets `deletionTimestamp` = now + grace (a time in
        the future) and `deletionGracePeriodSeconds`, and stays (Terminating) until its kubelet
        confirms with grace 0. Without it the pod goes at once (what callers of this simulator expect).
        """
        with self.cond:
            key = self._key(rt, namespace, name)
            old = self._bucket(rt).get(key)
            if old is None:
                raise ApiError.not_found(rt.plural, name, rt.group)
            meta = meta_of(old)
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
            if (
                grace_seconds
                and grace_seconds > 0
                and stored_rt.key == "/v1/pods"
                and (old.get("spec") or {}).get("nodeName")
            ):
                if meta.get("deletionTimestamp"):
                    return self.to_view(rt, old)  # already terminating: a second request changes nothing here
                new_meta = {
                    **meta,
                    "deletionTimestamp": rfc3339(self.clock.now() + timedelta(seconds=grace_seconds)),
                    "deletionGracePeriodSeconds": int(grace_seconds),
                }
                self._rv += 1
                new_meta["resourceVersion"] = str(self._rv)
                new = {**old, "metadata": new_meta}
                self._bucket(rt)[key] = new
                self._record(rt.storage_key, "MODIFIED", new, old)
                return self.to_view(rt, new)
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
        gone = {**old, "metadata": {**meta_of(old), "resourceVersion": str(self._rv)}}
        self._index_owners(rt.storage_key, key, old, None)
        self._record(rt.storage_key, "DELETED", gone, old)
        if rt.key == "/v1/pods":
            self.pod_logs.drop_pod(key[0], key[1])
        if rt.key == "/v1/namespaces":
            for other in self.registry.types:
                if other.namespaced and not other.storage_of:
                    ob = self._objects[other.storage_key]
                    for k in [k for k in ob if k[0] == key[1]]:
                        if k in ob:
                            self._remove(other, k, ob[k], cascade=False)
        if cascade:
            uid = meta_of(old).get("uid", "")
            for storage, dep_key in sorted(self._dependents.get(uid, ())):
                dep = self._objects[storage].get(dep_key)
                if storage == "/v1/pods" and dep is not None and meta_of(dep).get("deletionTimestamp"):
                    continue  # a pod already terminating goes when its kubelet confirms, not with its owner
                if dep is not None:
                    self._remove(self.registry.by_key(storage), dep_key, dep, cascade=True)
        return gone

    def delete_collection(self, rt: ResourceType, namespace: str, selector: Selector | None = None) -> list[Obj]:
        """Delete every object of the type (in the namespace) that the selector matches."""
        with self.cond:
            victims = self.list_page(rt, namespace, selector).items
            out = []
            for obj in victims:
                meta = meta_of(obj)
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
                if current is None or meta_of(current).get("resourceVersion") != str(rv):
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

        Raises Expired when the version is older than the retained window, TooLarge when it is
        ahead of the store (a streaming list too: its state must be at least that recent).
        """
        with self.cond:
            if initial_events and resource_version not in ("", "0"):
                # A streaming list is "not older than" its resourceVersion: a version this store
                # has not reached cannot be served (the watch cache waits, then answers Too large).
                wanted = parse_rv(resource_version)
                if wanted > self._rv:
                    raise TooLarge(wanted, self._rv)
            if initial_events or resource_version in ("", "0"):
                start = self._rv
                initial = self.list_page(rt, namespace, selector).items if initial_events else []
            else:
                start = parse_rv(resource_version)
                initial = []
                if start > self._rv:
                    raise TooLarge(start, self._rv)
                if start < self._rv - self.settings.watch_window:
                    raise Expired(start, self._rv - self.settings.watch_window)
            return Watch(self, rt, namespace if rt.namespaced else "", selector, start, initial)

    def events_after(self, pos: int) -> list[Entry]:
        """Log entries with rv > pos (lock held); raises Expired when pos fell out of the window."""
        if pos < self._rv - self.settings.watch_window:
            raise Expired(pos, self._rv - self.settings.watch_window)
        if not self._log or pos >= self._rv:
            return []
        base = self._log[0].rv
        return self._log[max(0, pos + 1 - base) :]

    # ------------------------------------------------------------------ pod logs
    @property
    def log_version(self) -> int:
        """Counts log changes (a follow waits on `cond` until it moves)."""
        return self.pod_logs.version

    def append_log(
        self, namespace: str, pod: str, container: str, lines: Iterable[str], when: datetime | None = None
    ) -> int:
        """Append lines to a container's current log; returns the number of lines kept."""
        return self.pod_logs.append(namespace, pod, container, lines, when)

    def rotate_log(self, namespace: str, pod: str, container: str) -> None:
        """A container restarted: its current log becomes `previous`, the new one starts empty."""
        self.pod_logs.rotate(namespace, pod, container)

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
        return self.pod_logs.read(
            namespace,
            pod,
            container,
            previous=previous,
            tail_lines=tail_lines,
            limit_bytes=limit_bytes,
            timestamps=timestamps,
            since=since,
        )

    def log_lines(self, namespace: str, pod: str, container: str) -> int:
        return self.pod_logs.line_count(namespace, pod, container)
