"""A durable on-disk spool in front of ingestion: append-only segments, checksummed records.

Layout of a spool directory:

    ID                            this spool's identity (random, created once)
    <class>-<seq>.open            the segment being appended to (one per class)
    <class>-<seq>.seg             sealed: fsynced, then atomically renamed from .open
    <class>-<seq>.acks            tables of a sealed segment already accepted by the ingest client
    quarantine/                   segments that held corrupt records (kept for inspection)

A segment starts with MAGIC and a random nonce (its ingest-by tag: stable for replays, never
reused, since sequence numbers restart when a spool is emptied). A record is
`<u32 length><u32 crc32>` + one JSON object `{"t": table, "r": row}`. A row counts as
*acknowledged* once `seal()` has returned after it was appended (its segment is fsynced and renamed,
and the directory fsynced). A segment is deleted only after the ingest client accepted every table
in it; acceptance is noted per table in `.acks`, so a crash between two tables re-sends only what
was not accepted, under the same ingest-by tag.

Bounded and fair: appends that would take the spool past `max_bytes` first evict *bulk* rows
(snapshots, events, samples) of the namespace that holds the most of the spool, its oldest first
(a segment is rewritten without them); a namespace never loses rows to make room for one that holds
less than it does (that append is refused instead), so one tenant's flood while ADX is slow costs
its own rows, not everyone's. Claim transitions (class `critical`) are evicted only when no bulk
row is left, oldest first. Every row that does not make it is counted with its reason.

Damage stays local: a record whose length is broken is skipped up to the next header that frames
a record with a valid checksum; a row that cannot be serialized is refused alone. Files are 0600
and directories 0700 (rows hold tenants' names, reasons and messages).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import orjson

log = logging.getLogger("taugrid.adx")

MAGIC = b"TGS1"
NONCE = 16  # random bytes after MAGIC: the segment's identity in ingest-by tags, unique across restarts
HEADER = len(MAGIC) + NONCE
_HEAD = struct.Struct("<II")
CRITICAL = "critical"
BULK = "bulk"
CLASSES = (CRITICAL, BULK)
MAX_RECORD = 16 * 1024 * 1024  # a length past this is corruption, not a row
_START = b'{"t":"'  # every record's payload starts so: what a resync looks for
FILE_MODE = 0o600
DIR_MODE = 0o700


class SpoolEvents(Protocol):
    """What the spool reports (the exporter's metrics implement it)."""

    def spooled(self, table: str, n: int) -> None: ...
    def dropped(self, table: str, n: int, reason: str) -> None: ...
    def recovered(self, state: str, n: int) -> None: ...
    def size(self, total_bytes: int, segments: int) -> None: ...


class _NoEvents:
    def spooled(self, table: str, n: int) -> None:
        return

    def dropped(self, table: str, n: int, reason: str) -> None:
        return

    def recovered(self, state: str, n: int) -> None:
        return

    def size(self, total_bytes: int, segments: int) -> None:
        return


@dataclass(frozen=True, slots=True)
class SpoolSettings:
    max_bytes: int = 256 * 1024 * 1024  # the whole spool, open segments included
    segment_bytes: int = 4 * 1024 * 1024  # seal a segment once it is this big

    def check(self) -> None:
        if self.segment_bytes < 4096 or self.max_bytes < 4 * self.segment_bytes:
            raise ValueError(f"spool: max_bytes ({self.max_bytes}) must be at least 4 × segment_bytes "
                             f"({self.segment_bytes}), and segment_bytes at least 4096")


@dataclass(frozen=True, slots=True)
class Segment:
    cls: str
    seq: int
    path: Path
    size: int

    def tag(self, table: str) -> str:
        """The ingest-by tag of this segment's blob of `table`: the same on every replay, never
        reused (a random nonce from the segment's header, not its sequence number)."""
        with open(self.path, "rb") as f:
            head = f.read(HEADER)
        return f"{head[len(MAGIC):].hex()}-{table}"


@dataclass(slots=True)
class Contents:
    rows: dict[str, list[bytes]]  # table → row JSON, in append order
    corrupt: int  # records whose checksum or framing failed


def _open_append(path: Path) -> BinaryIO:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    return os.fdopen(fd, "ab", buffering=0)  # held open across appends


_R = b',"r":'


def frame(table: str, row: dict[str, Any] | bytes) -> bytes:
    """One record: table names are identifiers, so the payload can be split without parsing JSON."""
    raw = row if isinstance(row, bytes) else orjson.dumps(row)
    payload = b'{"t":"' + table.encode() + b'"' + _R + raw + b"}"
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def read_records(data: bytes) -> tuple[list[tuple[str, bytes]], int, int]:
    """(records, end of the last good record, corrupt stretches) from a segment's bytes.

    A broken length does not end the segment: reading resumes at the next header that frames a
    record whose checksum holds (only a torn tail, with no such header after it, ends it)."""
    out: list[tuple[str, bytes]] = []
    if len(data) < HEADER or not data.startswith(MAGIC):
        return [], 0, 1 if data else 0
    pos = HEADER
    good_end = pos
    corrupt = 0
    n = len(data)
    unpack = _HEAD.unpack_from
    crc32 = zlib.crc32
    while pos + _HEAD.size <= n:
        length, crc = unpack(data, pos)
        start = pos + _HEAD.size
        if length > MAX_RECORD or start + length > n or not data.startswith(_START, start):
            corrupt += 1  # a broken header: nothing can be framed from it
            pos = _resync(data, pos + 1)
            if pos < 0:
                return out, good_end, corrupt
            continue
        payload = data[start:start + length]
        split = payload.find(_R)
        if crc32(payload) != crc or split < 0 or payload[-1:] != b"}":
            corrupt += 1
            nxt = _resync(data, pos + 1)  # the length may be what broke: look for the next record
            if nxt < 0:
                return out, good_end, corrupt
            pos = nxt
            continue
        pos = start + length
        out.append((payload[6:split - 1].decode(), payload[split + len(_R):-1]))
        good_end = pos
    if pos < n:
        corrupt += 1  # a few stray bytes of a header
    return out, good_end, corrupt


def _resync(data: bytes, after: int) -> int:
    """The offset of the next record header at or after `after` whose record checks out, or -1.
    Candidates are the places a payload starts; each is checked by its checksum, so a scan costs
    about one pass over the rest of the segment."""
    n = len(data)
    at = data.find(_START, after + _HEAD.size)
    while at >= 0:
        pos = at - _HEAD.size
        length, crc = _HEAD.unpack_from(data, pos)
        if length <= MAX_RECORD and at + length <= n and zlib.crc32(data[at:at + length]) == crc:
            return pos
        at = data.find(_START, at + 1)
    return -1


def _record_size(table: str, row: bytes) -> int:
    return _HEAD.size + len(_START) + len(table) + 1 + len(_R) + len(row) + 1


def _namespace_of(row: dict[str, Any] | bytes) -> str:
    if isinstance(row, bytes):
        try:
            row = orjson.loads(row)
        except orjson.JSONDecodeError:
            return ""
    ns = row.get("Namespace") if isinstance(row, dict) else None
    return ns if isinstance(ns, str) else ""


class Spool:
    """Append rows, seal to acknowledge, hand sealed segments to a shipper, delete when accepted."""

    def __init__(self, directory: Path, settings: SpoolSettings | None = None, *,
                 events: SpoolEvents | None = None, critical_tables: Iterable[str] = (),
                 open_file: Callable[[Path], BinaryIO] = _open_append) -> None:
        self.dir = directory
        self.settings = settings or SpoolSettings()
        self.settings.check()
        self.events: SpoolEvents = events or _NoEvents()
        self.critical = frozenset(critical_tables)
        self._open_file = open_file
        self._lock = threading.RLock()
        self._sealed: dict[int, Segment] = {}
        self._active: dict[str, tuple[Segment, BinaryIO]] = {}
        self._seq = 0
        self._in_flight: int | None = None  # the segment the shipper is delivering: not evicted under it
        # Bytes of bulk rows per namespace: in each sealed bulk segment (None until read; segments
        # found at start are read only when room must be made) and in the open bulk segment.
        self._ns: dict[int, dict[str, int] | None] = {}
        self._active_ns: dict[str, int] = {}
        self._evict_logged: dict[str, float] = {}
        self.id = ""

    # --- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Create or reopen the directory; recover segments a crash left open (valid prefix kept)."""
        with self._lock:
            self.dir.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
            (self.dir / "quarantine").mkdir(exist_ok=True, mode=DIR_MODE)
            _private(self.dir)
            id_path = self.dir / "ID"
            if not id_path.exists():
                _atomic_write(id_path, uuid.uuid4().hex.encode())
            self.id = id_path.read_text().strip()
            for p in sorted(self.dir.glob("*.tmp")):
                p.unlink()  # half-written atomic files: never renamed, so never meant
            for p in sorted(self.dir.glob("*.open")):
                self._recover(p)
            for p in self.dir.glob("*.acks"):
                if not p.with_suffix(".seg").exists():
                    p.unlink()  # its segment was deleted: a new one with this name must not inherit it
            for p in self.dir.glob("*.seg"):
                seg = _parse(p)
                if seg is not None:
                    self._sealed[seg.seq] = seg
                    self._ns[seg.seq] = None
                    self._seq = max(self._seq, seg.seq)
            self._report()

    def _recover(self, path: Path) -> None:
        """An open segment from before a crash: keep its valid prefix, seal it."""
        data = path.read_bytes()
        records, good_end, corrupt = read_records(data)
        if corrupt or good_end < len(data):
            with open(path, "r+b") as f:
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())
            self.events.recovered("torn", 1)
        if not records:
            path.unlink()
            self.events.recovered("empty", 1)
            return
        sealed = path.with_suffix(".seg")
        os.replace(path, sealed)
        _fsync_dir(self.dir)
        self.events.recovered("reopened", 1)

    def close(self) -> None:
        with self._lock:
            try:
                self.seal()
            finally:
                for _, f in self._active.values():
                    f.close()
                self._active.clear()

    # --- writing ---------------------------------------------------------------------------------

    def class_of(self, table: str) -> str:
        return CRITICAL if table in self.critical else BULK

    def append(self, table: str, rows: list[dict[str, Any]]) -> int:
        """Append rows of one table; returns how many were taken (the rest are counted as dropped).

        Taken is not acknowledged: call `seal()` for that. A row that cannot be serialized (an
        integer past 64 bits) is refused alone; the others are taken.
        """
        if not rows:
            return 0
        if not table.isidentifier():
            raise ValueError(f"spool: table name {table!r} is not an identifier")
        cls = self.class_of(table)
        groups: dict[str, list[bytes]] = {}
        bad, problem = 0, ""
        for r in rows:
            try:
                data = frame(table, r)
            except TypeError as e:  # orjson.JSONEncodeError: what JSON cannot hold
                bad += 1
                problem = str(e)
                continue
            groups.setdefault(_namespace_of(r) if cls == BULK else "", []).append(data)
        if bad:
            self.events.dropped(table, bad, "unserializable")
            log.warning("rows not spooled", extra={"table": table, "rows": bad, "error": problem[:200]})
        taken = 0
        with self._lock:
            for ns, framed in groups.items():
                taken += self._append(table, cls, ns, b"".join(framed), len(framed))
            self._report()
        return taken

    def _append(self, table: str, cls: str, ns: str, data: bytes, count: int) -> int:
        if not self._make_room(len(data), cls, ns):
            self.events.dropped(table, count, "spool_full")
            return 0
        seg, f = self._active_segment(cls)
        try:
            f.write(data)
        except OSError as e:
            # Cut back to the last whole record so the segment stays readable, then make room
            # by evicting bulk segments and try once more; otherwise the rows are refused.
            self._truncate(seg, f)
            if e.errno != errno.ENOSPC or not self._evict_one(BULK) or not self._retry(seg, f, data):
                self.events.dropped(table, count, "disk_full" if e.errno == errno.ENOSPC else "io_error")
                return 0
        self._active[cls] = (Segment(cls, seg.seq, seg.path, seg.size + len(data)), f)
        if cls == BULK:
            self._active_ns[ns] = self._active_ns.get(ns, 0) + len(data)
        self.events.spooled(table, count)
        if seg.size + len(data) >= self.settings.segment_bytes:
            self._seal_class(cls)
        return count

    def _retry(self, seg: Segment, f: BinaryIO, data: bytes) -> bool:
        try:
            f.write(data)
            return True
        except OSError:
            self._truncate(seg, f)
            return False

    def _truncate(self, seg: Segment, f: BinaryIO) -> None:
        with contextlib.suppress(OSError):
            f.truncate(seg.size)

    def _active_segment(self, cls: str) -> tuple[Segment, BinaryIO]:
        if cls in self._active:
            return self._active[cls]
        self._seq += 1
        path = self.dir / f"{cls}-{self._seq:012d}.open"
        f = self._open_file(path)
        try:
            f.write(MAGIC + os.urandom(NONCE))
        except OSError:
            f.close()
            path.unlink(missing_ok=True)
            raise
        seg = Segment(cls, self._seq, path, HEADER)
        self._active[cls] = (seg, f)
        if cls == BULK:
            self._active_ns = {}
        return seg, f

    def seal(self) -> None:
        """fsync and rename every open segment: what was appended is now acknowledged."""
        with self._lock:
            for cls in list(self._active):
                self._seal_class(cls)
            self._report()

    def _seal_class(self, cls: str) -> None:
        seg, f = self._active[cls]
        f.flush()
        os.fsync(f.fileno())
        f.close()
        del self._active[cls]
        sealed = seg.path.with_suffix(".seg")
        os.replace(seg.path, sealed)
        _fsync_dir(self.dir)
        self._sealed[seg.seq] = Segment(cls, seg.seq, sealed, seg.size)
        if cls == BULK:
            self._ns[seg.seq], self._active_ns = self._active_ns, {}

    # --- the bound -------------------------------------------------------------------------------

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._sealed.values()) + sum(s.size for s, _ in self._active.values())

    def _make_room(self, need: int, cls: str, ns: str = "") -> bool:
        limit = self.settings.max_bytes
        while self.total_bytes + need + HEADER > limit:
            if self._evict_fair(need, ns if cls == BULK else None):
                continue
            if cls == CRITICAL and self._evict_one(CRITICAL):
                continue
            return False
        return True

    def _ns_of(self, seg: Segment) -> dict[str, int]:
        got = self._ns.get(seg.seq)
        if got is None:
            got = {}
            for table, row in read_records(seg.path.read_bytes())[0]:
                ns = _namespace_of(row)
                got[ns] = got.get(ns, 0) + _record_size(table, row)
            self._ns[seg.seq] = got
        return got

    def _evict_fair(self, need: int, appender: str | None) -> bool:
        """Make some room from bulk rows, fairly: the oldest rows of the namespace holding the most
        of the spool go first. A bulk append (`appender`, its `need` counted) never takes room from a
        namespace holding less than it would: False then, and the append is refused."""
        totals: dict[str, int] = dict(self._active_ns) if BULK in self._active else {}
        evictable: dict[str, list[Segment]] = {}
        for seq in sorted(self._sealed):
            seg = self._sealed[seq]
            if seg.cls != BULK:
                continue
            for ns, size in self._ns_of(seg).items():
                totals[ns] = totals.get(ns, 0) + size
                if seq != self._in_flight:
                    evictable.setdefault(ns, []).append(seg)
        floor = 0
        if appender is not None:
            totals[appender] = floor = totals.get(appender, 0) + need
        # Largest first; on a tie the appender's own rows go (a newcomer does not displace an equal).
        for ns in sorted(totals, key=lambda n: (-totals[n], n != appender)):
            if totals[ns] < floor:
                break
            if ns in evictable:
                return self._evict_from(ns, evictable[ns], totals)
        if BULK in self._active and any(totals[n] >= floor for n in self._active_ns):
            self._seal_class(BULK)  # the rows to evict are in the open segment: sealed, they can go
            return True
        return False

    def _evict_from(self, ns: str, segments: list[Segment], totals: dict[str, int]) -> bool:
        """Evict `ns`'s oldest rows: from the oldest segment where they are at least an eighth of it
        (a rewrite then frees at least an eighth of what it writes), else from the segment where
        they are most. When no namespace holds a quarter of the spool and `ns`'s rows are thin in
        every segment, the oldest whole segment goes instead: among near-equal producers that is as
        fair, and it does not rewrite a segment to free a few rows."""
        held = {g.seq: self._ns_of(g).get(ns, 0) for g in segments}
        best = next((g for g in segments if held[g.seq] * 8 >= g.size), None)
        if best is None:
            best = max(segments, key=lambda g: held[g.seq])
            if totals[ns] * 4 < sum(totals.values()) and self._evict_one(BULK):
                return True
        self._evict_rows_of(best, ns)
        return True

    def _evict_rows_of(self, seg: Segment, ns: str) -> None:
        """Rewrite `seg` without the rows of namespace `ns` (the same header: the same ingest tags)."""
        data = seg.path.read_bytes()
        records, _, corrupt = read_records(data)
        keep: list[bytes] = []
        dropped: dict[str, int] = {}
        for table, row in records:
            if _namespace_of(row) == ns:
                dropped[table] = dropped.get(table, 0) + 1
            else:
                keep.append(frame(table, row))
        for table, n in dropped.items():
            self.events.dropped(table, n, "evicted")
        if corrupt:
            self.events.dropped("?", corrupt, "corrupt")
        self._log_eviction(ns, sum(dropped.values()))
        if not keep:
            self._remove(seg)
            return
        body = data[:HEADER] + b"".join(keep)
        _atomic_write(seg.path, body)
        self._sealed[seg.seq] = Segment(seg.cls, seg.seq, seg.path, len(body))
        ns_map = dict(self._ns.get(seg.seq) or {})
        ns_map.pop(ns, None)
        self._ns[seg.seq] = ns_map

    def _log_eviction(self, ns: str, rows: int) -> None:
        now = time.monotonic()
        if now - self._evict_logged.get(ns, -60.0) >= 60:  # the counter has every row; the log one line a minute
            self._evict_logged[ns] = now
            if len(self._evict_logged) > 10_000:
                self._evict_logged.clear()
            log.warning("spool full: the oldest rows of the namespace holding most of it evicted",
                        extra={"namespace": ns, "rows": rows})

    def _evict_one(self, cls: str) -> bool:
        for seq in sorted(self._sealed):
            seg = self._sealed[seq]
            if seg.cls == cls and seq != self._in_flight:
                contents = self.read(seg)
                for table, rows in contents.rows.items():
                    self.events.dropped(table, len(rows), "evicted")
                self._remove(seg)
                return True
        return False

    # --- shipping --------------------------------------------------------------------------------

    def sealed(self) -> list[Segment]:
        """Sealed segments, oldest first (claim transitions first among equals)."""
        with self._lock:
            return [self._sealed[s] for s in sorted(self._sealed)]

    def begin(self, seg: Segment) -> bool:
        """The shipper takes `seg` (False: it is gone, evicted meanwhile)."""
        with self._lock:
            if seg.seq not in self._sealed:
                return False
            self._in_flight = seg.seq
            return True

    def end(self) -> None:
        with self._lock:
            self._in_flight = None

    def read(self, seg: Segment) -> Contents:
        data = seg.path.read_bytes()
        records, _, corrupt = read_records(data)
        rows: dict[str, list[bytes]] = {}
        for table, row in records:
            rows.setdefault(table, []).append(row)
        return Contents(rows, corrupt)

    def acked_tables(self, seg: Segment) -> set[str]:
        p = seg.path.with_suffix(".acks")
        try:
            return {line for line in p.read_text().splitlines() if line}
        except FileNotFoundError:
            return set()

    def ack(self, seg: Segment, table: str) -> None:
        """The ingest client accepted this table's rows of `seg`: never send them again."""
        p = seg.path.with_suffix(".acks")
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        with os.fdopen(fd, "a") as f:
            f.write(table + "\n")
            f.flush()
            os.fsync(f.fileno())

    def done(self, seg: Segment, *, quarantine: bool = False) -> None:
        """Every table of `seg` was accepted: delete it (or keep it in quarantine/ when it held
        corrupt records, for a human to look at)."""
        with self._lock:
            if seg.seq not in self._sealed:
                return
            if quarantine:
                self._sealed.pop(seg.seq, None)
                self._ns.pop(seg.seq, None)
                try:
                    os.replace(seg.path, self.dir / "quarantine" / seg.path.name)
                    seg.path.with_suffix(".acks").unlink(missing_ok=True)
                    _fsync_dir(self.dir)
                except OSError as e:  # forgotten by this process either way: it never blocks the rest
                    log.warning("segment not moved to quarantine", extra={"segment": seg.path.name, "error": str(e)})
            else:
                self._remove(seg)
            self._report()

    def _remove(self, seg: Segment) -> None:
        # Acks first: a crash in between leaves a segment sent again (same tags), never an ack
        # that a later segment of the same name would inherit.
        seg.path.with_suffix(".acks").unlink(missing_ok=True)
        seg.path.unlink(missing_ok=True)
        self._sealed.pop(seg.seq, None)
        self._ns.pop(seg.seq, None)
        _fsync_dir(self.dir)

    def _report(self) -> None:
        self.events.size(self.total_bytes, len(self._sealed) + len(self._active))

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.sealed())


def _parse(path: Path) -> Segment | None:
    cls, _, seq = path.stem.partition("-")
    if cls not in CLASSES or not seq.isdigit():
        return None
    return Segment(cls, int(seq), path, path.stat().st_size)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _private(d: Path) -> None:
    """Directories 0700 and files 0600, also for a spool an older version left readable."""
    for p in (d, d / "quarantine"):
        with contextlib.suppress(OSError):
            os.chmod(p, DIR_MODE)
    for p in d.iterdir():
        if p.is_file() and not p.is_symlink():
            with contextlib.suppress(OSError):
                os.chmod(p, FILE_MODE)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
