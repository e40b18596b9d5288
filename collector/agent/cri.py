"""Follow the CRI log files of one container: `<container>/<restart>.log`, as the kubelet writes them.

Each line is `TIMESTAMP STREAM TAG CONTENT` (`2024-05-01T10:00:00.123456789Z stdout F text`); tag
`P` marks a partial line that continues in the next record of the same stream, `F` a full one.
The kubelet rotates `0.log` by renaming it `0.log.<timestamp>` (later compressed) and starting a
new `0.log`; a file can also be truncated or deleted under us. Offsets are kept per file with its
inode and persisted, so a restarted agent resumes where it stopped, neither re-reading nor losing
lines. The persisted offset never passes the start of a partial line still being assembled.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_STREAMS = (b"stdout", b"stderr")
_HEADS = (b" stdout F ", b" stderr F ")  # after the timestamp of a full record


@dataclass(frozen=True, slots=True)
class CriLine:
    time: bytes
    stream: bytes
    partial: bool
    content: bytes


def parse_cri(raw: bytes) -> CriLine | None:
    """One CRI record without its newline; None when it is not one."""
    parts = raw.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in _STREAMS or len(parts[0]) < 20:
        return None
    tag = parts[2].split(b":", 1)[0]
    if tag not in (b"F", b"P"):
        return None
    return CriLine(parts[0], parts[1], tag == b"P", parts[3] if len(parts) == 4 else b"")


@dataclass(slots=True)
class Cursor:
    inode: int
    offset: int  # bytes consumed (whole records)
    committed: int  # safe resume point: never past a partial line still being assembled


@dataclass(slots=True)
class _Partial:
    start: int  # offset of its first record in the file it came from
    file: str
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    time: bytes = b""


Problem = Callable[[str, str], None]  # (kind, message)
Sink = Callable[[list[bytes]], None]  # a batch of whole lines, as `ContainerTail.poll` returns them
# Bytes per read: a file's new bytes are read (up to the read limit per poll) in chunks of this
# size, each chunk's lines handed to the poll's sink before the next is read. An agent catching up
# on megabytes of log otherwise held them as bytes, as split records and as lines at once
# (~3.5× the read, ~8 MiB per container at a 15-minute backlog), and that peak stayed in its RSS.
# A catch-up's CPU is the same from 64 KiB to 4 MiB chunks (64 KiB: a few % less, measured).
CHUNK_BYTES = 64 << 10


class ContainerTail:
    """The files of one container directory; `poll()` returns new whole lines as `TIMESTAMP CONTENT`."""

    def __init__(self, directory: Path, cursors: dict[str, Cursor] | None, *, from_start: bool,
                 first_read_bytes: int, read_bytes: int, max_line_bytes: int, problem: Problem,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        self.dir = directory
        self.cursors: dict[str, Cursor] = dict(cursors or {})
        self._from_start = from_start  # a container first seen running: later files are read whole
        self._first_read = first_read_bytes
        self._read_bytes = read_bytes
        self._chunk = max(1, chunk_bytes)
        self._sink: Sink | None = None
        self._max_line = max_line_bytes
        self._problem = problem
        self._partial: dict[bytes, _Partial] = {}
        self.lines = 0
        self.binary = 0

    def files(self) -> list[str]:
        """`N.log` names, lowest restart first."""
        try:
            names = [e.name for e in os.scandir(self.dir) if e.name.endswith(".log") and e.name[:-4].isdigit()]
        except OSError:
            return []
        return sorted(names, key=lambda n: int(n[:-4]))

    def poll(self, sink: Sink | None = None) -> list[bytes]:
        """The new whole lines. With `sink`, they are handed to it in batches as they are read (a
        catch-up of megabytes is never in memory as lines at once) and the list returned is empty;
        the sink must not keep the list it is given (it is reused)."""
        out: list[bytes] = []
        names = self.files()
        self._sink = sink
        try:
            for name in names:
                self._poll_file(name, out)
            for gone in set(self.cursors) - set(names):
                cur = self.cursors.pop(gone)
                if self._rotated(gone, cur) is None:
                    self._problem("vanished", f"{self.dir.name}/{gone} was deleted")
                else:
                    self._drain_rotated(gone, cur, out)
            self._flush(out)
        finally:
            self._sink = None
        self._from_start = True
        return out

    def _poll_file(self, name: str, out: list[bytes]) -> None:
        path = self.dir / name
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        except OSError as e:
            self._problem("unreadable", f"{path}: {e.strerror}")
            return
        cur = self.cursors.get(name)
        if cur is None:
            start = 0 if self._from_start else max(0, st.st_size - self._first_read)
            cur = self.cursors[name] = Cursor(st.st_ino, start, start)
            if start:
                self._problem("tail-only", f"{self.dir.name}/{name}: first seen at {st.st_size} bytes; "
                                           f"read from byte {start}")
                self._skip_to_line(path, cur)
        elif cur.inode != st.st_ino:
            self._drain_rotated(name, cur, out)
            cur = self.cursors[name] = Cursor(st.st_ino, 0, 0)
        elif st.st_size < cur.offset:
            self._problem("truncated", f"{self.dir.name}/{name} shrank from {cur.offset} to {st.st_size} bytes; "
                                       "reading from its start")
            self._partial.clear()
            cur.offset = cur.committed = 0
        if st.st_size > cur.offset:
            self._read(path, name, cur, out, st.st_ino)

    def _skip_to_line(self, path: Path, cur: Cursor) -> None:
        try:
            with open(path, "rb") as f:
                f.seek(cur.offset - 1)
                if f.read(1) == b"\n":
                    return
                rest = f.readline(self._max_line + 1)
                cur.offset = cur.committed = cur.offset + len(rest)
        except OSError:
            return

    def _rotated(self, name: str, cur: Cursor) -> Path | None:
        """The renamed `name.<timestamp>` file that still has the inode we were reading."""
        try:
            for e in os.scandir(self.dir):
                if e.name.startswith(name + ".") and not e.name.endswith(".gz") and e.inode() == cur.inode:
                    return Path(e.path)
        except OSError:
            return None
        return None

    def _drain_rotated(self, name: str, cur: Cursor, out: list[bytes]) -> None:
        old = self._rotated(name, cur)
        if old is None:
            self._problem("rotated-lost", f"{self.dir.name}/{name} was rotated and its old file is gone "
                                          "(compressed or deleted); lines after byte "
                                          f"{cur.offset} of it were not read")
            self._partial.clear()
            return
        self._problem("rotated", f"{self.dir.name}/{name} rotated to {old.name}; finished reading it")
        while self._read(old, name, cur, out, cur.inode):
            pass
        self._partial.clear()

    def _read(self, path: Path, name: str, cur: Cursor, out: list[bytes], inode: int) -> bool:
        """Read whole records from `cur.offset`, up to the read limit; True when the limit stopped it
        early. Read in chunks, each one's records handed on (`_flush`) before the next is read: the
        records consumed are those of one read of the limit, with a chunk of them in memory at once."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            self._problem("unreadable", f"{path}: {e.strerror}")
            return False
        start = pos = cur.offset
        read_to = start  # the end of what was read
        try:
            st = os.fstat(fd)
            if st.st_ino != inode:
                return False  # replaced between stat and open: the next poll sees the rotation
            limit = start + min(self._read_bytes, st.st_size - start)
            while pos < limit:
                size = min(self._chunk, limit - pos)
                data = os.pread(fd, size, pos)
                end = data.rfind(b"\n")
                while end < 0 and len(data) == size < limit - pos:
                    # a record longer than a chunk: read more of it, up to the limit
                    size = min(2 * size, limit - pos)
                    data = os.pread(fd, size, pos)
                    end = data.rfind(b"\n")
                read_to = pos + len(data)
                if end < 0:
                    break
                self._records(data, end, pos, name, out)
                pos = cur.offset = pos + end + 1
                self._commit(name, cur)  # before the lines go on: a sink that fails loses no cursor
                self._flush(out)
                if len(data) < size:
                    break  # shorter than it was at fstat (truncated meanwhile): the next poll sees it
        except OSError as e:
            self._problem("unreadable", f"{path}: {e.strerror}")
            read_to = -1  # not read to the limit: the chunks before the failure stay consumed
        finally:
            os.close(fd)
        if pos == start and read_to - start >= self._read_bytes:  # one record longer than a whole read: skip it
            self._problem("oversized", f"{path}: a record longer than {self._read_bytes} bytes skipped")
            cur.offset = cur.committed = read_to
            return False
        return read_to - start >= self._read_bytes

    def _commit(self, name: str, cur: Cursor) -> None:
        """The safe resume point: never past a partial line still being assembled."""
        pending = [p.start for p in self._partial.values() if p.file == name]
        cur.committed = min(pending) if pending else cur.offset

    def _records(self, data: bytes, end: int, pos: int, name: str, out: list[bytes]) -> None:
        """The records of `data[:end]` (whole lines), the first at file offset `pos`."""
        partial = self._partial
        max_line = self._max_line
        inline = b"\x00" not in data  # binary output: every record through `_record`, which counts it
        whole = 0
        for raw in data[:end].split(b"\n"):
            # the common record inline, as `_record` would read it: a full line (tag exactly F) of
            # stdout/stderr within the line limit, no partial line pending
            i = raw.find(b" ")
            if inline and not partial and i >= 20 and raw[i:i + 10] in _HEADS and len(raw) - i - 10 <= max_line:
                out.append(raw[:i] + raw[i + 9:])
                whole += 1
            else:
                self._record(raw, pos, name, out)
            pos += len(raw) + 1
        self.lines += whole

    def _flush(self, out: list[bytes]) -> None:
        """Hand the lines read so far to the poll's sink, if it has one (then `out` is emptied)."""
        if self._sink is not None and out:
            self._sink(out)
            out.clear()

    def _record(self, raw: bytes, pos: int, name: str, out: list[bytes]) -> None:
        rec = parse_cri(raw)
        if rec is None:
            if raw:
                self._problem("malformed", f"{self.dir.name}/{name}: a record not in CRI format at byte {pos}")
            return
        p = self._partial.get(rec.stream)
        if rec.partial:
            if p is None:
                p = self._partial[rec.stream] = _Partial(pos, name, time=rec.time)
            if p.size <= self._max_line:
                p.parts.append(rec.content)
                p.size += len(rec.content)
            return
        content = rec.content
        ts = rec.time
        if p is not None:
            del self._partial[rec.stream]
            p.parts.append(content)
            content = b"".join(p.parts)
            ts = p.time
        if len(content) > self._max_line:
            content = content[: self._max_line]
        self.lines += 1
        if b"\x00" in content:
            self.binary += 1  # binary output carries no progress text; counted, not scanned
            return
        out.append(ts + b" " + content)


class OffsetStore:
    """Cursors of every followed file, persisted as JSON (written whole, then renamed)."""

    VERSION = 1

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.loaded: dict[str, dict[str, Cursor]] = {}
        self.error = ""

    def load(self) -> dict[str, dict[str, Cursor]]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_text())
            if doc.get("version") != self.VERSION:
                raise ValueError(f"version {doc.get('version')!r}")
            self.loaded = {
                key: {name: Cursor(int(c[0]), int(c[1]), int(c[1])) for name, c in files.items()}
                for key, files in doc["containers"].items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            self.error = f"{self.path}: unreadable offsets ({e}); logs read from their tails"
            self.loaded = {}
        return self.loaded

    def save(self, cursors: dict[str, dict[str, Cursor]]) -> None:
        if self.path is None:
            return
        doc = {"version": self.VERSION, "containers": {
            key: {name: [c.inode, c.committed] for name, c in files.items()} for key, files in cursors.items()
        }}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(doc, separators=(",", ":")))
            os.replace(tmp, self.path)
            self.error = ""
        except OSError as e:
            self.error = f"{self.path}: offsets not saved ({e.strerror})"
