"""List-then-watch per resource, resuming from the last resourceVersion.

On 410 Gone the reflector relists and hands the whole set to the sink, which diffs it against
what it knew: a delete that happened while the watch was down is not lost. Bookmarks advance the
resourceVersion and prove the source alive (freshness) without any object changing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Protocol

import orjson
from msgspec import UNSET

from collector.kube_pod import PodEvent, PodObject
from collector.sources.decode import FULL, Decoder
from collector.sources.kube_api import (
    JSON,
    Backoff,
    Expired,
    KubeApi,
    Resource,
    SourceError,
    Unreachable,
    is_too_large_rv,
)

log = logging.getLogger("taugrid.watch")


class WatchSink(Protocol):
    """Where reflectors deliver what they see (the controller)."""

    def upsert(self, resource: Resource, obj: JSON | PodObject) -> None:
        """An ADDED/MODIFIED object: a dict, or a typed pod from the pod decoder's fast path."""

    def delete(self, resource: Resource, obj: JSON) -> None: ...

    def replace(self, resource: Resource, objs: Iterable[JSON]) -> None:
        """A whole (re)list, read page by page while it is iterated: keep records, not `objs`."""

    def mark_synced(self, resource: Resource, at: datetime) -> None: ...

    def source_error(self, resource: Resource, error: SourceError) -> None: ...

    def flush(self, resource: Resource) -> None:
        """The end of one read: hand over what upsert/delete buffered since the last flush."""

    def watch_restarted(self, resource: Resource, relist: bool) -> None: ...


class Reflector:
    """One resource's list+watch loop, in its own thread."""

    def __init__(self, api: KubeApi, resource: Resource, sink: WatchSink, now: Callable[[], datetime], *,
                 watch_timeout_s: int = 300, backoff: Backoff | None = None, decoder: Decoder = FULL) -> None:
        self.api = api
        self.resource = resource
        self.sink = sink
        self.now = now
        self.watch_timeout_s = watch_timeout_s
        self.backoff = backoff or Backoff()
        self.decoder = decoder
        self.resource_version = ""
        self.synced_once = threading.Event()
        self.last_ok = 0.0  # time.monotonic() of the last list or watch event that arrived intact
        self._marked = 0.0
        self._relist_after_outage = False  # counted as a relist once it succeeds
        self._resumed = False  # the next watch resumes from an older stream, not from a fresh list
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"watch-{self.resource.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.resource_version:
                    self.relist()
                    if self._relist_after_outage:
                        self._relist_after_outage = False
                        self.sink.watch_restarted(self.resource, relist=True)
                elif self._resumed:
                    self.check_store()
                self._resumed = True
                self.watch_once()
                self.backoff.reset()
                self.sink.watch_restarted(self.resource, relist=False)
            except Expired as e:
                log.info("watch expired, relisting", extra={"resource": self.resource.name, "error": str(e)})
                self.resource_version = ""
                self.sink.source_error(self.resource, e)
                self.sink.watch_restarted(self.resource, relist=True)
            except SourceError as e:
                delay = self.backoff.next() * (1 if e.retryable else 10)
                if e.retry_after is not None:
                    delay = max(delay, e.retry_after)  # the server said when: not sooner
                if isinstance(e, Unreachable):
                    # What answers next may be a restarted server with another store, which would
                    # accept our resourceVersion and send nothing: list again rather than resume.
                    self._relist_after_outage = bool(self.resource_version) or self._relist_after_outage
                    self.resource_version = ""
                log.warning("watch failed", extra={"resource": self.resource.name, "error": str(e),
                                                   "retry_in_s": round(delay, 2)})
                self.sink.source_error(self.resource, e)
                self._stop.wait(delay)
            except Exception as e:  # a bug must not kill the source thread silently
                log.exception("reflector crashed", extra={"resource": self.resource.name})
                self.sink.source_error(self.resource, SourceError(f"{type(e).__name__}: {e}"))
                self._stop.wait(self.backoff.next())

    def check_store(self) -> None:
        """Before resuming a watch: is the server's store still the one we listed? A restored or
        replaced store is behind our resourceVersion, and may accept a watch from it while sending
        nothing (old servers, or bookmarks at our own version): one single-item list tells."""
        current = self.api.current_version(self.resource)
        if _older(current, self.resource_version):
            raise Expired(f"{self.resource.name}: the API server's store is at resourceVersion {current}, behind ours "
                          f"({self.resource_version}): restored or replaced")

    def relist(self) -> None:
        listing = self.api.iter_list(self.resource, decoder=self.decoder)
        self.sink.replace(self.resource, listing)
        self.resource_version = listing.resource_version
        self._resumed = False
        self.last_ok = time.monotonic()
        self._mark_synced(self.last_ok)
        self.synced_once.set()

    def watch_once(self) -> None:
        raw = self.api.open_watch(self.resource, self.resource_version, timeout_s=self.watch_timeout_s)
        self.last_ok = time.monotonic()  # the server accepted our resourceVersion: we are in step
        try:
            decode, apply, apply_typed = self.decoder.event, self._apply, self._apply_typed  # per event: bound once
            for lines in self.api.watch_lines(self.resource, raw):
                if self._stop.is_set():
                    return
                for line in lines:
                    try:
                        event = decode(line)
                    except orjson.JSONDecodeError as e:
                        raise SourceError(f"watch {self.resource.name}: undecodable event ({e})") from e
                    if type(event) is PodEvent:  # the pod decoder's fast path: only ADDED/MODIFIED come typed
                        apply_typed(event)
                    else:
                        apply(event)
                self.sink.flush(self.resource)
        finally:
            self.sink.flush(self.resource)  # what arrived intact before a failure still counts

    def _apply(self, event: Any) -> None:
        if type(event) is PodEvent:  # the pod decoder's fast path: only ADDED/MODIFIED come typed
            self._apply_typed(event)
            return
        if not isinstance(event, dict):
            raise SourceError(f"watch {self.resource.name}: event is not an object")
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise SourceError(f"watch {self.resource.name}: {kind} event without object")
        if kind == "ERROR":
            code = obj.get("code")
            msg = f"watch {self.resource.name}: {obj.get('reason')}: {obj.get('message')}"
            if code == 410 or is_too_large_rv(code, obj):
                raise Expired(msg)
            raise SourceError(msg)
        meta = obj.get("metadata")
        rv = str((meta if isinstance(meta, dict) else {}).get("resourceVersion") or "")
        if kind == "BOOKMARK":
            if _older(rv, self.resource_version):
                # Versions never go back on one store: this server's store is not the one we listed.
                raise Expired(f"watch {self.resource.name}: bookmark at resourceVersion {rv}, behind ours "
                              f"({self.resource_version}): the API server's store changed")
            now_m = time.monotonic()
            self.last_ok = now_m
            if rv:
                self.resource_version = rv
            self._mark_synced(now_m)
            return
        now_m = time.monotonic()
        self.last_ok = now_m
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        if kind in ("ADDED", "MODIFIED"):
            self.sink.upsert(self.resource, obj)
        elif kind == "DELETED":
            self.sink.delete(self.resource, obj)
        else:
            log.warning("unknown watch event type", extra={"resource": self.resource.name, "type": kind})
        if rv:
            self.resource_version = rv
        if now_m - self._marked >= SYNC_MARK_INTERVAL_S:
            self._mark_synced(now_m)

    def _apply_typed(self, event: PodEvent) -> None:
        """`_apply` of an ADDED/MODIFIED pod decoded into Structs: same steps, attributes for keys."""
        obj = event.object
        assert type(obj) is PodObject
        now_m = time.monotonic()
        self.last_ok = now_m
        if obj.kind is UNSET:
            obj.kind = self.resource.kind
        if obj.apiVersion is UNSET:
            obj.apiVersion = self.resource.api_version
        self.sink.upsert(self.resource, obj)
        rv = obj.resource_version
        if rv:
            self.resource_version = rv
        if now_m - self._marked >= SYNC_MARK_INTERVAL_S:
            self._mark_synced(now_m)

    def _mark_synced(self, now_m: float) -> None:
        self._marked = now_m
        self.sink.mark_synced(self.resource, self.now())


def _older(rv: str, than: str) -> bool:
    """resourceVersions are opaque, but every API server in use issues etcd revisions: integers."""
    return rv.isdigit() and than.isdigit() and int(rv) < int(than)


# Freshness needs "alive recently", not a mark per event: one a second at most (bookmarks always).
SYNC_MARK_INTERVAL_S = 1.0


def wait_synced(reflectors: list[Reflector], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    return all(r.synced_once.wait(max(0.0, deadline - time.monotonic())) for r in reflectors)
