"""The node agent: NVML sampler, XIDs, pod-resources attribution and node-local log evidence,
served as `/metrics`, `/healthz`, `/readyz` and `/evidence` (JSON).

Each source runs on its own thread and keeps its latest answer; scrapes and evidence reads only
render what is there (never a call to NVML or the kubelet per scrape). A missing NVML, kubelet
socket, kernel log or log directory is a status, and the agent keeps serving what it has.

`/evidence` holds every tenant's pods, progress and losses on the node, so it is served like the
controller's endpoints (`collector.endpoints`): bounded threads and time per client, probes on
workers of their own, a bearer token for `/metrics` and `/evidence`, optional TLS. An address
beyond loopback without a token is refused unless explicitly allowed (docs/security.md).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
import urllib.parse
from dataclasses import replace
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest

from collector.agent.draslices import ResourceSliceReader
from collector.agent.evidence import (
    VERSION,
    VERSION_COLUMNS,
    VERSION_CONTROLLER,
    VERSION_PACKED,
    Snapshot,
    evidence_document,
)
from collector.agent.hang import HangHints
from collector.agent.logs import LogEvidence
from collector.agent.metrics import AgentCollector, AgentHealth
from collector.agent.nvml import GpuReading, NvmlLib, NvmlSampler, XidEventThread
from collector.agent.podresources import AttributionCache, DraResolver, PodResourcesClient
from collector.agent.settings import AgentSettings
from collector.agent.xids import KmsgReader, XidCounter
from collector.endpoints import Answer, BoundedHTTPServer, HttpOptions, WithQuery
from collector.endpoints import serve as serve_http

log = logging.getLogger("taugrid.agent")


class Agent:
    def __init__(self, settings: AgentSettings, *, nv: NvmlLib | None = None, expose: bool = True) -> None:
        self.s = settings
        self.sampler = NvmlSampler(nv, retry_s=settings.nvml_retry_s)
        self.xids = XidCounter(pci_to_uuid=self.sampler.pci_to_uuid)
        self.hangs = HangHints(settings.hang)
        self.slices = (ResourceSliceReader(settings.api_server, settings.node, drivers=settings.dra_drivers,
                                           token_file=settings.api_token_file, ca_file=settings.api_ca_file,
                                           interval_s=settings.resource_slices_interval_s)
                       if settings.api_server else None)
        self.dra = DraResolver(self.sampler.minor_to_uuid, self.slices, self.sampler.mig_placements)
        self.attribution = AttributionCache(
            PodResourcesClient(settings.podresources_socket, timeout_s=settings.podresources_timeout_s,
                               node=settings.node),
            interval_s=settings.podresources_interval_s, max_age_s=settings.podresources_max_age_s,
            prefixes=settings.gpu_resource_prefixes, drivers=settings.dra_drivers, resolver=self.dra)
        self.kmsg = KmsgReader(settings.kmsg_path, self.xids) if settings.kmsg_path is not None else None
        self.xid_events = XidEventThread(
            self.sampler, lambda uuid, code: self.xids.add(code, uuid=uuid, origin="nvml"))
        state = settings.state_dir / "log-offsets.json" if settings.state_dir is not None else None
        self.logs = LogEvidence(settings.logs, wanted=self.attribution.pods, state_file=state)
        self._gpus: tuple[GpuReading, ...] = ()
        self.sample_seconds = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: BoundedHTTPServer | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        if expose:
            health = AgentHealth()
            health.nvml_errors = lambda: self.sampler.errors + self.xid_events.errors
            health.podresources_errors = lambda: self.attribution.errors
            health.kmsg = lambda: ((self.kmsg.up, self.kmsg.records, self.kmsg.malformed) if self.kmsg
                                   else (False, 0, 0))
            health.logs = lambda: (self.logs.followed, self.logs.lines_total, dict(self.logs.problems))
            health.sample_seconds = lambda: self.sample_seconds
            health.xid_counts = self.xids.counts
            health.podresources_rejected = lambda: dict(self.attribution.rejected)
            health.dra_unresolved = lambda: self.dra.unresolved
            self.registry.register(AgentCollector(lambda: self.snapshot(logs=False), health))  # no log state

    # --- lifecycle -------------------------------------------------------------------------------
    def open(self) -> None:
        status = self.sampler.open()
        if status.state == "ok":
            log.info("NVML initialized", extra={"driver": status.driver})
        else:
            log.warning(status.message, extra={"nvml": status.state})
        self._spawn(self._sample_loop, "nvml-sampler")
        if self.s.xid_events:
            self.xid_events.start()
        self.attribution.start()
        if self.kmsg is not None:
            self.kmsg.start()
        self.logs.start()

    def close(self) -> None:
        self._stop.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        self.xid_events.stop()
        if self.kmsg is not None:
            self.kmsg.stop()
        self.logs.stop()
        self.attribution.stop()
        for t in self._threads:
            t.join(5)
        self.sampler.close()

    def __enter__(self) -> Agent:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, target: Any, name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _sample_loop(self) -> None:
        interval = self.s.sample_interval_s
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow NVML call): skip ticks rather than burst
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def sample_once(self) -> tuple[GpuReading, ...]:
        t0 = time.perf_counter()
        try:
            gpus = self.sampler.sample()
        except Exception:  # a stand-in or driver doing something unexpected: keep the loop alive
            log.exception("NVML sampling failed")
            self.sampler.errors += 1
            gpus = ()
        self.hangs.update(gpus)
        self._gpus = gpus
        self.samples += 1
        self.sample_seconds = time.perf_counter() - t0
        return gpus

    # --- state -----------------------------------------------------------------------------------
    def snapshot(self, *, epoch: str = "", poll: int | None = None, logs: bool = True) -> Snapshot:
        """`epoch`/`poll`: a reader's cursor (the document it read last): containers carry their line
        count at that poll, so the document holds only what came after (`evidence_document`).
        `logs=False`: no containers (what /metrics renders has none; each one's scan is not built)."""
        gpus = self._gpus
        since = {r.uuid: t for r in gpus if (t := self.hangs.since(r.uuid)) is not None}
        log_poll = self.logs.polls  # before the containers: a poll in flight is sent again, never skipped
        if epoch != self.logs.epoch:
            poll = None
        return Snapshot(
            node=self.s.node, at=time.time(), nvml=self.sampler.status, gpus=gpus, hang_since=since,
            hang_sustain_s=self.s.hang.sustain_s, allocations=self.attribution.allocations(),
            podresources_up=self.attribution.up, podresources_last_success=self.attribution.last_success,
            podresources_error=self.attribution.error, xids=tuple(self.xids.recent()),
            logs=tuple(self.logs.containers(since=poll)) if logs else (), log_epoch=self.logs.epoch,
            log_poll=log_poll,
            xid_first_seen=self.xids.first_seen(),
        )

    @property
    def ready(self) -> bool:
        """Sampled once (or NVML is known absent) and the log directory polled once."""
        return self.samples > 0 and self.logs.polls > 0

    def healthy(self) -> tuple[bool, str]:
        dead = [t.name for t in self._threads if not t.is_alive()]
        if not self.logs.alive():
            dead.append("pod-logs")
        return (not dead, "ok" if not dead else "stopped: " + ", ".join(dead))

    def status(self) -> dict[str, object]:
        """Why each source is or is not contributing (served at /healthz?verbose and logged at start)."""
        return {
            "nvml": self.sampler.status.message,
            "podresources": self.attribution.error or ("ok" if self.attribution.up else "not yet listed"),
            "dra": (f"{self.dra.unresolved} claim devices without a GPU UUID" if self.dra.unresolved else "ok")
                   + (f"; ResourceSlices: {self.slices.status}" if self.slices is not None
                      else "; ResourceSlices: off (--resource-slices)"),
            "kmsg": (self.kmsg.error or "ok") if self.kmsg is not None else "off",
            "logs": self.logs.error or f"{self.logs.followed} containers followed",
        }

    # --- HTTP ------------------------------------------------------------------------------------
    PROTECTED = frozenset({"/metrics", "/evidence"})

    def serve(self, host: str, port: int, options: HttpOptions | None = None) -> int:
        """Serve on host:port (0: any free port); returns the bound port. `/metrics` and `/evidence`
        need the token of `options.token_file` when one is set; the probes never do."""
        opts = replace(options or HttpOptions(), protected=self.PROTECTED)

        def metrics() -> Answer:
            return 200, "text/plain; version=0.0.4", generate_latest(self.registry)

        def evidence(query: str) -> Answer:
            args = urllib.parse.parse_qs(query, max_num_fields=4)
            # the newest version it knows of those asked (`?version=5,4`: a reader of a later release
            # names the ones it also reads, and an agent of this one answers 4), else version 1
            asked = {x for a in args.get("version") or () for x in a.split(",", 8)[:8]}
            version = next((v for v in (VERSION_PACKED, VERSION_CONTROLLER, VERSION_COLUMNS) if str(v) in asked),
                           VERSION)
            return 200, "application/json", orjson.dumps(
                evidence_document(self.snapshot(**_cursor(args)), version=version))

        def healthz(query: str) -> Answer:
            ok, why = self.healthy()
            text = why + "\n"
            if "verbose" in query:
                text += "".join(f"{k}: {v}\n" for k, v in self.status().items())
            return 200 if ok else 500, "text/plain", text.encode()

        def readyz() -> Answer:
            ok = self.ready
            return 200 if ok else 503, "text/plain", b"ok\n" if ok else b"not yet sampled\n"

        self._http = serve_http(host, port, {"/metrics": metrics, "/evidence": WithQuery(evidence),
                                             "/healthz": WithQuery(healthz), "/readyz": readyz}, opts)
        self._spawn(self._http.serve_forever, "agent-http")
        return int(self._http.server_address[1])


def exposure_problem(settings: AgentSettings) -> str:
    """Why the agent must not serve as configured ("" when it may): `/evidence` beyond loopback
    without a token hands every tenant's evidence on the node to any pod that can connect."""
    host, _, _ = settings.address.rpartition(":")
    host = host.strip("[]")
    try:  # an empty host serves on 127.0.0.1 (run_agent), as the controller's `:PORT` does
        loopback = host in ("", "localhost") or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback or settings.token_file is not None or settings.allow_unauthenticated:
        return ""
    return (f"--address {settings.address} is reachable beyond this node's loopback and no --token-file is set: "
            "/evidence would hand every pod's evidence to anyone who connects (set --token-file, "
            "or --allow-unauthenticated where a NetworkPolicy alone guards it)")


def _cursor(args: dict[str, list[str]]) -> dict[str, Any]:
    """`epoch=E&poll=P` → snapshot arguments (anything else: a whole document)."""
    epoch, poll = (args.get("epoch") or [""])[0], (args.get("poll") or [""])[0]
    if not epoch or not poll.isdigit() or len(poll) > 18:
        return {}
    return {"epoch": epoch, "poll": int(poll)}


def run_agent(settings: AgentSettings, stop: threading.Event) -> int:
    """The `agent` command: serve until `stop` is set. Raises ValueError for an exposure that
    `exposure_problem` refuses, OSError/ValueError for a busy port or unusable TLS or token files."""
    problem = exposure_problem(settings)
    if problem:
        raise ValueError(problem)
    host, _, port = settings.address.rpartition(":")
    options = HttpOptions(token_file=settings.token_file, tls_cert_file=settings.tls_cert_file,
                          tls_key_file=settings.tls_key_file)
    with Agent(settings) as agent:
        bound = agent.serve(host.strip("[]") or "127.0.0.1", int(port), options)
        log.info("agent serving", extra={"address": f"{host}:{bound}", "token": settings.token_file is not None,
                                         "tls": settings.tls_cert_file is not None, **agent.status()})
        stop.wait()
    return 0
