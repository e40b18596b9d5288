"""Which container logs a poll pass reads through the API.

Reading every running container every pass costs one kubelet-proxied GET each: at fleet size
(48,680 containers) a pass outlasted its 30 s interval and kept most of a core busy
(docs/benchmarks.md). Progress is usually printed by one container per run (the driver, rank 0):
a container whose last read carried progress samples is read every pass, so stall detection is
not delayed; the others (errors, hang reports) are read every `quiet_every` passes, which keeps
their evidence inside `evidence_max_age` at the defaults (4 × 30 s), each in its own slot (a hash
of its name) so that every pass reads an even share of them rather than all of them at once. A
container never read, or restarted since its last read, is read at once.

Pure: a function of the passes and what the reads found; the poller owns the I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

LogKey = tuple[str, str, str]  # namespace, pod, container


def _slot(key: LogKey) -> int:
    return zlib.crc32("\x1f".join(key).encode())


@dataclass(slots=True)
class _LastRead:
    at_pass: int
    progress: bool


class LogRotation:
    def __init__(self, quiet_every: int) -> None:
        if quiet_every < 1:
            raise ValueError(f"quiet_every must be at least 1, not {quiet_every}")
        self.quiet_every = quiet_every
        self.passes = 0
        self._last: dict[LogKey, _LastRead] = {}

    def begin_pass(self, wanted: Iterable[LogKey]) -> None:
        """A new pass over these containers: forget the ones no longer polled."""
        self.passes += 1
        keep = set(wanted)
        for key in [k for k in self._last if k not in keep]:
            del self._last[key]

    def due(self, key: LogKey, restarted: bool) -> bool:
        """`restarted`: the container restarted since its last read (the poller reads its previous log)."""
        last = self._last.get(key)
        if last is None or last.progress or restarted:
            return True
        # At most quiet_every passes apart; exactly that once in step with its slot.
        return self.passes > last.at_pass and (self.passes - _slot(key)) % self.quiet_every == 0

    def read(self, key: LogKey, progress: bool) -> None:
        self._last[key] = _LastRead(self.passes, progress)

    def failed(self, key: LogKey) -> None:
        """A read that failed: try again next pass (its evidence is ageing)."""
        self._last.pop(key, None)
