"""Leader election through a coordination.k8s.io/v1 Lease: the collector's only write.

Every replica watches (a warm standby); only the lease holder exports claims, so Prometheus
never sees the same run from two replicas. Conflicts (409) mean someone else won the update.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from collector.kube import parse_time
from collector.settings import ControllerSettings
from collector.sources.kube_api import JSON, KubeApi, PermanentSourceError, SourceError

log = logging.getLogger("taugrid.lease")

# A replica that does not lead says why at once, then at most this often while the reason stays the
# same kind (a standby beside a live leader logs once per period, not once per renewal).
NOT_LEADING_LOG_S = 300.0


def _micro(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(self, api: KubeApi, cfg: ControllerSettings, now: Callable[[], datetime], *,
                 identity: str = "", monotonic: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.monotonic = monotonic
        self.cfg = cfg
        self.now = now
        self.identity = identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self.namespace = cfg.lease_namespace or "default"
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        self._leader = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The latest time another replica is known to have led: its live Lease's renewTime, or when
        # it released the Lease (a new leader leaves what was seen before then to its rows).
        self.led_until: datetime | None = None
        # The holder's record as last read, and when (on our own monotonic clock) it last changed: as
        # client-go does, a Lease expires leaseDurationSeconds after we saw it change, never by comparing
        # its renewTime with a clock, which another replica's skew (or a sped-up server) would move.
        self._observed: tuple[object, ...] | None = None
        self._observed_at = 0.0
        # Since when (API clock, and our monotonic clock) reading or writing the Lease has failed, and
        # the last error; None while the API server answers. The controller keeps exporting its runs as
        # unknown through such an outage instead of withdrawing them (docs/security.md).
        self.failing_since: datetime | None = None
        self.failing_since_m = 0.0
        self.failure = ""
        # Why this replica did not lead after its last round ("" while it leads), its kind (held,
        # conflict, failing), and when (monotonic) that was last logged.
        self.not_leading = ""
        self._not_leading_kind = ""
        self._not_leading_logged = float("-inf")
        # stop() gave up waiting for a request in flight: the thread releases the Lease on its way out.
        self._release_on_exit = False
        self._logged_kind = ""

    @property
    def is_leader(self) -> bool:
        return self._leader.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop renewing; a leader releases its Lease so that a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        was_leader = self._leader.is_set()
        self._leader.clear()
        if self._thread is not None and self._thread.is_alive():
            # A request still in flight could renew (or take) the Lease after a release made here: the
            # thread, which never sets leadership once stopped, releases it after that request instead.
            self._release_on_exit = True
            return
        if was_leader:
            self._release_quietly()

    def _release_quietly(self) -> None:
        try:
            self.release()
        except SourceError as e:  # the standby waits out leaseDurationSeconds instead
            log.warning("lease not released", extra={"error": str(e)})

    def release(self) -> bool:
        """Clear the holder (as client-go's ReleaseOnCancel does) if we still hold the Lease."""
        path = f"{self.path}/{self.cfg.lease_name}"
        lease = self.api.get_json(path)
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return False
        now = _micro(self.now())
        lease["spec"] = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": now, "acquireTime": now}
        released = self._write("PUT", path, lease)
        if released:
            log.info("lease released", extra={"identity": self.identity})
        return released

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                held = self.try_acquire_or_renew()
                self.failing_since = None
            except SourceError as e:
                log.warning("lease update failed", extra={"error": str(e)})
                held = False
                self.failure = str(e)[:300]
                self._why_not("failing", f"the Lease could not be read or written: {self.failure}")
                if self.failing_since is None:
                    self.failing_since_m = self.monotonic()
                    self.failing_since = self.now()
            if self._stop.is_set():
                break  # stopped during the request: never lead after stop()
            if held != self._leader.is_set():
                log.info("leadership changed", extra={"leader": held, "identity": self.identity})
            (self._leader.set if held else self._leader.clear)()
            self._log_not_leading(held)
            self._stop.wait(self.cfg.lease_renew.total_seconds())
        if self._release_on_exit:
            self._release_quietly()

    def _why_not(self, kind: str, reason: str) -> None:
        self._not_leading_kind, self.not_leading = kind, reason

    def _log_not_leading(self, held: bool) -> None:
        """Say why this replica does not lead: at once, then every NOT_LEADING_LOG_S while the kind of
        reason stays the same (a change of kind is logged at once)."""
        if held:
            self.not_leading, self._not_leading_kind, self._not_leading_logged = "", "", float("-inf")
            return
        now_m = self.monotonic()
        kind = self._not_leading_kind
        if kind == self._logged_kind and now_m - self._not_leading_logged < NOT_LEADING_LOG_S:
            return
        self._logged_kind, self._not_leading_logged = kind, now_m
        (log.warning if kind != "held" else log.info)(
            "not leading", extra={"identity": self.identity, "reason": self.not_leading})

    def try_acquire_or_renew(self) -> bool:
        now = self.now()
        name = self.cfg.lease_name
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.cfg.lease_duration.total_seconds()),
                "renewTime": _micro(now)}
        try:
            lease = self.api.get_json(f"{self.path}/{name}")
        except PermanentSourceError as e:
            if "404" not in str(e):
                raise
            body: JSON = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                          "metadata": {"name": name, "namespace": self.namespace},
                          "spec": {**spec, "acquireTime": _micro(now), "leaseTransitions": 0}}
            return self._write("POST", self.path, body)
        cur = lease.get("spec") or {}
        holder = cur.get("holderIdentity")
        renewed = parse_time(cur.get("renewTime")) if cur.get("renewTime") else None
        duration = timedelta(seconds=int(cur.get("leaseDurationSeconds") or 15))
        record = (holder, cur.get("renewTime"), cur.get("leaseDurationSeconds"), cur.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.monotonic()
        unexpired = self.monotonic() - self._observed_at < duration.total_seconds()
        live = bool(holder and holder != self.identity and unexpired)
        # Until when another replica led (and wrote): its last renewal, or the time it released the Lease.
        if renewed is not None and (live or not holder) and (self.led_until is None or renewed > self.led_until):
            self.led_until = renewed
        if live:  # someone else holds a live lease
            unchanged = self.monotonic() - self._observed_at
            left = max(0.0, duration.total_seconds() - unchanged)
            who = f"the Lease is held by {str(holder)[:253]} (renewed {cur.get('renewTime')})"
            if unchanged > 2 * self.cfg.lease_renew.total_seconds():  # a holder gone without releasing it?
                self._why_not("stale", f"{who}, not renewed for {unchanged:.0f} s: taken over in {left:.0f} s")
            else:
                self._why_not("held", f"{who}; taken over if not renewed within {left:.0f} s")
            return False
        new_spec = {**cur, **spec}
        if holder != self.identity:
            new_spec["acquireTime"] = _micro(now)
            new_spec["leaseTransitions"] = int(cur.get("leaseTransitions") or 0) + 1
        lease["spec"] = new_spec
        return self._write("PUT", f"{self.path}/{name}", lease)

    def _write(self, method: str, path: str, body: JSON) -> bool:
        try:
            self.api.write_json(method, path, body)
        except PermanentSourceError as e:
            if "409" in str(e):  # lost the race; read again next round
                self._why_not("conflict", f"another replica wrote the Lease first ({method} answered 409 Conflict)")
                return False
            raise
        return True
