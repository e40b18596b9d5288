"""Controller side of the node agents: find the DaemonSet's pods, read their `/evidence`, and turn it
into per-pod GPU evidence (`collector.gpu`) and per-container log scans (`collector.progress`).

Each read is stamped with the reader's clock (`read_at`), never the agent's: freshness is judged on
one clock. A document of another version, or fields of the wrong type, are named and skipped.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import urllib3

from collector.gpu import GpuDevice, PodGpuEvidence
from collector.progress.model import HangFinding, LogScan, ProgressSample, XidFinding
from collector.progress.timestamps import parse_iso
from collector.progress.xid import describe
from collector.sources.kube_api import KubeApi, SourceError

EVIDENCE_VERSION = 1
DEFAULT_SELECTOR = "app.kubernetes.io/name=taugrid-evidence,app.kubernetes.io/component=agent"
DEFAULT_PORT = 9402


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

    def log_pods(self) -> set[tuple[str, str]]:
        """(namespace, pod) whose logs this agent reads: the controller need not poll their logs."""
        return {(c.namespace, c.pod) for c in self.logs}


def endpoints_from_pods(pods: Iterable[Mapping[str, Any]], port: int = DEFAULT_PORT) -> list[AgentEndpoint]:
    """Running, addressed agent pods → endpoints (one per node; the newest pod wins a tie)."""
    out: dict[str, AgentEndpoint] = {}
    for p in pods:
        status = p.get("status") or {}
        spec = p.get("spec") or {}
        meta = p.get("metadata") or {}
        ip, node = status.get("podIP"), spec.get("nodeName")
        if status.get("phase") != "Running" or not isinstance(ip, str) or not ip or not isinstance(node, str):
            continue
        host = f"[{ip}]" if ":" in ip else ip
        out[node] = AgentEndpoint(node, str(meta.get("name") or ""), f"http://{host}:{port}")
    return [out[k] for k in sorted(out)]


def discover_agents(api: KubeApi, namespace: str, *, selector: str = DEFAULT_SELECTOR,
                    port: int = DEFAULT_PORT) -> list[AgentEndpoint]:
    """The DaemonSet's pods, by label, in the collector's namespace."""
    doc = api.get_json(f"/api/v1/namespaces/{namespace}/pods", [("labelSelector", selector)])
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise SourceError(f"pods in {namespace} ({selector}): no items list")
    return endpoints_from_pods([i for i in items if isinstance(i, dict)], port)


# --- the evidence document ------------------------------------------------------------------------

def _f(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _loss(v: object) -> float | None:
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return _f(v)


def _at(v: object) -> datetime | None:
    return parse_iso(v) if isinstance(v, str) else None


def _i(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _scan(c: Mapping[str, Any], source: str) -> LogScan:
    samples = []
    for row in c.get("samples") or []:
        if not isinstance(row, list) or len(row) < 6 or _i(row[0]) is None:
            continue
        samples.append(ProgressSample(step=int(row[0]), at=_at(row[1]), loss=_loss(row[2]), line=_i(row[5]) or 0,
                                      format=str(c.get("format") or "regex"), skipped=bool(row[3]),
                                      total=_i(row[4])))
    hangs = tuple(HangFinding(str(h.get("kind")), _i(h.get("line")) or 0, h.get("collective"),
                              _i(h.get("timeout_ms")), _i(h.get("rank")), _at(h.get("at")))
                  for h in c.get("hangs") or [] if isinstance(h, dict) and h.get("kind"))
    xids = []
    for x in c.get("xids") or []:
        code = _i(x.get("code")) if isinstance(x, dict) else None
        if code is not None:
            meaning, action = describe(code)
            xids.append(XidFinding(code, str(x.get("pci") or ""), _i(x.get("line")) or 0, meaning, action,
                                   _at(x.get("at"))))
    fmt = c.get("format")
    return LogScan(source=source, format=fmt if isinstance(fmt, str) else None, samples=tuple(samples),
                   hangs=hangs, xids=tuple(xids),
                   diagnostics=tuple(str(d) for d in c.get("diagnostics") or [])[:10], lines=_i(c.get("lines")) or 0)


def parse_evidence(doc: object, endpoint: AgentEndpoint, read_at: datetime) -> AgentReport:
    if not isinstance(doc, dict):
        raise AgentReadError(f"{endpoint.url}/evidence: not a JSON object")
    if doc.get("version") != EVIDENCE_VERSION:
        raise AgentReadError(f"{endpoint.url}/evidence: version {doc.get('version')!r}, "
                             f"this controller reads {EVIDENCE_VERSION}")
    problems: list[str] = []
    node = str(doc.get("node") or endpoint.node)
    nv_doc, pr_doc = doc.get("nvml"), doc.get("podresources")
    nv: dict[str, Any] = nv_doc if isinstance(nv_doc, dict) else {}
    pr: dict[str, Any] = pr_doc if isinstance(pr_doc, dict) else {}
    xids_by_uuid: dict[str, set[int]] = {}
    for x in doc.get("xids") or []:
        if isinstance(x, dict) and isinstance(x.get("uuid"), str) and _i(x.get("code")) is not None:
            xids_by_uuid.setdefault(x["uuid"], set()).add(x["code"])
    pods: dict[tuple[str, str], tuple[list[GpuDevice], set[str]]] = {}
    gpus = doc.get("gpus") or []
    for g in gpus if isinstance(gpus, list) else []:
        if not isinstance(g, dict) or not isinstance(g.get("uuid"), str):
            problems.append(f"{endpoint.url}/evidence: a GPU entry without a uuid skipped")
            continue
        dev = GpuDevice(uuid=g["uuid"], index=_i(g.get("index")), utilization=_f(g.get("utilization")),
                        sm_active=_f(g.get("sm_active")), power_w=_f(g.get("power_w")),
                        power_limit_w=_f(g.get("power_limit_w")), lost=g.get("lost") is True,
                        hang_hint=g.get("hang_hint") is True, xids=tuple(sorted(xids_by_uuid.get(g["uuid"], ()))))
        for p in g.get("pods") or []:
            if isinstance(p, dict) and p.get("pod"):
                devs, containers = pods.setdefault((str(p.get("namespace") or ""), str(p["pod"])), ([], set()))
                devs.append(dev)
                containers.add(str(p.get("container") or ""))
    # Devices the kubelet allocated that NVML does not list (a GPU gone entirely) still count as held.
    listed = {d.uuid for devs, _ in pods.values() for d in devs}
    for a in doc.get("allocations") or []:
        if isinstance(a, dict) and a.get("pod") and isinstance(a.get("device"), str) and a["device"] not in listed:
            devs, containers = pods.setdefault((str(a.get("namespace") or ""), str(a["pod"])), ([], set()))
            devs.append(GpuDevice(uuid=a["device"], lost=nv.get("state") == "ok"))
            containers.add(str(a.get("container") or ""))
    gpu_ev = tuple(PodGpuEvidence(ns, pod, node, "agent", read_at, tuple(devs), tuple(sorted(c for c in cs if c)))
                   for (ns, pod), (devs, cs) in sorted(pods.items()))
    logs = []
    for c in doc.get("logs") or []:
        if not isinstance(c, dict) or not c.get("pod") or not c.get("container"):
            continue
        ns, pod, container = str(c.get("namespace") or ""), str(c["pod"]), str(c["container"])
        logs.append(ContainerLogEvidence(ns, pod, container, _scan(c, f"agent:{node}:{ns}/{pod}/{container}"),
                                         _i(c.get("after"))))
    epoch, poll = doc.get("epoch"), _i(doc.get("poll"))
    cursor = (epoch, poll) if isinstance(epoch, str) and epoch and poll is not None and poll >= 0 else None
    return AgentReport(endpoint, read_at, str(nv.get("state") or ""), pr.get("up") is True, gpu_ev, tuple(logs),
                       tuple(problems), cursor)


class AgentReader:
    """Reads each agent's `/evidence` (bounded body, short timeouts)."""

    def __init__(self, now: Callable[[], datetime], *, timeout_s: float = 5.0, max_body: int = 32 << 20,
                 pool: urllib3.PoolManager | None = None) -> None:
        self.now = now
        self.timeout = urllib3.Timeout(connect=min(2.0, timeout_s), read=timeout_s)
        self.max_body = max_body
        self.pool = pool or urllib3.PoolManager(num_pools=1024, maxsize=2)
        # per agent (its URL), the cursor of the last document read: the next asks only for what came
        # after it (log increments; docs/agent.md). An agent that restarted answers whole.
        self._cursors: dict[str, tuple[str, int]] = {}

    def read(self, endpoint: AgentEndpoint) -> AgentReport:
        url = f"{endpoint.url}/evidence"
        cursor = self._cursors.get(endpoint.url)
        if cursor is not None:
            url += "?" + urllib.parse.urlencode({"epoch": cursor[0], "poll": cursor[1]})
        try:
            resp = self.pool.request("GET", url, timeout=self.timeout, retries=False, preload_content=False,
                                     redirect=False)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise AgentReadError(f"{url}: {type(e).__name__}: {e}") from e
        try:
            body = resp.read(self.max_body + 1)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise AgentReadError(f"{url}: body cut: {e}") from e
        finally:
            resp.release_conn()
        if resp.status != 200:
            raise AgentReadError(f"{url}: HTTP {resp.status}")
        if len(body) > self.max_body:
            raise AgentReadError(f"{url}: body over the {self.max_body:,} byte limit")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise AgentReadError(f"{url}: not JSON ({e})") from e
        report = parse_evidence(doc, endpoint, self.now())
        if report.cursor is not None:
            self._cursors[endpoint.url] = report.cursor
        else:
            self._cursors.pop(endpoint.url, None)
        return report

    def forget(self, keep: Iterable[AgentEndpoint]) -> None:
        """Drop the cursors of agents no longer listed."""
        urls = {ep.url for ep in keep}
        for url in [u for u in self._cursors if u not in urls]:
            del self._cursors[url]

    def read_all(self, endpoints: Iterable[AgentEndpoint], *, workers: int = 16) -> tuple[list[AgentReport], list[str]]:
        """Every agent, `workers` at a time (a fleet of nodes must fit in one poll interval); one that
        cannot be read is an error string, never a stop."""
        eps = list(endpoints)

        def one(ep: AgentEndpoint) -> AgentReport | str:
            try:
                return self.read(ep)
            except AgentReadError as e:
                return str(e)

        if len(eps) <= 1:
            results = [one(ep) for ep in eps]
        else:
            with ThreadPoolExecutor(max_workers=min(workers, len(eps)), thread_name_prefix="agent-read") as pool:
                results = list(pool.map(one, eps))
        return [r for r in results if isinstance(r, AgentReport)], [r for r in results if isinstance(r, str)]
