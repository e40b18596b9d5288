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

Bounded: appends that would take the spool past `max_bytes` first evict the oldest sealed *bulk*
segment (snapshots, events, samples); claim transitions (class `critical`) are evicted only when
no bulk segment is left, oldest first, and a bulk row that does not fit is refused. Every row
that does not make it is counted with its reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import orjson

MAGIC = b"TGS1"
NONCE = 16  # random bytes after MAGIC: the segment's identity in ingest-by tags, unique across restarts
HEADER = len(MAGIC) + NONCE
_HEAD = struct.Struct("<II")
CRITICAL = "critical"
BULK = "bulk"
CLASSES = (CRITICAL, BULK)
MAX_RECORD = 16 * 1024 * 1024  # a length past this is corruption, not a row


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
    return open(path, "ab", buffering=0)  # noqa: SIM115 — held open across appends


_R = b',"r":'


def frame(table: str, row: dict[str, Any] | bytes) -> bytes:
    """One record: table names are identifiers, so the payload can be split without parsing JSON."""
    raw = row if isinstance(row, bytes) else orjson.dumps(row)
    payload = b'{"t":"' + table.encode() + b'"' + _R + raw + b"}"
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def read_records(data: bytes) -> tuple[list[tuple[str, bytes]], int, int]:
    """(records, end of the last good record, corrupt records) from a segment's bytes."""
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
        if length > MAX_RECORD or start + length > n:
            corrupt += 1  # torn tail or a broken length: nothing after it can be framed
            break
        payload = data[start:start + length]
        pos = start + length
        split = payload.find(_R)
        if crc32(payload) != crc or not payload.startswith(b'{"t":"') or split < 0 or payload[-1:] != b"}":
            corrupt += 1
            continue
        out.append((payload[6:split - 1].decode(), payload[split + len(_R):-1]))
        good_end = pos
    if pos < n and pos + _HEAD.size > n:
        corrupt += 1  # a few stray bytes of a header
    return out, good_end, corrupt


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
        self.id = ""

    # --- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Create or reopen the directory; recover segments a crash left open (valid prefix kept)."""
        with self._lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "quarantine").mkdir(exist_ok=True)
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

        Taken is not acknowledged: call `seal()` for that.
        """
        if not rows:
            return 0
        if not table.isidentifier():
            raise ValueError(f"spool: table name {table!r} is not an identifier")
        cls = self.class_of(table)
        data = b"".join(frame(table, r) for r in rows)
        with self._lock:
            if not self._make_room(len(data), cls):
                self.events.dropped(table, len(rows), "spool_full")
                return 0
            seg, f = self._active_segment(cls)
            try:
                f.write(data)
            except OSError as e:
                # Cut back to the last whole record so the segment stays readable, then make room
                # by evicting bulk segments and try once more; otherwise the rows are refused.
                self._truncate(seg, f)
                if e.errno != errno.ENOSPC or not self._evict_one(BULK) or not self._retry(seg, f, data):
                    self.events.dropped(table, len(rows), "disk_full" if e.errno == errno.ENOSPC else "io_error")
                    return 0
            self._active[cls] = (Segment(cls, seg.seq, seg.path, seg.size + len(data)), f)
            self.events.spooled(table, len(rows))
            if seg.size + len(data) >= self.settings.segment_bytes:
                self._seal_class(cls)
            self._report()
            return len(rows)

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

    # --- the bound -------------------------------------------------------------------------------

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._sealed.values()) + sum(s.size for s, _ in self._active.values())

    def _make_room(self, need: int, cls: str) -> bool:
        limit = self.settings.max_bytes
        while self.total_bytes + need + HEADER > limit:
            if self._evict_one(BULK):
                continue
            if cls == CRITICAL and self._evict_one(CRITICAL):
                continue
            return False
        return True

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
        with open(p, "a") as f:
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
                os.replace(seg.path, self.dir / "quarantine" / seg.path.name)
                self._sealed.pop(seg.seq, None)
                seg.path.with_suffix(".acks").unlink(missing_ok=True)
                _fsync_dir(self.dir)
            else:
                self._remove(seg)
            self._report()

    def _remove(self, seg: Segment) -> None:
        # Acks first: a crash in between leaves a segment sent again (same tags), never an ack
        # that a later segment of the same name would inherit.
        seg.path.with_suffix(".acks").unlink(missing_ok=True)
        seg.path.unlink(missing_ok=True)
        self._sealed.pop(seg.seq, None)
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
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
