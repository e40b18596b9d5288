"""Container logs read through the API server (kubelet-proxied GETs), for the containers no node
agent reads: one pass at a time, several reads in flight.

Each read is one round trip through the API server to the node's kubelet. Read one after the
other, a pass lasts as many round trips as it has reads: at fleet size (≈ 530 reads a pass-second
at the defaults, docs/benchmarks.md) that outlasts the 30 s interval once a round trip takes more
than ≈ 2 ms, and a real kubelet-proxied read takes 5–50 ms. So `concurrency` reads are in flight at
once on daemon threads that only do the GET; which containers are due, what to ask (`sinceTime`)
and what came back (scan, unchanged answers, the rotation's bookkeeping) stay on the polling
thread, so `LogRotation` needs no lock and a pass hands on its results as the reads complete.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from collector.correlate import Signal
from collector.logrotation import LogKey, LogRotation, last_stamp
from collector.model import Ref
from collector.progress import scan_text
from collector.sources.kube_api import LogApi, SourceError, pod_log_path

HOLD_MAX_S = 30.0  # the longest a Retry-After holds the poller (one default interval)
LogTarget = tuple[Ref, str, str, int]  # the pod, container, profile regex ("": built-in parsers), restarts


@dataclass(frozen=True, slots=True)
class ApiLogSettings:
    tail_lines: int = 500
    limit_bytes: int = 256 * 1024
    quiet_every: int = 4  # passes between reads of a container whose last read showed no progress
    concurrency: int = 16  # reads in flight


@dataclass(frozen=True, slots=True)
class LogFresh:
    """A read that found nothing after the last line read: the held evidence stands, read at `at`."""

    ref: Ref
    container: str
    at: datetime


@dataclass(frozen=True, slots=True)
class BadRegex:
    """A profile's regex that does not compile; the log was read with the built-in parsers."""

    message: str


LogResult = Signal | LogFresh | SourceError | BadRegex


@dataclass(frozen=True, slots=True)
class _Ask:
    key: LogKey
    ref: Ref
    regex: str
    restarts: int
    since: str | None
    previous: bool  # also read the previous log (the container restarted since its last read)
    query: tuple[tuple[str, object], ...]
    pass_no: int  # an answer from a pass that ended early is not this pass's


_Done = tuple[_Ask, bytes | BaseException]


class _Readers:
    """Daemon threads that do the GETs (a stuck read never holds up the process's exit)."""

    def __init__(self, n: int, fetch: Callable[[_Ask], bytes]) -> None:
        self._asks: queue.SimpleQueue[_Ask | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[_Done] = queue.SimpleQueue()
        self._fetch = fetch
        self._threads = [threading.Thread(target=self._work, name=f"log-read-{i}", daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while (ask := self._asks.get()) is not None:
            try:
                out: bytes | BaseException = self._fetch(ask)
            except BaseException as e:  # handed to the polling thread, which decides
                out = e
            self.done.put((ask, out))

    def submit(self, ask: _Ask) -> None:
        self._asks.put(ask)

    def close(self) -> None:
        for _ in self._threads:
            self._asks.put(None)


class ApiLogPoller:
    """One pass at a time over the containers to read; `open` before the first, `close` after."""

    def __init__(self, api: LogApi, settings: ApiLogSettings, now: Callable[[], datetime]) -> None:
        if settings.concurrency < 1:
            raise ValueError(f"log read concurrency must be at least 1, not {settings.concurrency}")
        self.api = api
        self.settings = settings
        self.now = now
        self.rotation = LogRotation(settings.quiet_every)
        self._previous_read: dict[LogKey, int] = {}  # restart count at the last read
        self._readers: _Readers | None = None
        self._hold_until = 0.0  # monotonic: no new read before (the server's Retry-After)
        self.reads = 0  # GETs of current logs answered, all passes

    def open(self) -> None:
        if self._readers is None:
            self._readers = _Readers(self.settings.concurrency, self._fetch)

    def close(self) -> None:
        if self._readers is not None:
            self._readers.close()
            self._readers = None

    def run_pass(self, targets: Sequence[LogTarget], *, agent_pods: Collection[tuple[str, str]],
                 held: Callable[[Ref, str], bool], stop: threading.Event) -> Iterator[LogResult]:
        """Read the containers due in this pass, yielding what each read found as it completes.

        `agent_pods`: (namespace, pod) whose logs a node agent reads (skipped unless a profile
        regex asks for the API read); `held`: whether the index holds a signal for a container
        (an unchanged answer refreshes only a held one). Ends early, its reads dropped, on `stop`.
        """
        readers = self._readers
        if readers is None:
            raise RuntimeError("ApiLogPoller.run_pass before open()")
        wanted = {(ref.namespace, ref.name, container) for ref, container, _, _ in targets}
        for key in [k for k in self._previous_read if k not in wanted]:
            del self._previous_read[key]
        self.rotation.begin_pass(wanted)
        window = 2 * self.settings.concurrency  # asked ahead, so a reader never waits for the scan
        todo = iter(targets)
        in_flight = 0
        exhausted = False
        while True:
            hold = self._hold_until - time.monotonic()
            while hold <= 0 and not exhausted and in_flight < window:
                ask = self._next_ask(todo, agent_pods)
                if ask is None:
                    exhausted = True
                else:
                    readers.submit(ask)
                    in_flight += 1
            if stop.is_set() or (in_flight == 0 and exhausted):
                return  # (on stop, the answers still out are dropped when they come)
            if in_flight == 0:  # the server asked us to wait
                stop.wait(min(hold, 0.25))
                continue
            try:
                ask, out = readers.done.get(timeout=min(hold, 0.25) if hold > 0 else 0.25)
            except queue.Empty:
                continue
            if ask.pass_no != self.rotation.passes:
                continue  # from a pass that ended early
            in_flight -= 1
            if isinstance(out, SourceError) and out.retry_after:
                # 429/503 with Retry-After (API priority and fairness): no new read until then,
                # at most HOLD_MAX_S; the reads already asked finish, the failed one is due next pass
                self._hold_until = max(self._hold_until, time.monotonic() + min(out.retry_after, HOLD_MAX_S))
            yield from self._answered(ask, out, held)

    def _next_ask(self, todo: Iterator[LogTarget], agent_pods: Collection[tuple[str, str]]) -> _Ask | None:
        for ref, container, regex, restarts in todo:
            if not regex and (ref.namespace, ref.name) in agent_pods:
                continue  # a node agent reads this pod's logs where they are written
            key = (ref.namespace, ref.name, container)
            if not self.rotation.due(key, restarted=restarts != self._previous_read.get(key, restarts)):
                continue
            query: list[tuple[str, object]] = [
                ("container", container), ("tailLines", self.settings.tail_lines),
                ("limitBytes", self.settings.limit_bytes), ("timestamps", "true")]
            since = self.rotation.since(key)
            if since is not None:
                query.append(("sinceTime", since))  # the lines since the last read (and its second)
            return _Ask(key, ref, regex, restarts, since, restarts > self._previous_read.get(key, 0), tuple(query),
                        self.rotation.passes)
        return None

    def _fetch(self, ask: _Ask) -> bytes:
        """On a reader thread: the GETs only."""
        path = pod_log_path(ask.ref.namespace, ask.ref.name)
        previous = self._previous_log(path, ask) if ask.previous else b""
        return previous + self.api.get_text(path, ask.query)

    def _previous_log(self, path: str, ask: _Ask) -> bytes:
        """The previous log of a container that restarted since its log was last read (bounded like
        the current one).

        Read once per restart, before the current log and scanned with it as one signal, so a step
        going back below the pre-restart high-water mark is seen as replay; later polls keep those
        samples through the signal's history (`merge_history`), so they are not read again.
        """
        try:
            text = self.api.get_text(path, [("container", ask.key[2]), ("previous", "true"),
                                            ("tailLines", self.settings.tail_lines),
                                            ("limitBytes", self.settings.limit_bytes), ("timestamps", "true")])
        except SourceError as e:
            if e.retryable:
                raise
            text = b""  # kubelet kept no previous log (rotated, or the pod was recreated): nothing to add
        return text if not text or text.endswith(b"\n") else text + b"\n"

    def _answered(self, ask: _Ask, out: bytes | BaseException, held: Callable[[Ref, str], bool]) -> Iterator[LogResult]:
        key, ref, container = ask.key, ask.ref, ask.key[2]
        if isinstance(out, SourceError):
            self.rotation.failed(key)
            yield out
            return
        if isinstance(out, BaseException):
            raise out  # not an I/O failure: a bug, raised where it was before reads went to threads
        self.reads += 1
        self._previous_read[key] = ask.restarts
        if not ask.previous and self.rotation.unchanged(key, ask.since, out) and held(ref, container):
            # no line after the last one read: what the signal holds stands, read now (a signal the
            # index no longer holds is read in full again)
            self.rotation.read(key, progress=False, since=ask.since, data=out)
            yield LogFresh(ref, container, self.now())
            return
        source = f"{ref.namespace}/{ref.name}/{container}"
        try:
            scan = scan_text(out, source=source, custom_regex=ask.regex or None)
        except ValueError as e:  # a bad profile regex: say so, read with the built-in parsers
            yield BadRegex(f"log regex for {ref}: {e}")
            scan = scan_text(out, source=source)
        self.rotation.read(key, progress=bool(scan.samples), last_line=last_stamp(out), since=ask.since,
                           data=None if ask.previous else out)
        yield Signal(ref, container, scan, self.now())
