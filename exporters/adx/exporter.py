"""The ADX exporter: rows → spool (durable) → a shipper thread → ADX or the embedded DuckDB file.

The controller sees it through `EvidenceSink` (open / claims / event / signal / close); it never
waits on the network: rows land in the spool, and the shipper delivers sealed segments with
backoff while the target is unreachable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge

from collector.model import ObjectRecord, Ref, RunClaims
from collector.progress.model import LogScan
from exporters.adx.adxmon import scrape
from exporters.adx.rows import GpuSample, GpuXid, Row, RowBuilder
from exporters.adx.schema import ALL_TABLES, KUBE_EVENTS, RUN_CLAIMS, Table, row_problem
from exporters.adx.spool import Segment, Spool, SpoolSettings

log = logging.getLogger("taugrid.adx")


class EvidenceSink(Protocol):
    """What the controller hands an exporter of records (ADX, the embedded store, ...)."""

    def open(self) -> None: ...
    def claims(self, runs: Iterable[RunClaims]) -> None: ...
    # A standby's evaluations: followed, not written (led_until: another replica's live Lease's renewTime).
    def track(self, runs: Iterable[RunClaims], *, led_until: datetime | None = None) -> None: ...
    def event(self, rec: ObjectRecord, run: str) -> None: ...
    def signal(self, run: Ref, source: str, plane: str, durable: bool, scan: LogScan) -> None: ...
    # A pass of the node agents' GPU evidence (readings, newly seen XIDs).
    def gpu(self, samples: Iterable[GpuSample] = (), xids: Iterable[GpuXid] = ()) -> None: ...
    def close(self) -> None: ...


class PermanentIngestError(Exception):
    """The target will never take this blob as it is (a value its column cannot hold): sending it
    again cannot help. Anything else an IngestTarget raises is taken as the target being away."""


class IngestTarget(Protocol):
    """Where sealed segments go: one blob per table, tagged; True accepted, False a known replay.
    Raises PermanentIngestError for a blob it refuses for its content."""

    def open(self) -> None: ...
    def ingest(self, table: Table, blob: bytes, tag: str) -> bool: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ExportSettings:
    cluster: str = ""  # the name this Kubernetes cluster has in the fleet's tables
    spool_dir: Path = field(default_factory=lambda: Path("spool"))
    spool: SpoolSettings = field(default_factory=SpoolSettings)
    snapshot_interval: timedelta = timedelta(minutes=1)
    seal_interval: timedelta = timedelta(seconds=5)  # bulk rows are acknowledged at least this often
    retry_min: timedelta = timedelta(seconds=1)
    retry_max: timedelta = timedelta(minutes=5)
    # On taking over, a new leader writes again the claim transitions it saw as a standby this far back
    # (same RowIds): the old leader may have died before writing them. Longer than a lease's duration.
    resume_window: timedelta = timedelta(minutes=1)
    # Kubernetes Event rows each namespace may spool per minute (a token bucket of that size):
    # tenants can create Events at will, and a flood must not crowd out everyone's rows. 0: no budget.
    event_rows_per_namespace: int = 3000


class ExportMetrics:
    """The exporter's families on the collector's registry (docs/adx.md lists them)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry or CollectorRegistry()
        self._logged: dict[tuple[str, str], float] = {}
        self.rows_spooled = Counter("taugrid_adx_rows_spooled", "rows appended to the spool", ["table"], registry=r)
        self.rows_dropped = Counter("taugrid_adx_rows_dropped", "rows that will never be ingested, by reason",
                                    ["table", "reason"], registry=r)
        self.rows_delivered = Counter("taugrid_adx_rows_delivered", "rows the ingest client accepted",
                                      ["table"], registry=r)
        self.blobs = Counter("taugrid_adx_blobs", "blobs handed to the ingest client, by result", ["result"],
                             registry=r)
        self.segments_recovered = Counter("taugrid_adx_spool_segments_recovered",
                                          "segments found after a restart: reopened (sealed as found), torn "
                                          "(cut to the last good record first), empty (removed), corrupt "
                                          "(records failed their checksum when shipped)", ["state"], registry=r)
        self.spool_bytes = Gauge("taugrid_adx_spool_bytes", "bytes in the spool", registry=r)
        self.spool_segments = Gauge("taugrid_adx_spool_segments", "segments in the spool", registry=r)
        self.oldest = Gauge("taugrid_adx_spool_oldest_age_seconds", "age of the oldest undelivered segment",
                            registry=r)
        self.last_delivery = Gauge("taugrid_adx_last_delivery_timestamp_seconds",
                                   "when the ingest client last accepted a blob, unix seconds", registry=r)

    # SpoolEvents
    def spooled(self, table: str, n: int) -> None:
        self.rows_spooled.labels(table).inc(n)

    def dropped(self, table: str, n: int, reason: str) -> None:
        self.rows_dropped.labels(table, reason).inc(n)
        now = time.monotonic()
        if now - self._logged.get((table, reason), -60.0) >= 60:  # the counter has every drop; the log one a minute
            self._logged[(table, reason)] = now
            log.warning("rows dropped", extra={"table": table, "rows": n, "reason": reason})

    def recovered(self, state: str, n: int) -> None:
        self.segments_recovered.labels(state).inc(n)

    def refused(self, table: str, problem: str) -> None:
        """A row refused for what it holds (counted as dropped, reason "invalid"), the problem logged."""
        self.rows_dropped.labels(table, "invalid").inc()
        now = time.monotonic()
        if now - self._logged.get((table, "invalid"), -60.0) >= 60:
            self._logged[(table, "invalid")] = now
            log.warning("row refused", extra={"table": table, "problem": problem[:300]})

    def size(self, total_bytes: int, segments: int) -> None:
        self.spool_bytes.set(total_bytes)
        self.spool_segments.set(segments)


class Shipper:
    """Delivers sealed segments oldest first; a table's blob is acknowledged in the spool once the
    target accepted it, and the segment deleted once every table was."""

    def __init__(self, spool: Spool, target: IngestTarget, metrics: ExportMetrics) -> None:
        self.spool = spool
        self.target = target
        self.metrics = metrics

    def ship_one(self, seg: Segment) -> None:
        """Deliver one segment; raises whatever the target raised (the segment stays)."""
        if not self.spool.begin(seg):
            return  # evicted since it was listed
        try:
            self._ship(seg)
        finally:
            self.spool.end()

    def _ship(self, seg: Segment) -> None:
        try:
            contents = self.spool.read(seg)
        except FileNotFoundError:
            return  # gone meanwhile (evicted)
        except OSError as e:
            # An unreadable segment is set aside: it must not hold back every segment after it.
            log.warning("spool segment unreadable; quarantined", extra={"segment": seg.path.name, "error": str(e)})
            self.metrics.recovered("unreadable", 1)
            self.spool.done(seg, quarantine=True)
            return
        if contents.corrupt:
            self.metrics.recovered("corrupt", 1)
            self.metrics.dropped("?", contents.corrupt, "corrupt")
        acked = self.spool.acked_tables(seg)
        quarantine = contents.corrupt > 0
        for table, rows in sorted(contents.rows.items(), key=lambda kv: kv[0] != RUN_CLAIMS.name):
            if table in acked:
                continue
            t = ALL_TABLES.get(table)
            if t is None:
                self.metrics.dropped(table, len(rows), "unknown_table")
                continue
            tag = seg.tag(table)
            try:
                accepted = self._ingest(t, rows, tag)
            except PermanentIngestError as e:
                # Refused for its content even row by row: set aside, the rest of the spool goes on.
                log.warning("blob refused by the target; segment quarantined",
                            extra={"table": table, "segment": seg.path.name, "error": str(e)[:500]})
                self.metrics.dropped(table, len(rows), "rejected")
                quarantine = True
                self.spool.ack(seg, table)
                continue
            self.metrics.blobs.labels("accepted" if accepted else "duplicate").inc()
            if accepted:
                self.metrics.rows_delivered.labels(table).inc(len(rows))
            self.metrics.last_delivery.set(time.time())
            self.spool.ack(seg, table)
        self.spool.done(seg, quarantine=quarantine)

    def _ingest(self, t: Table, rows: list[bytes], tag: str) -> bool:
        """Send one table's rows; a blob the target refuses for its content is sent again without
        the rows that cannot be stored (spooled by an older version, or by a bug), those counted."""
        try:
            return self.target.ingest(t, b"\n".join(rows) + b"\n", tag)
        except PermanentIngestError:
            good = []
            for raw in rows:
                try:
                    problem = row_problem(t.name, orjson.loads(raw))
                except orjson.JSONDecodeError as e:
                    problem = f"not JSON: {e}"
                if problem is None:
                    good.append(raw)
                else:
                    self.metrics.refused(t.name, problem)
            if len(good) == len(rows):
                raise
            rows[:] = good
            return self.target.ingest(t, b"\n".join(good) + b"\n", tag) if good else True

    def drain(self) -> int:
        """Ship every sealed segment now; returns how many were delivered (stops at the first error)."""
        n = 0
        for seg in self.spool.sealed():
            self.ship_one(seg)
            n += 1
        return n


class AdxExporter:
    """EvidenceSink writing the ADX tables through a durable spool."""

    def __init__(self, settings: ExportSettings, target: IngestTarget, *,
                 registry: CollectorRegistry | None = None, mirror: CollectorRegistry | None = None) -> None:
        """`registry` gets the exporter's own metrics; `mirror` (embedded mode) is scraped into
        adx-mon's tables every snapshot interval, standing in for adx-mon."""
        self.settings = settings
        self.metrics = ExportMetrics(registry)
        self.spool = Spool(settings.spool_dir, settings.spool, events=self.metrics,
                           critical_tables=(RUN_CLAIMS.name,))
        self.target = target
        self.shipper = Shipper(self.spool, target, self.metrics)
        self.rows = RowBuilder(settings.cluster, settings.snapshot_interval, resume_window=settings.resume_window)
        self._event_budget = _Budget(settings.event_rows_per_namespace, 60.0)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_seal = time.monotonic()
        self.mirror = mirror
        self.metrics.oldest.set_function(self._oldest_age)
        self._last_scrape: datetime | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        self.spool.open()
        self.target.open()
        latest = getattr(self.target, "latest_claims", None)
        if latest is not None:  # the embedded store: carry on from what the last process exported
            try:
                self.shipper.drain()  # what it left in the spool first
            except Exception as e:  # the shipper thread retries; resume from what the store has
                log.warning("delivery at start failed", extra={"error": str(e)[:500]})
            self.rows.resume(latest(self.settings.cluster))
        self._thread = threading.Thread(target=self._run, name="adx-shipper", daemon=True)
        self._thread.start()

    def close(self, drain_timeout: float = 10.0) -> None:
        """Seal what is spooled and try to deliver it for up to `drain_timeout` seconds; what is
        not delivered stays in the spool for the next start."""
        deadline = time.monotonic() + drain_timeout
        with self._lock:
            self.spool.seal()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(drain_timeout)
        # A shipper still inside the ingest client (an unreachable endpoint) is left to the daemon
        # thread's fate: its segment stays in the spool, and the next start sends it again.
        if self._thread is None or not self._thread.is_alive():
            for seg in self.spool.sealed():
                if time.monotonic() > deadline:
                    break
                try:
                    self.shipper.ship_one(seg)
                except Exception as e:  # the next start delivers it
                    log.warning("delivery at shutdown failed", extra={"error": str(e)[:500]})
                    break
        self.spool.close()
        self.target.close()

    def _oldest_age(self) -> float:
        """Age of the oldest undelivered segment (by its file time), computed at scrape time."""
        times = []
        for seg in self.spool.sealed():
            try:
                times.append(seg.path.stat().st_mtime)
            except FileNotFoundError:
                continue
        return max(0.0, time.time() - min(times)) if times else 0.0

    # --- EvidenceSink ----------------------------------------------------------------------------

    def claims(self, runs: Iterable[RunClaims]) -> None:
        runs = list(runs)
        self._write(self.rows.claims(runs))
        at = max((rc.evaluated_at for rc in runs), default=None)
        if self.mirror is not None and at is not None and (
                self._last_scrape is None or at - self._last_scrape >= self.settings.snapshot_interval):
            self._last_scrape = at
            self._write(scrape(self.mirror, at))

    def track(self, runs: Iterable[RunClaims], *, led_until: datetime | None = None) -> None:
        self.rows.track(runs, led_until=led_until)

    def event(self, rec: ObjectRecord, run: str) -> None:
        tables = self.rows.event(rec, run)
        if tables and not self._event_budget.take(rec.ref.namespace):
            self.metrics.dropped(KUBE_EVENTS.name, 1, "namespace_budget")
            return
        self._write(tables)

    def signal(self, run: Ref, source: str, plane: str, durable: bool, scan: LogScan) -> None:
        self._write(self.rows.signal(run, source, plane, durable, scan))

    def gpu(self, samples: Iterable[GpuSample] = (), xids: Iterable[GpuXid] = ()) -> None:
        """Node agents' records (GPU samples and XIDs)."""
        self._write(self.rows.gpu(samples, xids))

    def _write(self, tables: dict[str, list[Row]]) -> None:
        if not any(tables.values()):
            return
        with self._lock:
            critical = False
            for table, rows in tables.items():
                # A row its table cannot hold (an integer past a long) is refused alone: in a blob
                # it would fail the whole blob's ingestion, everyone's rows with it.
                ok = []
                for r in rows:
                    problem = row_problem(table, r)
                    if problem is None:
                        ok.append(r)
                    else:
                        self.metrics.refused(table, problem)
                if ok:
                    self.spool.append(table, ok)
                    critical = critical or table == RUN_CLAIMS.name
            # Claim transitions are acknowledged at once; bulk rows by the shipper thread, at least
            # every seal_interval (so the caller's thread pays no fsync for them).
            if critical:
                self.flush()

    def flush(self) -> None:
        """Seal now: everything written so far is acknowledged (durable), and shipping starts."""
        with self._lock:
            self.spool.seal()
            self._last_seal = time.monotonic()
        self._wake.set()

    # --- the shipper thread ----------------------------------------------------------------------

    def _run(self) -> None:
        delay = self.settings.retry_min.total_seconds()
        while not self._stop.is_set():
            self._wake.wait(self.settings.seal_interval.total_seconds())
            self._wake.clear()
            if self._stop.is_set():
                return
            if time.monotonic() - self._last_seal >= self.settings.seal_interval.total_seconds():
                self.flush()
                self._wake.clear()
            try:
                for seg in self.spool.sealed():
                    if self._stop.is_set():
                        return
                    self.shipper.ship_one(seg)
                delay = self.settings.retry_min.total_seconds()
            except Exception as e:  # unreachable target: keep everything, back off, say so
                self.metrics.blobs.labels("failed").inc()
                log.warning("delivery failed; retrying", extra={"error": str(e)[:500], "retry_s": delay})
                self._stop.wait(delay)
                delay = min(delay * 2, self.settings.retry_max.total_seconds())


class _Budget:
    """A token bucket per key (a namespace): `rate` takes per `per` seconds, as a burst too. Bounded:
    keys past 10,000 restart full (the bucket is a budget against floods, not an account)."""

    def __init__(self, rate: int, per: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.per, self.clock = rate, per, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key → (tokens, when)

    def take(self, key: str) -> bool:
        if self.rate <= 0:
            return True
        now = self.clock()
        tokens, when = self._buckets.get(key, (float(self.rate), now))
        tokens = min(float(self.rate), tokens + (now - when) * self.rate / self.per)
        if len(self._buckets) > 10_000:
            self._buckets.clear()
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True
