"""List-then-watch per resource, resuming from the last resourceVersion.

On 410 Gone the reflector relists and hands the whole set to the sink, which diffs it against
what it knew: a delete that happened while the watch was down is not lost. Bookmarks advance the
resourceVersion and prove the source alive (freshness) without any object changing.

A list is read page by page, or, with `stream_lists`, as a streaming list (WatchList, KEP-3157): a
watch with sendInitialEvents=true whose ADDED events are the current state, ended by a BOOKMARK
annotated `k8s.io/initial-events-end: "true"` at the version a watch then resumes from. One request,
objects one at a time (no page of hundreds in memory), and the API server answers it from its watch
cache. A server without the feature (before 1.32 unless its WatchList gate is on; aggregated API
servers with gates of their own) refuses it (400/422), or streams without the end bookmark: the
reflector then lists page by page, and keeps doing so for its life.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
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
    PermanentSourceError,
    Resource,
    RetryableSourceError,
    SourceError,
    Unreachable,
    is_too_large_rv,
)

log = logging.getLogger("taugrid.watch")


# New reflectors read lists as streaming lists (WatchList) when this is set; see the module docstring.
STREAM_LISTS = False
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# A streaming list's longest silence before its end bookmark: a server writes its initial events
# without pause, so one that says nothing this long is not sending that bookmark.
STREAM_LIST_IDLE_S = 60.0
LIST_PAGE = 500  # objects a list page asks for (0: the whole list in one answer)


class WatchListUnsupported(SourceError):
    """The server does not serve streaming lists: refused, or streamed without the end bookmark."""


class WatchSink(Protocol):
    """Where reflectors deliver what they see (the controller)."""

    def upsert(self, resource: Resource, obj: JSON | PodObject) -> None:
        """An ADDED/MODIFIED object: a dict, or a typed pod from the pod decoder's fast path."""

    def delete(self, resource: Resource, obj: JSON) -> None: ...

    def replace(self, resource: Resource, objs: Iterable[JSON | PodObject]) -> None:
        """A whole (re)list, read as it is iterated (page by page, or a streaming list's events, pods
        from the typed decoder as `PodObject`s): keep records, not `objs`."""

    def mark_synced(self, resource: Resource, at: datetime) -> None: ...

    def source_error(self, resource: Resource, error: SourceError) -> None: ...

    def flush(self, resource: Resource) -> None:
        """The end of one read: hand over what upsert/delete buffered since the last flush."""

    def watch_restarted(self, resource: Resource, relist: bool) -> None: ...


class Reflector:
    """One resource's list+watch loop, in its own thread."""

    def __init__(self, api: KubeApi, resource: Resource, sink: WatchSink, now: Callable[[], datetime], *,
                 watch_timeout_s: int = 300, backoff: Backoff | None = None, decoder: Decoder = FULL,
                 stream_lists: bool | None = None) -> None:
        self.api = api
        self.resource = resource
        self.sink = sink
        self.now = now
        self.watch_timeout_s = watch_timeout_s
        self.backoff = backoff or Backoff()
        self.decoder = decoder
        self.stream_lists = STREAM_LISTS if stream_lists is None else stream_lists
        self.list_mode = ""  # how the last (re)list was read: "stream", "pages" or "whole"
        self.resource_version = ""
        self.synced_once = threading.Event()
        self.last_ok = 0.0  # time.monotonic() of the last list or watch event that arrived intact
        self._marked = 0.0
        self._relist_after_outage = False  # counted as a relist once it succeeds
        self._resumed = False  # the next watch resumes from an older stream, not from a fresh list
        # A paged list outran the versions the server keeps (410 on a continue page, as a loaded
        # reader meets under steady writes): paging again would expire again, so the next list is
        # one snapshot (`relist`; client-go's pager lists whole: FullListIfExpired). Paged after it.
        self._list_whole = False
        self._stream_refused = False  # the server answered a streaming list with 400/422
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
        # After a paged list expired (`_list_whole`): a streaming list where the server serves them (one
        # snapshot, objects one at a time: no continue to expire, no whole list in memory), else one
        # unpaginated answer, read off the socket item by item (`Listing`: a read and an item in memory).
        whole, self._list_whole = self._list_whole, False
        if self.stream_lists or (whole and not self._stream_refused):
            try:
                self._stream_list()
                return
            except WatchListUnsupported as e:
                self.stream_lists, self._stream_refused = False, True
                log.info("streaming list not served: listing " + ("whole" if whole else "page by page"),
                         extra={"resource": self.resource.name, "error": str(e)})
        listing = self.api.iter_list(self.resource, decoder=self.decoder, limit=0 if whole else LIST_PAGE)
        try:
            self.sink.replace(self.resource, listing)
        except Expired as e:
            if listing.pages and not whole:  # a continue page: paging again would likely expire again
                self._list_whole = True
                log.warning("paged list outran the API server's retained versions: the next list is "
                            + ("whole" if self._stream_refused else "a streaming list"),
                            extra={"resource": self.resource.name, "pages": listing.pages, "error": str(e)})
            raise
        self._listed(listing.resource_version, "whole" if whole else "pages")

    def _stream_list(self) -> None:
        """A (re)list as a streaming list; the watch then resumes from its end bookmark's version."""
        try:
            raw = self.api.open_watch(self.resource, "", timeout_s=self.watch_timeout_s, initial_events=True,
                                      read_timeout=STREAM_LIST_IDLE_S)
        except PermanentSourceError as e:
            if e.code in (400, 422):  # Invalid: no WatchList gate, or a server from before it
                raise WatchListUnsupported(f"watch {self.resource.name}: streaming list refused: {e}") from e
            raise
        end: list[str] = []
        self.sink.replace(self.resource, self._initial_events(raw, end))
        if not end:  # the sink stopped reading before the end: not a whole list
            raise SourceError(f"watch {self.resource.name}: streaming list not read to its end")
        self._listed(end[0], "stream")

    def _initial_events(self, raw: Any, end: list[str]) -> Iterator[JSON | PodObject]:
        """The objects of a streaming list, as they arrive; `end` gets the end bookmark's version."""
        decode, name = self.decoder.event, self.resource.name
        lines_of = iter(self.api.watch_lines(self.resource, raw))
        last = time.monotonic()
        try:
            for lines in lines_of:
                last = time.monotonic()
                if self._stop.is_set():
                    raise SourceError(f"watch {name}: stopped during a streaming list")
                for line in lines:
                    try:
                        event = decode(line)
                    except orjson.JSONDecodeError as e:
                        raise SourceError(f"watch {name}: undecodable event ({e})") from e
                    if type(event) is PodEvent:  # the pod decoder's typed path: ADDED or MODIFIED
                        obj = event.object
                        if event.type != "ADDED" or type(obj) is not PodObject:
                            raise WatchListUnsupported(f"watch {name}: {event.type} before the initial events ended")
                        if obj.kind is UNSET:
                            obj.kind = self.resource.kind
                        if obj.apiVersion is UNSET:
                            obj.apiVersion = self.resource.api_version
                        yield obj
                        continue
                    kind = event.get("type") if isinstance(event, dict) else None
                    if kind == "ADDED":
                        obj = event.get("object")
                        if not isinstance(obj, dict):
                            raise SourceError(f"watch {name}: ADDED event without object")
                        obj.setdefault("kind", self.resource.kind)
                        obj.setdefault("apiVersion", self.resource.api_version)
                        yield obj
                    elif kind == "BOOKMARK":
                        rv = _end_bookmark(line)  # decoded whole: a selective decoder drops annotations
                        if rv is None:
                            raise WatchListUnsupported(f"watch {name}: a bookmark before the initial-events-end one")
                        end.append(rv)
                        return
                    elif kind == "ERROR":
                        self._apply(event)  # raises: Expired (410, too large) or SourceError
                    else:
                        raise WatchListUnsupported(f"watch {name}: {kind} before the initial events ended")
        except RetryableSourceError as e:
            if time.monotonic() - last >= STREAM_LIST_IDLE_S * 0.9:
                raise WatchListUnsupported(f"watch {name}: no initial-events-end bookmark after "
                                           f"{STREAM_LIST_IDLE_S:.0f} s of silence") from e
            raise
        finally:
            close = getattr(lines_of, "close", None)
            if close is not None:
                close()  # a generator's: closes the connection: the watch resumes from the bookmark on a new one
        raise WatchListUnsupported(f"watch {name}: the stream ended without the initial-events-end bookmark")

    def _listed(self, resource_version: str, mode: str) -> None:
        self.resource_version = resource_version
        self.list_mode = mode
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


def _end_bookmark(line: bytes) -> str | None:
    """The resourceVersion of an initial-events-end bookmark; None for any other bookmark."""
    try:
        doc = orjson.loads(line)
        meta = doc["object"]["metadata"]
        if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
            return str(meta.get("resourceVersion") or "")
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
        pass
    return None


def _older(rv: str, than: str) -> bool:
    """resourceVersions are opaque, but every API server in use issues etcd revisions: integers."""
    return rv.isdigit() and than.isdigit() and int(rv) < int(than)


# Freshness needs "alive recently", not a mark per event: one a second at most (bookmarks always).
SYNC_MARK_INTERVAL_S = 1.0


def wait_synced(reflectors: list[Reflector], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    return all(r.synced_once.wait(max(0.0, deadline - time.monotonic())) for r in reflectors)
