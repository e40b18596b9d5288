"""The Kubernetes objects: one reflector (list, then watch) per watched resource the API server
serves (collector/sources/watch.py), each on its own thread, feeding the controller's loop.

Normalizing here, in the reflector's thread, keeps raw JSON out of the loop's queue: it holds small
records, and a backlog no longer feeds the cycle collector big dicts. Watch events are buffered per
resource (one reflector thread each) and queued once per read: one queue operation per network read
instead of one per event. The source also keeps each resource's health: listed once yet, failing
since when (an outage, named in claim reasons and /readyz), stale past the evidence bound.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime

from collector.kube import MalformedObject, NodeLease, node_lease, normalize
from collector.kube_pod import PodObject, normalize_pod, pod_record
from collector.model import ObjectRecord, Ref
from collector.planes.base import Change, SourceContext, SourceHealth, SourceState
from collector.sources.decode import decoder_for
from collector.sources.kube_api import JSON, Backoff, PermanentSourceError, Resource, SourceError
from collector.sources.watch import Reflector
from exporters.prometheus_health import ErrorClass

__all__ = ["STARTUP_GRACE_S", "KubeWatch"]

log = logging.getLogger("taugrid.controller")

# How long after start the controller exports claims even if a watched resource never listed.
STARTUP_GRACE_S = 60.0
UNLISTED_LOG_S = 10.0
PASSING_BATCH = 500  # Events the index does not keep, handed on in batches this size during a list


class KubeWatch:
    """The watched resources (a `WatchSink` for their reflectors). Its failures are counted under
    each resource's name, discovery's under `discovery`."""

    name = "kube"

    def __init__(self, ctx: SourceContext, wanted: tuple[Resource, ...]) -> None:
        self.ctx = ctx
        self.wanted = wanted
        self.resources: list[Resource] = []
        self.reflectors: list[Reflector] = []
        self.state = SourceState(self.name, ctx.health)
        self.listed: set[str] = set()  # resources whose first listing the loop has applied (its "synced")
        self.opened_at = time.monotonic()
        # Resources whose API server does not answer: since when, and the error (for claim reasons).
        self.outage: dict[str, tuple[datetime, str]] = {}
        # ... and, on the monotonic clock, when each first failed and last failed (see `failing`).
        self._failed_m: dict[str, tuple[float, float]] = {}
        self._pending: dict[str, list[Change]] = {}  # per resource, filled by its reflector thread
        self._unlisted_logged = float("-inf")

    # --- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Discover which of the wanted APIs are served (retrying until the API server answers or the
        controller stops), then start a reflector for each."""
        ctx = self.ctx
        self.opened_at = time.monotonic()
        backoff = Backoff()
        notes: list[str] = []
        while not ctx.stop.is_set():
            try:
                self.resources, notes = ctx.api.discover(self.wanted)
                break
            except SourceError as e:
                self.state.error(ErrorClass.RETRYABLE if e.retryable else ErrorClass.PERMANENT, str(e),
                                 source="discovery")
                log.warning("discovery failed", extra={"error": str(e)})
                if isinstance(e, PermanentSourceError):
                    raise
                ctx.stop.wait(backoff.next())
        if ctx.stop.is_set():
            return  # asked to stop before the API server ever answered
        for note in notes:
            log.info("optional API absent", extra={"note": note})
        for r in self.resources:
            # Evidence capture keeps whole objects; otherwise only the fields the records read are decoded.
            decoder = decoder_for(r.api_version, r.kind, full=ctx.capture is not None)
            refl = Reflector(ctx.api, r, self, ctx.now, watch_timeout_s=ctx.settings.controller.watch_timeout_s,
                             decoder=decoder, stream_lists=ctx.settings.controller.stream_lists)
            self.reflectors.append(refl)
            refl.start()

    def close(self) -> None:
        for r in self.reflectors:
            r.stop()

    def health(self) -> SourceHealth:
        return self.state.health()

    # --- what the loop applies and asks ----------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Every resource's first listing applied to the index by the loop. Not the reflectors' own
        flags: a reflector queues its listing and then says it synced, so the loop could see a
        resource synced while its listing still waits in the queue (a RayJob then evaluated as a
        root before its TauRun arrives, and exported)."""
        return all(r.resource.name in self.listed for r in self.reflectors)

    @property
    def view_complete(self) -> bool:
        """Every watched resource listed once, or the startup grace past. Nothing is exported before:
        a partial view shows runs under the wrong root (a RayJob before its TauRun), and those rows
        would stay in the exported streams; but a resource that never lists (forbidden) must not
        silence the others."""
        return self.synced or time.monotonic() - self.opened_at > STARTUP_GRACE_S

    def applied_listing(self, name: str) -> None:
        """The loop applied `name`'s listing: listed, and no longer failing."""
        self.listed.add(name)
        self.outage.pop(name, None)
        self._failed_m.pop(name, None)

    def applied_error(self, name: str, err: SourceError, received: float) -> None:
        """The loop applied a failure of `name` queued at `received`: a retryable one is an outage
        until the resource syncs again."""
        self.state.error(ErrorClass.RETRYABLE if err.retryable else ErrorClass.PERMANENT, str(err), source=name)
        if err.retryable:
            self.outage.setdefault(name, (self.ctx.now(), str(err)))
            first, _ = self._failed_m.get(name, (received, 0.0))
            self._failed_m[name] = (first, received)

    def stale(self) -> list[str]:
        """Watched resources with nothing intact from the API server for longer than the evidence
        bound (`claims.evidence_max_age`): past it their claims are unknown, so not ready."""
        bound = self.ctx.settings.claims.evidence_max_age.total_seconds()
        now_m = time.monotonic()
        return [r.resource.name for r in self.reflectors if r.synced_once.is_set() and now_m - r.last_ok > bound]

    def failing(self, grace_s: float) -> list[tuple[str, datetime, str]]:
        """Each watched resource whose last attempt failed with no intact answer since, for longer than
        `grace_s`: (name, since on the API server's clock, the error). Read from the HTTP thread:
        copies, never iteration."""
        now_m = time.monotonic()
        failed, outage = dict(self._failed_m), dict(self.outage)
        out = []
        for r in list(self.reflectors):
            name = r.resource.name
            if name in failed and name in outage:
                first, last = failed[name]
                if r.last_ok < last and now_m - first >= grace_s:
                    out.append((name, *outage[name]))
        return out

    def log_unlisted(self) -> None:
        """Holding the Lease (or leading alone) but exporting nothing yet: say which watched resources
        have not been listed, every UNLISTED_LOG_S at most, until they are or the start-up grace ends."""
        now_m = time.monotonic()
        if now_m - self._unlisted_logged < UNLISTED_LOG_S:
            return
        self._unlisted_logged = now_m
        pending = sorted(r.resource.name for r in self.reflectors if not r.synced_once.is_set())
        log.warning("leading, not exporting yet: watched resources not listed", extra={
            "pending": ", ".join(pending[:20]), "exports_in_s": round(STARTUP_GRACE_S - (now_m - self.opened_at))})

    # --- WatchSink (called from reflector threads) -----------------------------------------------

    def upsert(self, resource: Resource, obj: JSON | PodObject) -> None:
        if resource.kind == "Lease":
            lease = self._node_lease(resource, obj)
            if lease is not None:  # how far ahead its renewal is, measured as it arrives
                change = Change("lease", resource, (lease, lease.renewed - self.ctx.now()))
                self._pending.setdefault(resource.name, []).append(change)
            return
        capture = self.ctx.capture
        rec = pod_record(obj, self.ctx.settings.taugrid) if type(obj) is PodObject else None
        if rec is None:
            rec = self._normalize(resource, obj)
        if rec is not None:
            if capture is not None and isinstance(obj, dict):  # capturing decodes in full: dicts
                capture.observe(rec.ref, obj)
            self._pending.setdefault(resource.name, []).append(Change("upsert", resource, rec))

    def delete(self, resource: Resource, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        if resource.kind == "Lease":
            self._pending.setdefault(resource.name, []).append(Change("lease-gone", resource, str(meta.get("name"))))
            return
        kind = self.ctx.settings.taugrid.role_of(resource.kind, resource.api_version) or resource.kind
        ref = Ref(kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if self.ctx.capture is not None:
            self.ctx.capture.observe_deleted(ref, obj)
        self._pending.setdefault(resource.name, []).append(Change("delete", resource, ref))

    def flush(self, resource: Resource) -> None:
        changes = self._pending.pop(resource.name, None)
        if changes:
            self.ctx.loop.put(Change("batch", resource, changes))

    def replace(self, resource: Resource, objs: Iterable[JSON | PodObject]) -> None:
        loop = self.ctx.loop
        if resource.kind == "Lease":
            leases = [(lease, lease.renewed - self.ctx.now()) for obj in objs
                      if (lease := self._node_lease(resource, obj)) is not None]
            loop.put(Change("leases", resource, leases))
            return
        # Normalized as the pages arrive: only records are kept, never a whole list of raw objects.
        recs: list[ObjectRecord] = []
        # Without an exporter, Events no claim reads (most of a fleet's) are not held until the list
        # ends: the index lets them go anyway. (An exporter gets them at the list's end, as before,
        # when the objects they regard are more likely indexed, so their rows name their run.)
        passing: list[ObjectRecord] = []
        pass_through = not self.ctx.exporting
        for obj in objs:
            rec = self._normalize(resource, obj)
            if rec is not None:
                if self.ctx.capture is not None:
                    self.ctx.capture.observe(rec.ref, obj)
                if not pass_through or loop.keeps(rec):
                    recs.append(rec)
                    continue
                passing.append(rec)
                if len(passing) >= PASSING_BATCH:
                    loop.put(Change("listed", resource, passing))
                    passing = []
        if passing:
            loop.put(Change("listed", resource, passing))
        loop.put(Change("replace", resource, recs))

    def mark_synced(self, resource: Resource, at: datetime) -> None:
        self.ctx.loop.put(Change("synced", resource, at))

    def source_error(self, resource: Resource, error: SourceError) -> None:
        self.ctx.loop.put(Change("error", resource, error))

    def watch_restarted(self, resource: Resource, relist: bool) -> None:
        self.ctx.loop.put(Change("restart", resource, relist))

    def _node_lease(self, resource: Resource, obj: JSON | PodObject) -> NodeLease | None:
        try:
            return node_lease(obj)
        except MalformedObject as e:
            self._malformed(resource, e)
            return None

    def _normalize(self, r: Resource, obj: JSON | PodObject) -> ObjectRecord | None:
        taugrid = self.ctx.settings.taugrid
        try:
            if type(obj) is PodObject:  # `where` is built only for a warning
                n = normalize_pod(obj, taugrid)
            else:
                n = normalize(obj, taugrid, where=f"{r.kind} {_name_of(obj)}")
        except MalformedObject as e:
            self._malformed(r, e)
            return None
        for p in n.problems:
            log.debug("odd field", extra={"problem": p})
        return n.record

    def _malformed(self, r: Resource, e: MalformedObject) -> None:
        self.ctx.loop.skip(str(e))
        self.state.error(ErrorClass.PERMANENT, str(e), source=r.name)


def _name_of(obj: JSON | PodObject) -> str:
    if type(obj) is PodObject:
        return obj.name_of()
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        return f"{meta.get('namespace') or ''}/{meta.get('name') or '?'}".lstrip("/")
    return "?"
