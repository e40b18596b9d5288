"""Controller side of the node agents: find the DaemonSet's pods, read their `/evidence`, and turn it
into per-pod GPU evidence (`collector.gpu`) and per-container log scans (`collector.progress`).

Each read is stamped with the reader's clock (`read_at`), never the agent's: freshness is judged on
one clock. A document of another version, or fields of the wrong type, are named and skipped.

Transport: one GET per agent on a connection of its own (`fetch`, over `collector.sources.httpget`:
one time bound for the whole read), with the agents' bearer token and, where configured, TLS.
Agents answer HTTP/1.0 and close (`collector.endpoints`), so there is no connection to keep; at
fleet size (5,604 agents every 30 s) urllib3's pool machinery cost 6x, and http.client's response
parsing 2.5-3.5x, the CPU of the socket work itself (docs/benchmarks.md). Bodies are parsed on the
polling thread, not in the fetching ones: parsing holds the GIL, and sixteen threads contending for
it cost more than the parse.
"""

from __future__ import annotations

import ipaddress
import itertools
import ssl
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from sys import intern
from typing import Any

import orjson

from collector.gpu import PodGpuEvidence
from collector.progress.model import (
    HangFinding,
    LogScan,
    PackedSamples,
    ProgressSample,
    ResumeFinding,
    TokenRate,
    XidFinding,
    new_sample,
    new_scan,
)
from collector.progress.scan import MAX_FINDINGS
from collector.progress.timestamps import parse_iso
from collector.progress.trainers import MAX_TPS
from collector.progress.xid import describe
from collector.sources import httpget
from collector.sources.agent_gpus import _entries, _f, _i, _name, _pod_key, gpu_evidence
from collector.sources.kube_api import KubeApi, SourceError
from collector.timeunits import US

# What the reader asks for (`?version=4`: each pod's GPUs packed as the controller holds them, the rest
# column by column with what it reads of them only, `agent.evidence.packed`, `agent_gpus`) and what it
# reads: an agent of a release before answers version 1 (it ignores an ask it does not know).
EVIDENCE_VERSION = 4
READ_VERSIONS = (1, 2, 3, 4)
DEFAULT_SELECTOR = "app.kubernetes.io/name=taugrid-evidence,app.kubernetes.io/component=agent"
DEFAULT_PORT = 9402
HEAD_MAX = httpget.HEAD_MAX  # an answer's status line and headers


class AgentReadError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class AgentEndpoint:
    node: str
    pod: str
    url: str  # base URL, e.g. http://10.0.3.7:9402


@dataclass(frozen=True, slots=True)
class ContainerLogEvidence:
    namespace: str
    pod: str
    container: str
    scan: LogScan
    after: int | None = None  # an increment: what the agent read after this line (None: whole)


# A container an increment found with nothing new to say (no sample, finding, token rate or note): its
# (namespace, pod, container, line count, format, the line the increment starts after). Most of a
# pass's containers at fleet size (every worker and sidecar, 95,000 of 100,000 at 50k pods): the loop
# moves the held signal's read time where the increment adds nothing to it (`planes.signals.adds_nothing`),
# so none of them is a scan, a signal and a change of its own on the way (`ChangeApplier._quiet`).
QuietLog = tuple[str, str, str, int, str | None, int]


@dataclass(frozen=True, slots=True)
class AgentReport:
    endpoint: AgentEndpoint
    read_at: datetime
    nvml_state: str
    podresources_up: bool
    gpus: tuple[PodGpuEvidence, ...]
    logs: tuple[ContainerLogEvidence, ...]
    problems: tuple[str, ...] = ()
    cursor: tuple[str, int] | None = None  # (epoch, poll): ask for what comes after this document
    quiet: tuple[QuietLog, ...] = ()  # the containers of an increment with nothing new (not in `logs`)
    source: str = ""  # `agent_source` of its node: every scan's source

    def log_pods(self) -> set[tuple[str, str]]:
        """(namespace, pod) whose logs this agent reads: the controller need not poll their logs."""
        return {(c.namespace, c.pod) for c in self.logs} | {(q[0], q[1]) for q in self.quiet}


def endpoints_from_pods(pods: Iterable[Mapping[str, Any]], port: int = DEFAULT_PORT, *,
                        scheme: str = "http") -> list[AgentEndpoint]:
    """Running, addressed agent pods → endpoints (one per node; the newest pod wins a tie). The URL
    is built from validated parts only: an IP literal, the configured port and scheme."""
    out: dict[str, AgentEndpoint] = {}
    for p in pods:
        status = p.get("status") or {}
        spec = p.get("spec") or {}
        meta = p.get("metadata") or {}
        ip, node = status.get("podIP"), spec.get("nodeName")
        if status.get("phase") != "Running" or not isinstance(ip, str) or not ip or not isinstance(node, str):
            continue
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            continue  # not an address: never a host name or anything else put into a URL
        host = f"[{addr}]" if addr.version == 6 else str(addr)
        out[node] = AgentEndpoint(node, str(meta.get("name") or ""), f"{scheme}://{host}:{port}")
    return [out[k] for k in sorted(out)]


def discover_agents(api: KubeApi, namespace: str, *, selector: str = DEFAULT_SELECTOR,
                    port: int = DEFAULT_PORT, scheme: str = "http") -> list[AgentEndpoint]:
    """The DaemonSet's pods, by label, in the collector's namespace."""
    doc = api.get_json(f"/api/v1/namespaces/{namespace}/pods", [("labelSelector", selector)])
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise SourceError(f"pods in {namespace} ({selector}): no items list")
    return endpoints_from_pods([i for i in items if isinstance(i, dict)], port, scheme=scheme)


# --- the evidence document ------------------------------------------------------------------------

def _loss(v: object) -> float | None:
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return _f(v)


def _at(v: object) -> datetime | None:
    return parse_iso(v) if isinstance(v, str) else None


def _s(v: object) -> str | None:
    return v[:256] if isinstance(v, str) else None


def agent_source(node: str) -> str:
    """The `LogScan.source` of what a node's agent read: the agent, one string a node (the signal names
    the pod and container; a string per container was ~100 B each held, by the 100,000 at fleet size)."""
    return intern(f"agent:{node}")


def _quiet(c: Mapping[str, Any]) -> bool:
    """An entry with nothing but its line count and format (each list empty reads as none in `_scan`)."""
    return not (c.get("samples") or c.get("hangs") or c.get("xids") or c.get("resumes") or c.get("tokens")
                or c.get("diagnostics"))


def _format(c: Mapping[str, Any]) -> str | None:
    fmt = _s(c.get("format"))
    return intern(fmt) if fmt is not None else None  # (held by every sample of the container's history)


def quiet_scan(source: str, fmt: str | None, lines: int) -> LogScan:
    """The scan of a quiet container's entry (`_quiet`: its line count and format alone)."""
    return new_scan(source, fmt, (), (), (), (), lines)


def _samples(rows: list[Any], fmt: str | None) -> list[ProgressSample]:
    """An entry's `samples` rows as samples: [step, stamp, loss, skipped, total, line], a row without an
    integer step skipped."""
    samples = []
    total: int | None = None
    for row in rows:
        if not isinstance(row, list) or len(row) < 6 or _i(row[0]) is None:
            continue
        t = _i(row[4])
        if t != total:  # one object for a run of equal totals (the run's max steps, on every step line)
            total = t
        samples.append(new_sample(int(row[0]), _at(row[1]), _loss(row[2]), _i(row[5]) or 0, fmt or "regex",
                                  row[3] is True, total))
    return samples


def _plain(rows: list[Any], fmt: str) -> PackedSamples | None:
    """`_samples(rows, ...)` packed, where every row makes a plain sample (an integer step, line and total, a
    stamp, a number for a loss, not skipped: a trainer's steady lines), without building them: the pack
    `PackedSamples.pack` makes of those samples (tests/agent/test_plain_rows.py). None for any other rows."""
    packed = []
    base: datetime | None = None
    for row in rows:
        if type(row) is not list or len(row) < 6:
            return None
        step, text, loss, skipped, total, line = row[0], row[1], row[2], row[3], row[4], row[5]
        if (type(step) is not int or type(total) is not int or type(line) is not int or type(text) is not str
                or skipped is True):
            return None
        if type(loss) is not float and type(loss) is not int:  # (an integer packs as `_f`'s float)
            return None
        at = parse_iso(text)
        if at is None:
            return None
        if base is None:
            base = datetime(1970, 1, 1, tzinfo=at.tzinfo)
        elif at.tzinfo is not base.tzinfo:  # (parse_iso gives one UTC object: a pack keeps one zone)
            return None
        packed.append((step, (at - base) // US, loss, line, total, 1))
    return None if base is None else PackedSamples.plain(packed, base, fmt)


def _scan(c: Mapping[str, Any], source: str) -> LogScan:
    fmt = _format(c)
    if _quiet(c):  # (most of a pass's entries)
        return quiet_scan(source, fmt, _i(c.get("lines")) or 0)
    rows = _entries(c.get("samples"))
    samples: list[ProgressSample] | PackedSamples | None = _plain(rows, fmt or "regex")
    if samples is None:
        samples = _samples(rows, fmt)
    hangs = tuple(HangFinding(str(h.get("kind"))[:64], _i(h.get("line")) or 0, _s(h.get("collective")),
                              _i(h.get("timeout_ms")), _i(h.get("rank")), _at(h.get("at")),
                              seq=_i(h.get("seq")), completed=_i(h.get("completed")), pg=_s(h.get("pg")))
                  for h in _entries(c.get("hangs")) if isinstance(h, dict) and h.get("kind"))
    resumes = tuple(ResumeFinding(_i(r.get("line")) or 0, _at(r.get("at")), _i(r.get("step")),
                                  (_s(r.get("format")) or "")[:64])
                    for r in _entries(c.get("resumes"))[:MAX_FINDINGS] if isinstance(r, dict))
    xids = []
    for x in _entries(c.get("xids")):
        code = _i(x.get("code")) if isinstance(x, dict) else None
        if code is not None:
            meaning, action = describe(code)
            xids.append(XidFinding(code, _s(x.get("pci")) or "", _i(x.get("line")) or 0, meaning, action,
                                   _at(x.get("at"))))
    tok = c.get("tokens")
    tokens = None
    if isinstance(tok, list) and len(tok) == 2:
        per_gpu = _f(tok[0])
        if per_gpu is not None and 0 < per_gpu <= MAX_TPS:
            tokens = TokenRate(per_gpu, _at(tok[1]))
    return new_scan(source, fmt, samples if isinstance(samples, PackedSamples) else tuple(samples), hangs, tuple(xids),
                    tuple(str(d)[:500] for d in _entries(c.get("diagnostics"))[:10]), _i(c.get("lines")) or 0,
                    resumes, tokens)


def parse_evidence(doc: object, endpoint: AgentEndpoint, read_at: datetime) -> AgentReport:
    if not isinstance(doc, dict):
        raise AgentReadError(f"{endpoint.url}/evidence: not a JSON object")
    version = doc.get("version")
    if type(version) is not int or version not in READ_VERSIONS:
        raise AgentReadError(f"{endpoint.url}/evidence: version {version!r}, "
                             f"this controller reads {' and '.join(map(str, READ_VERSIONS))}")
    problems: list[str] = []
    # Names the controller holds between documents (the pods' GPU evidence, until the next one) are
    # interned: each document repeats them, and while a pass's evidence is decoded the last one is
    # still held (~1 KB a pod of 8 GPUs less at that peak; bench_fleet.py, variant live).
    raw_node = doc.get("node")  # (the endpoint's own string where it is the same: one per pod less)
    node = endpoint.node if type(raw_node) is str and raw_node == endpoint.node else _name(raw_node) or endpoint.node
    nv_doc, pr_doc = doc.get("nvml"), doc.get("podresources")
    nv: dict[str, Any] = nv_doc if isinstance(nv_doc, dict) else {}
    pr: dict[str, Any] = pr_doc if isinstance(pr_doc, dict) else {}
    gpu_ev = gpu_evidence(doc, version, node, read_at, f"{endpoint.url}/evidence", nv.get("state") == "ok", problems)
    logs: list[ContainerLogEvidence] = []
    quiet: list[QuietLog] = []
    where = agent_source(node)
    for c in _entries(doc.get("logs")):
        got = log_entry(c, where)
        if isinstance(got, ContainerLogEvidence):
            logs.append(got)
        elif got is not None:
            quiet.append(got)
    epoch, poll = doc.get("epoch"), _i(doc.get("poll"))
    cursor = (epoch, poll) if isinstance(epoch, str) and epoch and poll is not None and poll >= 0 else None
    return AgentReport(endpoint, read_at, str(nv.get("state") or ""), pr.get("up") is True, gpu_ev, tuple(logs),
                       tuple(problems), cursor, tuple(quiet), where)


def log_entry(c: object, source: str) -> ContainerLogEvidence | QuietLog | None:
    """One `logs` entry of a document: a quiet container's increment as a `QuietLog`, any other as its
    evidence; None for one that names no pod or container (skipped)."""
    key = _pod_key(c)
    if key is None:
        return None
    assert isinstance(c, dict)
    container = _name(c.get("container"))
    if container is None:
        return None
    ns, pod = key
    after = _i(c.get("after"))
    if after is not None and _quiet(c):
        return (ns, pod, container, _i(c.get("lines")) or 0, _format(c), after)
    return ContainerLogEvidence(ns, pod, container, _scan(c, source), after)


def decode_evidence(body: bytes, endpoint: AgentEndpoint, read_at: datetime, *, url: str = "") -> AgentReport:
    """An agent's `/evidence` body as the controller holds it: JSON (`AgentReadError` where it is not),
    then `parse_evidence`."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise AgentReadError(f"{url or endpoint.url + '/evidence'}: not JSON ({e})") from e
    return parse_evidence(doc, endpoint, read_at)


def fetch(url: str, *, connect_s: float, read_s: float, max_body: int, headers: Mapping[str, str] | None = None,
          context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> bytes:
    """The body of a 200 answer to `GET url` (http:// or, with `context`, https://), read on a
    connection of its own within `connect_s` + `read_s` in all and at most `max_body` bytes
    (`collector.sources.httpget`); AgentReadError naming the URL otherwise (refused, timed out, cut,
    another status, too large, chunked, a certificate that is not the agent's)."""
    try:
        answer = httpget.get(url, connect_s=connect_s, total_s=connect_s + read_s, max_body=max_body,
                             accept="application/json", headers=headers, context=context,
                             server_hostname=server_hostname)
    except httpget.HttpGetError as e:
        raise AgentReadError(str(e)) from e
    if answer.status != 200:
        raise AgentReadError(f"{url}: HTTP {answer.status}")
    return answer.body


def tls_context(ca_file: str | Path) -> ssl.SSLContext:
    """Agents' certificates checked against this CA bundle (TLS 1.2 or newer, host names checked)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class AgentReader:
    """Reads each agent's `/evidence` (bounded body, a total time bound per read).

    `token_file`: the agents' bearer token, read again at each pass (a rotated Secret is picked up)
    and sent only to the agents this reader was handed (the DaemonSet's pods, by IP). `context`:
    read over https, each certificate checked for `server_name` (default: the pod's IP)."""

    def __init__(self, now: Callable[[], datetime], *, timeout_s: float = 5.0, max_body: int = 32 << 20,
                 token_file: str | Path | None = None, context: ssl.SSLContext | None = None,
                 server_name: str | None = None) -> None:
        self.now = now
        self.connect_s = min(2.0, timeout_s)
        self.read_s = timeout_s
        self.max_body = max_body
        self.token_file = Path(token_file) if token_file else None
        self.context = context
        self.server_name = server_name or None
        self.scheme = "https" if context is not None else "http"
        self._headers: dict[str, str] | None = None
        # per agent (its URL), the cursor of the last document read: the next asks only for what came
        # after it (log increments; docs/agent.md). An agent that restarted answers whole.
        self._cursors: dict[str, tuple[str, int]] = {}

    def _url(self, endpoint: AgentEndpoint) -> str:
        query: dict[str, object] = {"version": EVIDENCE_VERSION}
        cursor = self._cursors.get(endpoint.url)
        if cursor is not None:
            query.update(epoch=cursor[0], poll=cursor[1])
        return f"{endpoint.url}/evidence?{urllib.parse.urlencode(query)}"

    @classmethod
    def from_settings(cls, now: Callable[[], datetime], *, token_file: str = "", ca_file: str = "",
                      server_name: str = "") -> AgentReader:
        """From `controller.agents` settings; a CA bundle that cannot be loaded fails here, at start."""
        return cls(now, token_file=token_file or None, context=tls_context(ca_file) if ca_file else None,
                   server_name=server_name or None)

    def _auth(self) -> None:
        """Read the token file (once a pass): an unreadable or empty one is every agent's error."""
        if self.token_file is None:
            self._headers = None
            return
        try:
            token = self.token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise AgentReadError(f"agent token file {self.token_file}: {type(e).__name__}") from e
        if not token or not token.isprintable() or len(token) > 4096:
            raise AgentReadError(f"agent token file {self.token_file}: empty or not one printable line")
        self._headers = {"Authorization": f"Bearer {token}"}

    def _fetch(self, url: str) -> bytes:
        return fetch(url, connect_s=self.connect_s, read_s=self.read_s, max_body=self.max_body,
                     headers=self._headers, context=self.context, server_hostname=self.server_name)

    def _parse(self, endpoint: AgentEndpoint, url: str, body: bytes) -> AgentReport:
        report = decode_evidence(body, endpoint, self.now(), url=url)
        if report.cursor is not None:
            self._cursors[endpoint.url] = report.cursor
        else:
            self._cursors.pop(endpoint.url, None)
        return report

    def read(self, endpoint: AgentEndpoint) -> AgentReport:
        self._auth()
        url = self._url(endpoint)
        return self._parse(endpoint, url, self._fetch(url))

    def forget(self, keep: Iterable[AgentEndpoint]) -> None:
        """Drop the cursors of agents no longer listed."""
        urls = {ep.url for ep in keep}
        for url in [u for u in self._cursors if u not in urls]:
            del self._cursors[url]

    def read_all(self, endpoints: Iterable[AgentEndpoint], *, workers: int = 16) -> tuple[list[AgentReport], list[str]]:
        """Every agent (`read_each`), in the endpoints' order: a pod two agents name gets the later one's."""
        done = sorted(self.read_each(endpoints, workers=workers), key=lambda x: x[0])
        reports = [r for _, r in done if isinstance(r, AgentReport)]
        errors = [r for _, r in done if isinstance(r, str)]
        return reports, errors

    def read_each(self, endpoints: Iterable[AgentEndpoint], *,
                  workers: int = 16) -> Iterator[tuple[int, AgentReport | str]]:
        """Every agent, `workers` fetching at a time (a fleet of nodes must fit in one poll interval)
        and this thread parsing, yielded as each is read: (its index in `endpoints`, the report or
        an error string). One that cannot be read is an error, never a stop; a caller that hands each
        report on as it comes never holds a whole pass's documents (a first pass carries every
        container's log)."""
        eps = list(endpoints)
        try:
            self._auth()
        except AgentReadError as e:
            for i in range(len(eps)):
                yield i, f"{eps[i].url}: {e}"
            return
        urls = [self._url(ep) for ep in eps]

        def one(url: str) -> bytes | str:
            try:
                return self._fetch(url)
            except AgentReadError as e:
                return str(e)

        n = max(1, min(workers, len(eps)))
        todo = iter(enumerate(zip(eps, urls, strict=True)))
        pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="agent-read")
        try:
            # At most 4 fetches a thread in flight or waiting to be parsed (not a whole pass's bodies),
            # parsed as they complete: a slow or dead agent holds one thread, never the others.
            in_flight: dict[Future[bytes | str], tuple[int, AgentEndpoint, str]] = {}
            while True:
                for i, (ep, url) in itertools.islice(todo, 4 * n - len(in_flight)):
                    in_flight[pool.submit(one, url)] = (i, ep, url)
                if not in_flight:
                    break
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for fut in finished:
                    i, ep, url = in_flight.pop(fut)
                    body = fut.result()
                    if isinstance(body, str):  # the fetch's error
                        yield i, body
                        continue
                    try:
                        report: AgentReport | str = self._parse(ep, url, body)
                    except AgentReadError as e:
                        report = str(e)
                    except Exception as e:  # a document this reader did not foresee: that agent's error, not the pass's
                        report = f"{url}: unreadable document ({type(e).__name__}: {str(e)[:200]})"
                    del body
                    yield i, report
        finally:
            # A caller that stops early (shutdown) does not wait for the fetches still out: each
            # ends within its own time bound on its thread.
            pool.shutdown(wait=False, cancel_futures=True)
