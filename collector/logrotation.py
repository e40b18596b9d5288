"""Which container logs a poll pass reads through the API.

Reading every running container every pass costs one kubelet-proxied GET each: at fleet size
(48,680 containers) a pass outlasted its 30 s interval and kept most of a core busy
(docs/benchmarks.md). Progress is usually printed by one container per run (the driver, rank 0):
a container whose last read carried progress samples is read every pass, so stall detection is
not delayed; the others (errors, hang reports) are read every `quiet_every` passes, which keeps
their evidence inside `evidence_max_age` at the defaults (4 × 30 s), in slots (a hash: its run's,
as the poller asks, else its own name's) so that every pass reads an even share of them rather
than all of them at once. One run's quiet containers share a slot: read in one pass, one after the
other, their answers are applied and judged together (one re-evaluation of the run, one deadline
where their evidence ages out) instead of one each, passes apart. A container never read, or
restarted since its last read, is read at once.

From where: a container read before is asked only for the lines since its last one
(`sinceTime`, at the API's one-second resolution: the lines of that second come again and the
history merge lays them over the ones it has), so an unchanged log costs a round trip and the scan
of a line or two (`since`). One read in RESYNC (in a slot of its own) is whole again (the 500-line
tail), so a log that went back in time (a pod re-created on a node whose clock is behind) is not
missed for long. A container that carried progress once is read every pass from then, whether or
not its latest lines hold a step (a stall shows as none). A read answered exactly as the one
before it to the same question (the same `sinceTime`, or the whole tail of a log that is still
empty or quiet) added nothing (`unchanged`): the poller then only refreshes the signal's read time,
without a scan or a re-evaluation.

Pure: a function of the passes and what the reads found; the poller owns the I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

LogKey = tuple[str, str, str]  # namespace, pod, container
RESYNC = 16  # one read in this many is of the whole tail, not only the lines since the last


def _slot(key: LogKey) -> int:
    return zlib.crc32("\x1f".join(key).encode())


def slot_of(group: str) -> int:
    """The rotation slot of a group of containers read together (a run: `LogRotation.due`)."""
    return zlib.crc32(group.encode())


@dataclass(slots=True)
class _LastRead:  # one per polled container (48,680 at fleet size): small
    at_pass: int
    progress: bool
    last_second: str | None  # the whole second of the last line read (`sinceTime`), if any was dated
    reads: int  # reads since the first
    asked: str | None  # the last read's sinceTime (None: whole)
    answer: int | None  # what it got: bytes << 32 | CRC-32 of them (None: not comparable)


class LogRotation:
    def __init__(self, quiet_every: int) -> None:
        if quiet_every < 1:
            raise ValueError(f"quiet_every must be at least 1, not {quiet_every}")
        self.quiet_every = quiet_every
        self.passes = 0
        self._last: dict[LogKey, _LastRead] = {}
        self._answered: tuple[bytes, int] = (b"", _answer(b""))  # `unchanged`, then `read`, of one answer: one CRC

    def _answer(self, data: bytes) -> int:
        if data is not self._answered[0]:
            self._answered = (data, _answer(data))
        return self._answered[1]

    def begin_pass(self, wanted: Iterable[LogKey]) -> None:
        """A new pass over these containers: forget the ones no longer polled."""
        self.passes += 1
        keep = set(wanted)
        for key in [k for k in self._last if k not in keep]:
            del self._last[key]

    def due(self, key: LogKey, restarted: bool, slot: int | None = None) -> bool:
        """`restarted`: the container restarted since its last read (the poller reads its previous log);
        `slot`: its group's (`slot_of`), None: its own."""
        last = self._last.get(key)
        if last is None or last.progress or restarted:
            return True
        # At most quiet_every passes apart; exactly that once in step with its slot.
        return self.passes > last.at_pass and \
            (self.passes - (_slot(key) if slot is None else slot)) % self.quiet_every == 0

    def read_pass(self, key: LogKey) -> tuple[int, bool] | None:
        """(the pass of the container's last read, whether it ever carried progress); None: never read."""
        last = self._last.get(key)
        return None if last is None else (last.at_pass, last.progress)

    def since(self, key: LogKey) -> str | None:
        """The `sinceTime` for this pass's read: None for a whole read (never read, nothing dated
        read yet, or its resync read)."""
        last = self._last.get(key)
        if last is None or last.last_second is None or (last.reads + _slot(key)) % RESYNC == 0:
            return None
        return last.last_second

    def read(self, key: LogKey, progress: bool, last_line: str | None = None, *, since: str | None = None,
             data: bytes | None = None) -> None:
        """`progress`: the read carried progress samples; `last_line`: the timestamp of its last
        line (None: nothing dated was read, the one before stands); `since`/`data`: what it asked
        and got (for `unchanged`; None: not comparable with a later read, e.g. a previous log with it)."""
        last = self._last.get(key)
        reads = 0
        # whole seconds: the API passes no finer (metav1.Time)
        second = last_line[:19] + "Z" if last_line else None
        if last is not None:
            progress = progress or last.progress
            if second is None or second == last.last_second:
                second = last.last_second  # (the same string object: `since` hands it out again)
            reads = last.reads + 1
        self._last[key] = _LastRead(self.passes, progress, second, reads, since,
                                    self._answer(data) if data is not None else None)

    def unchanged(self, key: LogKey, since: str | None, data: bytes) -> bool:
        """The read got exactly what the read before it got for the same question (`sinceTime`, or
        the whole tail): with every line stamped, the log has nothing after the last one read (the
        evidence stands; only its read time moves)."""
        last = self._last.get(key)
        return (last is not None and last.answer is not None and last.asked == since
                and last.answer == self._answer(data))

    def failed(self, key: LogKey) -> None:
        """A read that failed: try again next pass (its evidence is ageing)."""
        self._last.pop(key, None)


def _answer(data: bytes) -> int:
    return len(data) << 32 | zlib.crc32(data)


def last_stamp(data: bytes) -> str | None:
    """The kubelet timestamp (`timestamps=true`: RFC 3339 in UTC, then a space) of the last line
    of `data`, if it has one."""
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    start = data.rfind(b"\n", 0, end) + 1
    stamp = data[start:start + 40].split(b" ", 1)[0]
    if len(stamp) < 20 or stamp[4:5] != b"-" or stamp[10:11] != b"T" or not stamp.endswith(b"Z") \
            or not stamp[:4].isdigit() or not stamp[11:13].isdigit():
        return None
    return stamp.decode("ascii", "replace")
