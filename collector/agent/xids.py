"""XID events from NVML's event API and from the kernel log, counted per GPU, code and origin.

Meanings and actions come from `collector.progress.xid`, the table `scan` uses: NVIDIA's XID catalogue
(every code it lists; one it does not stays "unknown XID n"), so the evidence, `taugrid_gpu_xid_info`
and the GpuXids rows explain a code the same way. Kernel-log records
come from `/dev/kmsg` (`PRIORITY,SEQ,USEC,FLAGS;MESSAGE`, continuation lines start with a space);
a record that does not parse is counted as malformed and skipped, never fatal.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collector.progress.xid import describe, match_xid
from collector.redact import redact

log = logging.getLogger("taugrid.agent.xids")

MAX_MESSAGE = 200  # characters of the kernel's XID message kept (redacted)
MAX_FIRST_SEEN = 1024  # (GPU, code) pairs whose first time is kept; more are counted only


@dataclass(frozen=True, slots=True)
class XidEvent:
    code: int
    uuid: str  # "" when the GPU could not be named
    pci: str  # "" from NVML events
    origin: str  # "nvml" | "kmsg"
    at: float  # unix seconds (the agent's clock)
    meaning: str
    action: str
    message: str = ""


class XidCounter:
    """Thread-safe: the NVML event thread and the kmsg reader both add."""

    def __init__(self, *, recent: int = 64, pci_to_uuid: Callable[[], dict[str, str]] | None = None) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int, str], int] = {}
        self._recent: deque[XidEvent] = deque(maxlen=recent)
        self._first: dict[str, dict[int, float]] = {}  # uuid (or pci) → code → earliest time seen
        self._first_n = 0
        self._pci_to_uuid = pci_to_uuid

    def add(self, code: int, *, uuid: str = "", pci: str = "", origin: str, at: float | None = None,
            message: str = "") -> XidEvent:
        if not uuid and pci and self._pci_to_uuid is not None:
            uuid = self._pci_to_uuid().get(pci.rsplit(".", 1)[0] if pci.count(".") else pci, "")
        meaning, action = describe(code)
        ev = XidEvent(code, uuid, pci, origin, at if at is not None else time.time(), meaning, action,
                      redact(message[:MAX_MESSAGE]) if message else "")
        key = (uuid or pci, code, origin)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            self._recent.append(ev)
            if key[0]:
                codes = self._first.get(key[0])
                seen = codes.get(code) if codes is not None else None
                if seen is None and self._first_n < MAX_FIRST_SEEN:
                    self._first.setdefault(key[0], {})[code] = ev.at
                    self._first_n += 1
                elif seen is not None and ev.at < seen:  # an earlier one read later (kernel log vs NVML)
                    self._first[key[0]][code] = ev.at
        return ev

    def first_seen(self) -> dict[str, dict[int, float]]:
        """uuid (or pci where no GPU was named) → XID code → the earliest time (unix seconds) one was
        seen since the agent started, from NVML events and the kernel log (never tenants' logs)."""
        with self._lock:
            return {dev: dict(codes) for dev, codes in self._first.items()}

    def counts(self) -> dict[tuple[str, int, str], int]:
        """(uuid or pci, code, origin) → count since the agent started."""
        with self._lock:
            return dict(self._counts)

    def recent(self) -> list[XidEvent]:
        with self._lock:
            return list(self._recent)


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    priority: int
    seq: int
    usec: int  # since boot
    message: str


def parse_kmsg(line: str) -> KmsgRecord | None:
    """One `/dev/kmsg` record (`6,1234,5678901,-;text`); None for anything else."""
    head, sep, message = line.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 4:
        return None
    try:
        return KmsgRecord(int(fields[0]), int(fields[1]), int(fields[2]), message.rstrip("\n"))
    except ValueError:
        return None


class KmsgReader:
    """Follows `/dev/kmsg` (or any file of kmsg records) on its own thread and counts NVRM XIDs.

    `/dev/kmsg` returns one record per read() and EPIPE when the ring buffer overwrote records we
    had not read yet (then reading continues with the oldest available). Non-blocking reads let
    the thread notice `stop()`.
    """

    def __init__(self, path: Path, counter: XidCounter, *, poll_s: float = 0.5,
                 boot_time: float | None = None) -> None:
        self.path = path
        self._counter = counter
        self._poll_s = poll_s
        self._boot = boot_time if boot_time is not None else _boot_time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.records = 0
        self.malformed = 0
        self.overruns = 0
        self.error = ""  # why the log cannot be read, if it cannot
        self.last_seq = -1

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kmsg", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    @property
    def up(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self.error

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as e:
                self.error = f"cannot open {self.path}: {e.strerror}"
                log.warning("kernel log not readable: XIDs come from NVML only", extra={"error": self.error})
                self._stop.wait(30.0)
                continue
            self.error = ""
            try:
                self._follow(fd)
            finally:
                os.close(fd)

    def _follow(self, fd: int) -> None:
        carry = b""
        while not self._stop.is_set():
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                self._stop.wait(self._poll_s)
                continue
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten before we read them
                    self.overruns += 1
                    continue
                self.error = f"reading {self.path}: {e.strerror}"
                return
            if not chunk:  # a plain file at its end: wait for more
                self._stop.wait(self._poll_s)
                continue
            lines = (carry + chunk).split(b"\n")
            carry = lines.pop()
            if len(carry) > 65536:
                carry = b""
                self.malformed += 1
            for raw in lines:
                self.feed(raw)

    def feed(self, raw: bytes) -> None:
        if not raw or raw[:1] == b" ":  # blank, or a continuation line (` SUBSYSTEM=pci`)
            return
        line = raw.decode("utf-8", "replace")
        rec = parse_kmsg(line)
        if rec is None:
            self.malformed += 1
            return
        self.records += 1
        if rec.seq <= self.last_seq:
            return  # re-read after reopening: counted already
        self.last_seq = rec.seq
        if "Xid" not in rec.message:
            return
        found = match_xid(rec.message)
        if found is None:
            return
        code, pci = found
        _, _, rest = rec.message.partition(f"): {code}")
        self._counter.add(code, pci=pci, origin="kmsg", at=self._boot + rec.usec / 1e6,
                          message=rest.lstrip(", "))


def _boot_time() -> float:
    try:
        with open("/proc/uptime") as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()
