"""Node-local log evidence: follow run pods' containers under `/var/log/pods` and parse them with
the same progress, hang and XID parsers as `scan` (collector.progress), keeping parsed samples only.

Directories are `<namespace>_<pod>_<uid>/<container>/<restart>.log`. One scanner per container
lives as long as the container's directory, so stream state (ranks, progress bars) carries across
polls and restarts exactly as it does across one long file in `scan`.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collector.agent.cri import ContainerTail, OffsetStore
from collector.agent.gate import feed
from collector.agent.settings import LogSettings
from collector.progress.model import LogScan

# The scanner `scan` runs, used incrementally: feed_all() per batch of new lines (through `gate.feed`,
# which skips in bulk the lines feed_all's precheck would drop), finish() for a snapshot. (Private
# to collector.progress.scan; the agent must parse exactly as `scan` does.)
from collector.progress.scan import LineScanner

log = logging.getLogger("taugrid.agent.logs")


@dataclass(frozen=True, slots=True)
class ContainerLog:
    namespace: str
    pod: str
    uid: str
    container: str
    scan: LogScan
    read_at: float  # unix seconds of the last poll that read this container
    # the scanner's line count at the poll a reader asked "since" (`containers(since=)`): None when
    # not asked, or not known (the reader's poll is older than this container's marks: send it whole)
    lines_then: int | None = None


def split_pod_dir(name: str) -> tuple[str, str, str] | None:
    """`<namespace>_<pod>_<uid>` → parts (namespace and pod names are DNS labels: no `_`)."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


MARKS = 128  # per container, the polls that added lines (a reader may ask since any of them)


class _Followed:
    __slots__ = ("namespace", "pod", "uid", "container", "tail", "scanner", "snapshot", "read_at", "lock", "marks",
                 "fed")

    def __init__(self, namespace: str, pod: str, uid: str, container: str, tail: ContainerTail,
                 max_line_bytes: int) -> None:
        self.namespace = namespace
        self.pod = pod
        self.uid = uid
        self.container = container
        self.tail = tail
        # ranks' paces stay with the controller's own reads (the evidence document does not carry them)
        self.scanner = LineScanner(f"{namespace}/{pod}/{container}", None, max_line_bytes, paces=False)
        self.snapshot: LogScan | None = None
        self.read_at = 0.0
        self.lock = threading.Lock()  # the poll thread feeds the scanner; HTTP threads snapshot it
        self.marks: deque[tuple[int, int]] = deque(maxlen=MARKS)  # (poll, scanner lines after it)
        self.fed = 0  # lines fed in the poll under way

    def take(self, lines: list[bytes]) -> None:
        """A batch of the poll's lines (`ContainerTail.poll`'s sink): to the scanner, as `scan` would."""
        feed(self.scanner, lines)
        self.fed += len(lines)

    def lines_at(self, poll: int) -> int | None:
        """The scanner's line count once `poll` was done; None when that is no longer known."""
        marks = self.marks
        if not marks or marks[0][0] > poll:
            return None
        out = marks[0][1]
        for at, lines in marks:  # newest last; at most MARKS
            if at > poll:
                break
            out = lines
        return out


class LogEvidence:
    """Polls the pod log directory on its own thread; `containers()` is a snapshot for readers."""

    def __init__(self, settings: LogSettings, *, wanted: Callable[[], set[tuple[str, str]] | None],
                 state_file: Path | None = None) -> None:
        """`wanted()`: (namespace, pod) pairs to follow, or None for every pod (scope "all")."""
        self.s = settings
        self._wanted = wanted
        self._store = OffsetStore(state_file)
        self._saved = self._store.load()
        if self._store.error:
            log.warning("log offsets not restored", extra={"error": self._store.error})
        self._followed: dict[str, _Followed] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.problems: Counter[str] = Counter()
        self.polls = 0  # polls done; a reader's cursor is (epoch, polls)
        self.epoch = secrets.token_hex(6)  # this process: line numbers and polls start again with it
        self.lines_total = 0  # CRI records read (whole lines), since start
        self.error = ""
        self.skipped_containers = 0

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pod-logs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # keep following; the failure is logged and counted
                log.exception("log poll failed")
                self.problems["internal"] += 1
            self._stop.wait(self.s.poll_s)

    # --- one pass --------------------------------------------------------------------------------
    def _problem(self, kind: str, message: str) -> None:
        self.problems[kind] += 1
        if kind not in ("tail-only",):
            log.info("log file", extra={"problem": kind, "detail": message})

    def _discover(self) -> dict[str, tuple[str, str, str, str, Path]]:
        """key → (namespace, pod, uid, container, dir) for every container directory wanted now."""
        wanted = self._wanted() if self.s.scope == "gpu" else None
        out: dict[str, tuple[str, str, str, str, Path]] = {}
        try:
            pods = list(os.scandir(self.s.root))
            self.error = ""
        except OSError as e:
            self.error = f"{self.s.root}: {e.strerror}"
            return out
        for pe in pods:
            parts = split_pod_dir(pe.name)
            if parts is None or not pe.is_dir():
                continue
            ns, pod, uid = parts
            if self.s.namespaces and ns not in self.s.namespaces:
                continue
            if wanted is not None and (ns, pod) not in wanted:
                continue
            try:
                containers = [ce for ce in os.scandir(pe.path) if ce.is_dir()]
            except OSError:
                continue
            for ce in containers:
                out[f"{pe.name}/{ce.name}"] = (ns, pod, uid, ce.name, Path(ce.path))
        return out

    def poll(self) -> None:
        found = self._discover()
        now = time.time()
        changed = False
        for key in set(self._followed) - set(found):
            with self._lock:
                gone = self._followed.pop(key)
            if gone.tail.dir.is_dir():
                # still on disk, only not wanted now (pod-resources briefly down): keep its offsets so
                # following it again resumes instead of re-reading or skipping
                self._saved[key] = dict(gone.tail.cursors)
            changed = True
        for key in [k for k in self._saved if k not in found and not (self.s.root / k).is_dir()]:
            del self._saved[key]  # its pod is gone from the node
            changed = True
        self.skipped_containers = 0
        for key, (ns, pod, uid, container, path) in sorted(found.items()):
            f = self._followed.get(key)
            if f is None:
                if len(self._followed) >= self.s.max_containers:
                    self.skipped_containers += 1
                    continue
                saved = self._saved.pop(key, None)
                tail = ContainerTail(path, saved, from_start=False, first_read_bytes=self.s.first_read_bytes,
                                     read_bytes=self.s.read_bytes_per_poll, max_line_bytes=self.s.max_line_bytes,
                                     problem=self._problem, chunk_bytes=self.s.read_chunk_bytes)
                f = _Followed(ns, pod, uid, container, tail, self.s.max_line_bytes)
                f.marks.append((self.polls, 0))  # followed from this poll on: nothing read before it
                with self._lock:
                    self._followed[key] = f
            before = {n: c.committed for n, c in f.tail.cursors.items()}
            n0 = f.tail.lines
            with f.lock:  # readers see the container between polls only, as one feed of the poll's lines
                f.fed = 0
                f.tail.poll(f.take)  # fed as read: a catch-up's lines are never all in memory at once
                if f.fed:
                    self._trim(f.scanner)
                    f.snapshot = None
                    f.marks.append((self.polls + 1, f.scanner.lines))
            self.lines_total += f.tail.lines - n0
            f.read_at = now
            if before != {n: c.committed for n, c in f.tail.cursors.items()}:
                changed = True
        if changed:
            self._store.save({**self._saved, **{k: f.tail.cursors for k, f in self._followed.items()}})
        self.polls += 1

    def _trim(self, sc: LineScanner) -> None:
        """Bound memory: keep the newest samples and findings of each container."""
        keep = self.s.samples_kept
        for st in sc.streams.values():
            while len(st.samples) > keep:  # a deque (the scanner bounds it too, at a larger size)
                st.samples.popleft()
        k = self.s.findings_kept
        if len(sc.hangs) > 2 * k:
            del sc.hangs[:-k]
        if len(sc.xids) > 2 * k:
            del sc.xids[:-k]
        if len(sc.resumes) > 2 * k:
            del sc.resumes[:-k]

    # --- readers ---------------------------------------------------------------------------------
    def containers(self, since: int | None = None) -> list[ContainerLog]:
        """Every followed container; `since` (a poll count a reader saw): with the line count each
        had once that poll was done, where known."""
        with self._lock:
            followed = list(self._followed.values())
        out = []
        for f in followed:
            with f.lock:
                snap = f.snapshot
                if snap is None:
                    snap = f.snapshot = f.scanner.finish()
                then = f.lines_at(since) if since is not None else None
            out.append(ContainerLog(f.namespace, f.pod, f.uid, f.container, snap, f.read_at, then))
        return out

    @property
    def followed(self) -> int:
        return len(self._followed)
