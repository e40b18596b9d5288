"""Container logs read through the API server (kubelet-proxied GETs), for the containers no node
agent reads: one pass at a time, several reads in flight.

Each read is one round trip through the API server to the node's kubelet. Read one after the
other, a pass lasts as many round trips as it has reads: at fleet size (≈ 530 reads a pass-second
at the defaults, docs/benchmarks.md) that outlasts the 30 s interval once a round trip takes more
than ≈ 2 ms, and a real kubelet-proxied read takes 5–50 ms. So `concurrency` reads are in flight at
once on daemon threads that only do the GET; which containers are due, what to ask (`sinceTime`)
and what came back (scan, unchanged answers, the rotation's bookkeeping) stay on the polling
thread, so `LogRotation` needs no lock and a pass hands on its results as the reads complete.

What a pass asks is planned first (`LogPlanner`, pure): of the containers the rotation says are due,
none an agent reads, none of a run whose claims need no fresh read before the next pass
(`quiet_until`), then at most `max_gets` GETs and `max_bytes` bytes (the operator's ceiling on what
a pass costs the API server and the kubelets), asked one tenant (namespace) at a time in turn, the
containers a ceiling cut first the pass after. Skipping a read never makes a claim true: the held
evidence keeps its read time and ages towards its bound like any other (then unknown).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import chain, zip_longest

from collector.correlate import Signal
from collector.logrotation import LogKey, LogRotation, last_stamp
from collector.model import Observed, Ref, RunClaims
from collector.progress import scan_text
from collector.sources.kube_api import LogApi, SourceError, pod_log_path

HOLD_MAX_S = 30.0  # the longest a Retry-After holds the poller (one default interval)
# The `LogScan.source` of a container's log read through the API server (the signal names the pod and
# container: a string per container held ~80 B, by the 100,000 at fleet size)
API_LOG_SOURCE = "pods/log"
# the pod, container, profile regex ("": built-in parsers), restarts, and its run's rotation slot
# (`logrotation.slot_of`: a run's quiet containers are read in the same pass)
LogTarget = tuple[Ref, str, str, int, int]


@dataclass(frozen=True, slots=True)
class ApiLogSettings:
    tail_lines: int = 500
    limit_bytes: int = 256 * 1024
    quiet_every: int = 4  # passes between reads of a container whose last read showed no progress
    concurrency: int = 16  # reads in flight
    interval_s: float = 30.0  # between the starts of two passes (what "before the next pass" means)
    max_gets: int = 0  # GETs a pass asks at most (a restarted container's previous log counts); 0: no ceiling
    max_bytes: int = 0  # bytes a pass reads at most: no new read once reached; 0: no ceiling


@dataclass(slots=True)
class Candidate:
    """A container due for a read this pass (never changed once made: not frozen only because a
    frozen class's `__init__` costs four times as much, once per due container per pass)."""

    key: LogKey
    target: LogTarget
    urgent: bool  # never read, restarted, or printing the steps of a run whose claims change before the next pass
    cost: int = 1  # GETs: 2 when its previous log is read too
    rank: int = 0  # its place among its pod's containers (0: the first, usually the trainer)


@dataclass(frozen=True, slots=True)
class PassReport:
    """What one pass asked of the API server, and what it left."""

    targets: int = 0  # containers polled through the API
    gets: int = 0  # GETs asked (previous logs included)
    bytes: int = 0  # bytes read
    due: int = 0  # containers due (after the skips below)
    deferred: int = 0  # due, not asked: the ceiling bit (read first next pass)
    tenants_deferred: int = 0  # namespaces with a deferred container
    urgent_deferred: int = 0  # of those, never read, restarted, or printing a true run's steps near its window's end
    skipped: Mapping[str, int] = field(default_factory=dict)  # agent | rotation | claims -> containers
    ceiling: str = ""  # "gets" | "bytes": the ceiling that ended the asking; "": the pass asked all it had


def quiet_until(rc: RunClaims) -> datetime | None:
    """Until when a run's claims need no API log read beyond the rotation's quiet cadence: running
    and progressing are true, and nothing in them changes by the clock before `recheck_at` (its
    step window, and every signal's freshness bound, are inside it). None: read as the rotation says.

    A run whose claims are false or unknown is read as due (a stall may end, an unknown may become
    known); a true one's progress containers are read when its window nears, or at the quiet
    cadence, whichever comes first, so a hang printed inside the window is seen as late as a quiet
    rank's is."""
    if rc.progressing.observed is Observed.TRUE and rc.running.observed is Observed.TRUE:
        return rc.recheck_at
    return None


def fair_order(candidates: Iterable[Candidate], waited: Mapping[LogKey, int], turn: int) -> list[Candidate]:
    """This pass's reads in the order they are asked: the urgent ones, then the rest; in each, one
    container of each tenant (namespace) in turn, from a tenant that changes every pass, and within
    a tenant those that waited longest first, then every pod's first container before any pod's
    second (a trainer before its sidecar). A ceiling that cuts the list then leaves every tenant an
    equal share (none starves another) and the containers it cut first in the next pass."""
    classes: tuple[dict[str, list[Candidate]], dict[str, list[Candidate]]] = ({}, {})
    for c in candidates:
        classes[0 if c.urgent else 1].setdefault(c.key[0], []).append(c)
    out: list[Candidate] = []
    for by_tenant in classes:
        tenants = sorted(by_tenant)
        if not tenants:
            continue
        k = turn % len(tenants)
        ranked = [sorted(by_tenant[t], key=lambda c: (-waited.get(c.key, 0), c.rank))  # stable: targets' order
                  for t in tenants[k:] + tenants[:k]]
        # one of each tenant in turn (round r: each tenant's r-th, those with one), a tenant that ran
        # out dropping from the turn
        out.extend(c for c in chain.from_iterable(zip_longest(*ranked)) if c is not None)
    return out


class LogPlanner:
    """The order of a pass's reads (`fair_order`) and the containers a ceiling left waiting."""

    def __init__(self) -> None:
        self.waited: dict[LogKey, int] = {}  # due and not asked: passes waited since
        self.turn = 0

    def order(self, candidates: Iterable[Candidate]) -> list[Candidate]:
        self.turn += 1
        return fair_order(candidates, self.waited, self.turn)

    def settle(self, candidates: Iterable[Candidate], asked: Collection[LogKey]) -> list[Candidate]:
        """After a pass: the candidates it did not ask wait one pass more (due next pass whatever
        the rotation says); returns them."""
        left = [c for c in candidates if c.key not in asked]
        self.waited = {c.key: self.waited.get(c.key, 0) + 1 for c in left}
        return left


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


# (what was asked, its answer, the clock as the answer came: the read's time. The answer may be
# handled seconds later, and a line printed meanwhile is not in it: a later time could call a stall
# window that closed unread "read after it", a false stall.)
_Done = tuple[_Ask, bytes | BaseException, datetime]


class _Readers:
    """Daemon threads that do the GETs (a stuck read never holds up the process's exit)."""

    def __init__(self, n: int, fetch: Callable[[_Ask], bytes], now: Callable[[], datetime]) -> None:
        self._asks: queue.SimpleQueue[_Ask | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[_Done] = queue.SimpleQueue()
        self._fetch = fetch
        self._now = now
        self._threads = [threading.Thread(target=self._work, name=f"log-read-{i}", daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while (ask := self._asks.get()) is not None:
            try:
                out: bytes | BaseException = self._fetch(ask)
            except BaseException as e:  # handed to the polling thread, which decides
                out = e
            self.done.put((ask, out, self._now()))

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
        self.planner = LogPlanner()
        self.last_pass = PassReport()
        self._last_pass_s = 0.0
        self._last_pass_at: datetime | None = None  # the clock at the last pass's start
        self._pass_bytes = 0
        # the last pass's targets, and each one's key and rank among its pod's containers: the same
        # while the targets are (a quiet fleet's), made again when any one changes
        self._keyed: tuple[list[LogTarget], list[LogKey], list[int]] = ([], [], [])

    def open(self) -> None:
        if self._readers is None:
            self._readers = _Readers(self.settings.concurrency, self._fetch, self.now)

    def close(self) -> None:
        if self._readers is not None:
            self._readers.close()
            self._readers = None

    def run_pass(self, targets: Sequence[LogTarget], *, agent_pods: Collection[tuple[str, str]],
                 held: Callable[[Ref, str], bool], stop: threading.Event,
                 quiet: Mapping[tuple[str, str], datetime] | None = None,
                 left_to_agents: int = 0) -> Iterator[LogResult]:
        """Read the containers due in this pass, yielding what each read found as it completes;
        what the pass cost is in `last_pass` once it ends.

        `agent_pods`: (namespace, pod) whose logs a node agent reads (skipped unless a profile
        regex asks for the API read); `held`: whether the index holds a signal for a container
        (an unchanged answer refreshes only a held one); `quiet`: (namespace, pod) → until when its
        run's claims need no read (`quiet_until`); `left_to_agents`: containers a node agent reads that
        are not among `targets` at all (counted with those skipped for it). Ends early, its reads
        dropped, on `stop`.
        """
        readers = self._readers
        if readers is None:
            raise RuntimeError("ApiLogPoller.run_pass before open()")
        started = time.monotonic()
        targets, keys, ranks = self._keys_of(targets)
        wanted = set(keys)
        for key in [k for k in self._previous_read if k not in wanted]:
            del self._previous_read[key]
        self.rotation.begin_pass(wanted)
        # The next pass's end: one interval and a pass away, or as far as the clock moved since the last
        # pass began if that is further (a loaded poller, or a server clock that runs fast: the clock
        # is the API server's) - a read skipped now must still come before its run's deadline.
        now = self.now()
        step = timedelta(seconds=self.settings.interval_s)
        if self._last_pass_at is not None and timedelta(0) < now - self._last_pass_at:
            step = max(step, now - self._last_pass_at)  # (further only reads more: never unsafe)
        self._last_pass_at = now
        horizon = now + step + timedelta(seconds=self._last_pass_s)
        candidates, skipped = self._candidates(zip(targets, keys, ranks, strict=True), agent_pods, held, quiet or {},
                                                 horizon)
        skipped["agent"] += left_to_agents
        todo = iter(self.planner.order(candidates))
        asked: set[LogKey] = set()
        gets = 0
        self._pass_bytes = 0
        ceiling = ""
        max_gets, max_bytes = self.settings.max_gets, self.settings.max_bytes
        window = 2 * self.settings.concurrency  # asked ahead, so a reader never waits for the scan
        in_flight = 0
        exhausted = False
        try:
            while True:
                hold = self._hold_until - time.monotonic()
                while hold <= 0 and not exhausted and in_flight < window:
                    if max_bytes and self._pass_bytes >= max_bytes:
                        ceiling, exhausted = "bytes", True
                        break
                    cand = next(todo, None)
                    if cand is None:
                        exhausted = True
                    elif max_gets and gets + cand.cost > max_gets:
                        ceiling, exhausted = "gets", True
                    else:
                        readers.submit(self._ask(cand))
                        asked.add(cand.key)
                        gets += cand.cost
                        in_flight += 1
                if stop.is_set() or (in_flight == 0 and exhausted):
                    return  # (on stop, the answers still out are dropped when they come)
                if in_flight == 0:  # the server asked us to wait
                    stop.wait(min(hold, 0.25))
                    continue
                try:
                    ask, out, at = readers.done.get(timeout=min(hold, 0.25) if hold > 0 else 0.25)
                except queue.Empty:
                    continue
                if ask.pass_no != self.rotation.passes:
                    continue  # from a pass that ended early
                in_flight -= 1
                if isinstance(out, SourceError) and out.retry_after:
                    # 429/503 with Retry-After (API priority and fairness): no new read until then,
                    # at most HOLD_MAX_S; the reads already asked finish, the failed one is due next pass
                    self._hold_until = max(self._hold_until, time.monotonic() + min(out.retry_after, HOLD_MAX_S))
                elif isinstance(out, bytes):
                    self._pass_bytes += len(out)
                yield from self._answered(ask, out, at, held)
        finally:
            left = self.planner.settle(candidates, asked) if not stop.is_set() else []
            self._last_pass_s = time.monotonic() - started
            self.last_pass = PassReport(len(wanted), gets, self._pass_bytes, len(candidates), len(left),
                                        len({c.key[0] for c in left}), sum(c.urgent for c in left), skipped,
                                        ceiling if left else "")

    def _keys_of(self, targets: Sequence[LogTarget]) -> tuple[list[LogTarget], list[LogKey], list[int]]:
        """The targets, each one's key, and its rank among its pod's containers (targets list a pod's
        containers together): the last pass's while the targets are the same (a list compare: the
        same tuples, as the source hands them on while they do not change, cost a pointer each)."""
        if targets != self._keyed[0]:
            keys, ranks = [], []
            pod: tuple[str, str] = ("", "")
            rank = 0
            for ref, container, *_ in targets:
                rank = rank + 1 if (ref.namespace, ref.name) == pod else 0
                pod = (ref.namespace, ref.name)
                keys.append((ref.namespace, ref.name, container))
                ranks.append(rank)
            self._keyed = (list(targets), keys, ranks)
        return self._keyed

    def _candidates(self, rows: Iterable[tuple[LogTarget, LogKey, int]], agent_pods: Collection[tuple[str, str]],
                    held: Callable[[Ref, str], bool], quiet: Mapping[tuple[str, str], datetime],
                    horizon: datetime) -> tuple[list[Candidate], dict[str, int]]:
        """The containers due this pass (`rows`: each target, its key and rank: `_keys_of`), and how
        many were not, by why: an agent reads them, the rotation reads them another pass, or their
        run's claims need no read before `horizon` (the next pass's end, at the last pass's length)."""
        out: list[Candidate] = []
        agent = rotation = claims = 0
        passes, quiet_every = self.rotation.passes, self.rotation.quiet_every
        due, read_pass, waited, previous = self.rotation.due, self.rotation.read_pass, self.planner.waited, \
            self._previous_read
        for target, key, rank in rows:
            ref, container, regex, restarts, slot = target
            pod = (ref.namespace, ref.name)
            if not regex and pod in agent_pods:
                agent += 1  # a node agent reads this pod's logs where they are written
                continue
            before = previous.get(key)  # the restart count at its last read
            restarted = before is not None and restarts != before
            if key not in waited and not due(key, restarted, slot):
                rotation += 1
                continue
            last = read_pass(key)
            until = quiet.get(pod)
            if until is not None and until > horizon and last is not None and not restarted \
                    and passes - last[0] < quiet_every and held(ref, container):
                # its run's claims stand past the next pass, and this container was read within the
                # quiet cadence: read again when its window nears or the cadence comes round
                claims += 1
                continue
            urgent = last is None or restarted or (until is not None and last[1])
            out.append(Candidate(key, target, urgent, 2 if restarts > (before or 0) else 1, rank))
        return out, {"agent": agent, "rotation": rotation, "claims": claims}

    def _ask(self, cand: Candidate) -> _Ask:
        key, (ref, container, regex, restarts, _) = cand.key, cand.target
        query: list[tuple[str, object]] = [
            ("container", container), ("tailLines", self.settings.tail_lines),
            ("limitBytes", self.settings.limit_bytes), ("timestamps", "true")]
        since = self.rotation.since(key)
        if since is not None:
            query.append(("sinceTime", since))  # the lines since the last read (and its second)
        return _Ask(key, ref, regex, restarts, since, restarts > self._previous_read.get(key, 0), tuple(query),
                    self.rotation.passes)

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

    def _answered(self, ask: _Ask, out: bytes | BaseException, at: datetime,
                  held: Callable[[Ref, str], bool]) -> Iterator[LogResult]:
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
            yield LogFresh(ref, container, at)
            return
        source = API_LOG_SOURCE
        try:
            scan = scan_text(out, source=source, custom_regex=ask.regex or None)
        except ValueError as e:  # a bad profile regex: say so, read with the built-in parsers
            yield BadRegex(f"log regex for {ref}: {e}")
            scan = scan_text(out, source=source)
        self.rotation.read(key, progress=bool(scan.samples), last_line=last_stamp(out), since=ask.since,
                           data=None if ask.previous else out)
        yield Signal(ref, container, scan, at)
