"""Ray runtime evidence: one cluster head's dashboard (Jobs and state APIs) and metrics endpoint.

Only Ray's documented REST endpoints, each GET bounded in all by `collector.sources.httpget`
(DESIGN.md §2): the `ray` package is not a dependency of the collector, and the node agent never
imports this module. Where a head and its workers answer (URLs from validated parts only) is
`collector.sources.ray_urls`.

- `RayHead` reads one head: `GET /api/jobs/` (jobs), `GET /api/jobs/{id}/logs` (cut to a tail),
  `GET /api/v0/nodes` (alive nodes) and a metrics endpoint (Prometheus text, parsed with
  `prometheus_client.parser`). Failures raise `RaySourceError`, retryable or permanent.
- `RayProgress` (`collector.sources.ray_progress`) turns successive scrapes of a step counter, or
  where a run has none, of Ray Train's own report totals and controller state, into `ProgressSample`s.
- `RayPoller` reads many heads and hands on, per cluster as soon as it is read, a `RayRuntime`
  and the "ray-metrics" `Signal`. A head that cannot be read yields a runtime with `error` set and no signal, so the
  last signal ages out and the progressing claim fails closed. An unreadable metrics endpoint
  (garbage, HTML, a cut body) yields a signal with no samples and a diagnostic: never a sample.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import orjson
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from collector.correlate import RayRuntime, Signal
from collector.model import Plane, Ref
from collector.progress import HangFinding, scan_text
from collector.render import safe_text
from collector.sources import httpget
from collector.sources.ray_progress import DEFAULT_COUNTER, DEFAULT_LOSS, HISTORY, SOURCE, RayProgress
from collector.sources.ray_urls import is_worker_metrics_url, normalize_url

JOB_STATUSES = frozenset({"PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"})
TERMINAL_JOB_STATUSES = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
NODES_LIMIT = 10_000  # the state API's own maximum (RAY_MAX_LIMIT_FROM_API_SERVER)
SNIPPET = 64  # characters of a tenant's answer a diagnostic may quote (redacted, controls escaped)

JSON = dict[str, Any]


# --- errors ---------------------------------------------------------------------------------------


class RaySourceError(Exception):
    """A failure reading a Ray head. `retryable`: connection, timeouts, 429/5xx, a cut body.
    Permanent: 404 or another 4xx on an API, a body that is not what the API documents
    (undecodable JSON after retries, an unexpected shape), a metrics endpoint that is not
    Prometheus text, a body over the size limit."""

    def __init__(self, message: str, *, retryable: bool = True, timed_out: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.timed_out = timed_out


def _permanent(message: str) -> RaySourceError:
    return RaySourceError(message, retryable=False)


# --- small parsing helpers ---------------------------------------------------------------------


def _ms(value: object) -> datetime | None:
    """Ray's epoch-millisecond timestamps (`start_time`, `end_time`)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    try:
        return datetime.fromtimestamp(value / 1000.0, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def snippet(data: bytes | str) -> str:
    """At most SNIPPET characters of what a tenant's endpoint answered, redacted and escaped: enough
    to tell HTML or an error page from metrics, never a page of someone's answer (docs/security.md)."""
    text = data[:1024].decode("utf-8", "replace") if isinstance(data, bytes) else data[:1024]
    text = " ".join(text.split())
    out = safe_text(text[:4 * SNIPPET])
    return out if len(out) <= SNIPPET else out[:SNIPPET - 3] + "..."


@dataclass(frozen=True, slots=True)
class RayJobInfo:
    """One entry of the Jobs API (`GET /api/jobs/`)."""

    submission_id: str  # "" for a driver started by hand (type DRIVER)
    job_id: str  # "" until the driver started
    type: str  # SUBMISSION | DRIVER
    status: str  # PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED
    message: str
    entrypoint: str
    start_time: datetime | None
    end_time: datetime | None
    error_type: str = ""
    driver_exit_code: int | None = None

    @property
    def key(self) -> str:
        return self.submission_id or self.job_id

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RayJobInfo:
        code = doc.get("driver_exit_code")
        return cls(
            submission_id=_str(doc.get("submission_id")),
            job_id=_str(doc.get("job_id")),
            type=_str(doc.get("type")),
            status=_str(doc.get("status")).upper(),
            message=_str(doc.get("message")),
            entrypoint=_str(doc.get("entrypoint")),
            start_time=_ms(doc.get("start_time")),
            end_time=_ms(doc.get("end_time")),
            error_type=_str(doc.get("error_type")),
            driver_exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        )


def select_job(jobs: Sequence[RayJobInfo], job_id: str | None) -> RayJobInfo | None:
    """The job named by `job_id` (submission id or Ray job id), else the newest job."""
    if job_id:
        for job in jobs:
            if job_id in (job.submission_id, job.job_id):
                return job
        return None
    epoch = datetime.min.replace(tzinfo=UTC)
    return max(jobs, key=lambda j: (j.start_time or epoch, j.key), default=None)


def count_alive(doc: object) -> int:
    """Alive nodes in a state API `GET /api/v0/nodes` answer.

    Ray 2.x: `{"result": true, "msg": "", "data": {"result": {"total": N, "num_after_truncation": N,
    "num_filtered": N, "result": [{"node_id": ..., "state": "ALIVE", ...}], ...}}}`.
    """
    if not isinstance(doc, dict):
        raise _permanent("state API: expected a JSON object")
    if doc.get("result") is False:
        raise RaySourceError(f"state API refused: {snippet(_str(doc.get('msg'))) or 'no message'}")
    data = doc.get("data")
    inner = data.get("result") if isinstance(data, dict) else None
    rows = inner.get("result") if isinstance(inner, dict) else inner
    if not isinstance(rows, list):
        raise _permanent("state API: no node list at data.result.result")
    alive = sum(1 for r in rows if isinstance(r, dict) and r.get("state") == "ALIVE")
    if isinstance(inner, dict):
        shown, matched = inner.get("num_after_truncation"), inner.get("num_filtered")
        # Truncated: the list holds only the first `limit` alive nodes; the count is still right.
        if isinstance(shown, int) and isinstance(matched, int) and shown < matched:
            alive = max(alive, matched)
    return alive


def parse_metrics(text: str) -> list[Metric]:
    """Prometheus text exposition → metric families; garbage raises a permanent RaySourceError."""
    try:
        return list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError, IndexError, ... on garbage
        # The parser's message quotes the offending line: only its type is kept, and a snippet.
        raise _permanent(f"metrics: not Prometheus text ({type(e).__name__}); "
                         f"body starts \"{snippet(text.lstrip())}\"") from e


# --- one head -------------------------------------------------------------------------------------


RETRY_STATUSES = frozenset({502, 503, 504})


class RayHead:
    """HTTP client for one Ray head's dashboard (port 8265) and, optionally, its metrics endpoint.

    Every request is bounded in all (`collector.sources.httpget`): connecting within
    `connect_timeout`, the whole answer within `connect_timeout + read_timeout`, and nothing past
    `deadline` (a monotonic time: the poller's budget for this cluster). A head that trickles its
    answer a byte at a time is cut there. Connection failures and 502/503/504 are retried twice,
    quickly, while time is left."""

    def __init__(
        self,
        dashboard_url: str,
        metrics_url: str | None = None,
        *,
        connect_timeout: float = 2.0,
        read_timeout: float = 10.0,
        max_body: int = 32 * 1024 * 1024,
        json_attempts: int = 2,
        deadline: float | None = None,
        attempts: int = 3,
    ) -> None:
        self.base = normalize_url(dashboard_url)
        self.metrics_url = metrics_url
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_body = max_body
        self.json_attempts = max(1, json_attempts)
        self.deadline = deadline
        self.attempts = max(1, attempts)

    def _fetch(self, url: str, accept: str, what: str) -> tuple[str, bytes]:
        """GET → (Content-Type, body); raises RaySourceError for transport errors and HTTP ≥ 300."""
        answer: httpget.Answer | None = None
        for attempt in range(self.attempts):
            if attempt:
                pause = 0.1 * 2 ** (attempt - 1)
                if self.deadline is not None and time.monotonic() + pause >= self.deadline:
                    break
                time.sleep(pause)
            try:
                answer = httpget.get(url, connect_s=self.connect_timeout,
                                     total_s=self.connect_timeout + self.read_timeout, max_body=self.max_body,
                                     accept=accept, deadline=self.deadline, chunked=True)
            except httpget.HttpGetError as e:
                if not e.connected and e.retryable and attempt + 1 < self.attempts:
                    continue  # refused or unreachable: nothing was asked yet, ask again
                # The detail may quote a few bytes of the answer (a status line, a header value).
                raise RaySourceError(f"{what}: {safe_text(e.detail)}", retryable=e.retryable,
                                     timed_out=e.timed_out) from e
            if answer.status not in RETRY_STATUSES:
                break
        assert answer is not None
        status, body = answer.status, answer.body
        if status >= 400:
            quoted = snippet(body)
            text = f"{what}: HTTP {status}" + (f": {quoted}" if quoted else "")
            raise RaySourceError(text, retryable=status == 429 or status >= 500)
        if status >= 300:
            raise _permanent(f"{what}: HTTP {status} redirect to {snippet(answer.headers.get('location', '?'))} "
                             "(not followed)")
        return answer.headers.get("content-type", ""), body

    def _json(self, path: str, what: str) -> Any:
        last: Exception | None = None
        for _ in range(self.json_attempts):
            _, body = self._fetch(self.base + path, "application/json", what)
            try:
                return orjson.loads(body)
            except orjson.JSONDecodeError as e:
                last = e
        raise _permanent(f"{what}: not JSON after {self.json_attempts} attempts: {last}")

    def jobs(self) -> list[RayJobInfo]:
        doc = self._json("/api/jobs/", "GET /api/jobs/")
        if not isinstance(doc, list):
            raise _permanent("GET /api/jobs/: expected a JSON list")
        return [RayJobInfo.from_json(d) for d in doc if isinstance(d, dict)]

    def job(self, submission_id: str) -> RayJobInfo:
        path = f"/api/jobs/{quote(submission_id, safe='')}"
        doc = self._json(path, f"GET {path}")
        if not isinstance(doc, dict):
            raise _permanent(f"GET {path}: expected a JSON object")
        return RayJobInfo.from_json(doc)

    def job_logs(self, submission_id: str, *, tail_bytes: int = 256 * 1024) -> bytes:
        """The job's driver log, cut to its last `tail_bytes` (from the first whole line)."""
        path = f"/api/jobs/{quote(submission_id, safe='')}/logs"
        doc = self._json(path, f"GET {path}")
        logs = doc.get("logs") if isinstance(doc, dict) else None
        if not isinstance(logs, str):
            raise _permanent(f"GET {path}: no \"logs\" string")
        data = logs.encode("utf-8", "surrogatepass")
        if len(data) > tail_bytes:
            data = data[-tail_bytes:]
            nl = data.find(b"\n")
            data = data[nl + 1:] if 0 <= nl < len(data) - 1 else data
        return data

    def alive_nodes(self) -> int:
        path = (f"/api/v0/nodes?limit={NODES_LIMIT}&detail=false"
                "&filter_keys=state&filter_predicates=%3D&filter_values=ALIVE")
        return count_alive(self._json(path, "GET /api/v0/nodes"))

    def metrics(self, url: str | None = None) -> list[Metric]:
        """Scrape a metrics endpoint (default: this head's `metrics_url`)."""
        url = url or self.metrics_url
        if not url:
            raise _permanent("metrics: no metrics URL")
        what = f"metrics {url}"
        ctype, body = self._fetch(url, "text/plain;version=0.0.4;q=1,*/*;q=0.1", what)
        media = ctype.split(";", 1)[0].strip().lower()
        if media and media != "text/plain":
            raise _permanent(f"{what}: not Prometheus text exposition (Content-Type {media})")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _permanent(f"{what}: not UTF-8 text at byte {e.start}") from e
        return parse_metrics(text)


# --- progress from scrapes ------------------------------------------------------------------------


GPU_UTILIZATION = "ray_node_gpus_utilization"
GPU_POWER_MW = "ray_node_gpu_power_milliwatts"


def gpu_activity(families: Iterable[Metric]) -> dict[str, Any]:
    """Mean utilization and power over the GPUs a head's metrics report (one series per GPU)."""
    util = [s.value for fam in families for s in fam.samples
            if s.name == GPU_UTILIZATION and math.isfinite(s.value)]
    power = [s.value for fam in families for s in fam.samples
             if s.name == GPU_POWER_MW and math.isfinite(s.value)]
    return {
        "gpus": max(len(util), len(power)),
        "gpu_utilization": math.fsum(util) / len(util) if util else None,
        "gpu_power_w": math.fsum(power) / len(power) / 1000 if power else None,
    }


# --- many heads -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RayTarget:
    cluster: Ref  # the RayCluster
    dashboard_url: str
    metrics_url: str | None = None
    job_id: str | None = None  # submission id (or Ray job id); None: the newest job
    counter: str = DEFAULT_COUNTER  # per workload profile
    loss: str | None = DEFAULT_LOSS
    # Each Ray node exports only its own metrics: training usually runs on the workers, so their
    # endpoints (pod IP, metrics port) are scraped too and the counter summed over all of them.
    worker_metrics_urls: tuple[str, ...] = ()


@dataclass(slots=True)
class _State:
    progress: RayProgress
    last_seen: datetime
    failures: int = 0
    retry_at: datetime | None = None
    last_error: str = ""
    log_job: str = ""
    log_read_at: datetime | None = None
    log_status: str = ""
    hangs: tuple[HangFinding, ...] = ()
    log_diag: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class RayPoller:
    """Reads each target's head; keeps one `RayProgress` per cluster between polls.

    A head that fails is retried after a capped, jittered backoff (no waiting on a dead head every
    tick); until then its runtime carries the last error. Job logs are read at most every
    `log_interval` (and once more when the job ends) and scanned for hang findings only.

    Fairness between tenants: each request has a total time bound and each cluster's whole read a
    `cluster_budget`, so a head that trickles its answers holds one worker for that long at most
    (and, timed out, is backed off like a dead one); `poll_each` hands each cluster's result on as
    it is read, never after the slowest of the pass.
    """

    def __init__(
        self,
        *,
        connect_timeout: float = 2.0,
        read_timeout: float = 10.0,
        cluster_budget: timedelta = timedelta(seconds=20),
        log_interval: timedelta = timedelta(seconds=30),
        log_tail_bytes: int = 256 * 1024,
        max_body: int = 32 * 1024 * 1024,
        history: int = HISTORY,
        max_workers: int = 8,
        backoff_base: timedelta = timedelta(seconds=2),
        backoff_cap: timedelta = timedelta(seconds=60),
        retention: timedelta = timedelta(minutes=15),
        rng: random.Random | None = None,
    ) -> None:
        self.cluster_budget = cluster_budget
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.log_interval = log_interval
        self.log_tail_bytes = log_tail_bytes
        self.max_body = max_body
        self.history = history
        self.max_workers = max(1, max_workers)
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.retention = retention
        self._rng = rng or random.Random()
        self._states: dict[tuple[str, str, str], _State] = {}
        self._lock = threading.Lock()

    def progress(self, cluster: Ref) -> RayProgress | None:
        st = self._states.get(cluster.key)
        return st.progress if st else None

    def forget(self, cluster: Ref) -> None:
        with self._lock:
            self._states.pop(cluster.key, None)

    def _state(self, t: RayTarget, now: datetime) -> _State:
        with self._lock:
            st = self._states.get(t.cluster.key)
            if st is None or st.progress.counter != t.counter or st.progress.loss != t.loss:
                st = _State(RayProgress(t.counter, t.loss, self.history), now)
                self._states[t.cluster.key] = st
            st.last_seen = now
            return st

    def poll(self, targets: Sequence[RayTarget], now: datetime) -> list[tuple[Ref, RayRuntime, Signal | None]]:
        """Every target's result, in the targets' order, once all are read (`poll_each`)."""
        by_key = {cluster.key: (runtime, sig) for cluster, runtime, sig in self.poll_each(targets, now)}
        return [(t.cluster, *by_key[t.cluster.key]) for t in targets]

    def poll_each(self, targets: Sequence[RayTarget], now: datetime) -> Iterator[tuple[Ref, RayRuntime, Signal | None]]:
        """Each cluster's result as soon as it is read (one per cluster, in the order they finish):
        a slow head delays only its own."""
        unique: dict[tuple[str, str, str], RayTarget] = {}
        for t in targets:
            unique.setdefault(t.cluster.key, t)
        work = list(unique.values())
        if len(work) > 1 and self.max_workers > 1:
            pool = ThreadPoolExecutor(max_workers=min(self.max_workers, len(work)), thread_name_prefix="ray-poll")
            try:
                futures = {pool.submit(self._poll_one, t, now): t for t in work}
                for fut in as_completed(futures):
                    yield futures[fut].cluster, *fut.result()
            finally:
                # A caller that stops early does not wait: each read ends within its own budget.
                pool.shutdown(wait=False, cancel_futures=True)
        else:
            for t in work:
                yield t.cluster, *self._poll_one(t, now)
        with self._lock:
            for key in [k for k, st in self._states.items()
                        if k not in unique and now - st.last_seen > self.retention]:
                del self._states[key]

    def _poll_one(self, t: RayTarget, now: datetime) -> tuple[RayRuntime, Signal | None]:
        st = self._state(t, now)
        with st.lock:
            try:
                return self._read(t, st, now)
            except Exception as e:  # never let one cluster break the poll of the others
                return RayRuntime(None, "", "", now, error=f"{type(e).__name__}: {e}"), None

    def _read(self, t: RayTarget, st: _State, now: datetime) -> tuple[RayRuntime, Signal | None]:
        if st.retry_at is not None and now < st.retry_at:
            wait = (st.retry_at - now).total_seconds()
            return RayRuntime(None, "", "", now, error=f"{st.last_error} (next try in {wait:.0f}s)"), None
        head = RayHead(t.dashboard_url, t.metrics_url, connect_timeout=self.connect_timeout,
                       read_timeout=self.read_timeout, max_body=self.max_body,
                       deadline=time.monotonic() + self.cluster_budget.total_seconds())
        try:
            jobs = head.jobs()
            alive = head.alive_nodes()
        except RaySourceError as e:
            self._back_off(st, now, e)
            st.last_error = f"{head.base}: {e}"
            return RayRuntime(None, "", "", now, error=st.last_error), None
        st.failures, st.retry_at, st.last_error = 0, None, ""
        job = select_job(jobs, t.job_id)
        if job is None:
            message = f"job {t.job_id} not found on the head" if t.job_id else "no jobs on the head"
            runtime = RayRuntime(alive, "", message, now)
        else:
            runtime = RayRuntime(alive, job.status if job.status in JOB_STATUSES else "", job.message, now)
        if not t.metrics_url:
            return runtime, None
        self._read_logs(head, job, st, now)
        diag = ""
        ok = True
        try:
            families = head.metrics()
            for url in t.worker_metrics_urls:
                # All or nothing: a sum missing one node would look like a counter reset (a replay).
                if not is_worker_metrics_url(url):
                    raise _permanent(f"worker metrics URL {snippet(url)} refused: not http://<pod IP>:<port>/metrics")
                families.extend(head.metrics(url))
        except RaySourceError as e:
            ok, diag = False, str(e)
            if e.timed_out:  # a head that trickles its metrics is backed off like a dead one
                self._back_off(st, now, e)
                st.last_error = f"{head.base}: {e}"
        else:
            _, diag = st.progress.observe(families, now)
            runtime = replace(runtime, **gpu_activity(families))
        scan = st.progress.scan(hangs=st.hangs, diagnostics=(diag, st.log_diag), with_samples=ok)
        return runtime, Signal(ref=t.cluster, source=SOURCE, scan=scan, read_at=now, plane=Plane.RAY)

    def _back_off(self, st: _State, now: datetime, e: RaySourceError) -> None:
        st.failures += 1
        delay = min(self.backoff_cap.total_seconds(),
                    self.backoff_base.total_seconds() * 2 ** min(st.failures - 1, 20))
        if not e.retryable:
            delay = self.backoff_cap.total_seconds()
        st.retry_at = now + timedelta(seconds=self._rng.uniform(delay / 2, delay))

    def _read_logs(self, head: RayHead, job: RayJobInfo | None, st: _State, now: datetime) -> None:
        if job is None or not job.submission_id:
            return
        if job.submission_id != st.log_job:
            st.log_job, st.log_read_at, st.log_status, st.hangs, st.log_diag = job.submission_id, None, "", (), ""
        due = st.log_read_at is None or now - st.log_read_at >= self.log_interval
        ended = job.status in TERMINAL_JOB_STATUSES and st.log_status not in TERMINAL_JOB_STATUSES
        if not (due or ended):
            return
        st.log_read_at, st.log_status = now, job.status
        try:
            tail = head.job_logs(job.submission_id, tail_bytes=self.log_tail_bytes)
        except RaySourceError as e:
            st.log_diag = f"job logs: {e}"
            return
        scan = scan_text(tail, source=f"ray-job/{job.submission_id}")
        st.hangs, st.log_diag = scan.hangs, ""
