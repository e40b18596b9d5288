"""Node agents' evidence (GPU readings by pod, parsed container logs) and dcgm-exporters, read in
one pass every `agents.poll_interval`: the first at once, since the API log source waits for it.

A pass reaches the loop agent by agent, each document's GPU records as it is read (`NodePart`,
"gpu-node"), then its end (`PassEnd`, "gpu": dcgm-exporters' records, pods and nodes no agent
reported any more go). Each pod's record is replaced as its agent's document comes, so a pass never
holds the fleet's records twice (the whole pass handed at once did: 116 MiB more at 150k pods, the
peak past 1 GiB; issue 30)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from collector.correlate import Key, Signal
from collector.gpu import PodGpuEvidence, held_state, same_held_bytes, sampled
from collector.model import Observed, Ref, RunClaims
from collector.planes.base import SCAN_WEIGHT, Change, PolledSource, SourceContext, SourceState, log_weight
from collector.sources.agents import AgentReader, AgentReport, discover_agents
from collector.sources.dcgm import DcgmError, pod_evidence, read_dcgm
from collector.sources.kube_api import SourceError
from exporters.adx.rows import GpuSample, GpuXid
from exporters.prometheus_health import ErrorClass

__all__ = ["AgentSource", "GpuPass", "NodePart", "PassEnd", "gpu_records", "log_changes", "pass_changes",
           "runs_changed", "runs_not_progressing", "same_devices"]

log = logging.getLogger("taugrid.controller")

GpuByPod = Mapping[tuple[str, str], PodGpuEvidence]
_PASSES = itertools.count(1)  # (a pass's number: a part of a pass cut short is never taken for the next's)


@dataclass(frozen=True, slots=True)
class NodePart:
    """One agent's document's GPU records in a pass ("gpu-node"): `order` is its endpoint's place in the
    pass (a pod two agents name is the later one's, whichever document came first); `read_at` None:
    records for a node no agent read (they count for nothing fresh)."""

    pass_id: int
    order: int
    node: str
    read_at: datetime | None
    gpus: tuple[PodGpuEvidence, ...]


@dataclass(frozen=True, slots=True)
class PassEnd:
    """A pass's end ("gpu"): the dcgm-exporters' records (for pods no agent reported) and their nodes,
    and the pods whose logs an agent read."""

    pass_id: int
    dcgm_nodes: Mapping[str, datetime]
    dcgm: tuple[PodGpuEvidence, ...]
    log_pods: frozenset[tuple[str, str]]


@dataclass(slots=True)
class GpuPass:
    """The loop's account of a pass in progress (`changes.ChangeApplier._gpu_part`): each pod named so
    far and the place in the pass of the part that named it, each node read and when, and with a record
    sink, each node's pods (the next pass's exports read the XIDs they reported)."""

    pass_id: int
    seen: dict[tuple[str, str], int] = field(default_factory=dict)
    nodes: dict[str, datetime] = field(default_factory=dict)
    node_pods: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)


def pass_changes(gpus: GpuByPod, nodes: Mapping[str, datetime],
                 log_pods: frozenset[tuple[str, str]] = frozenset()) -> list[Change]:
    """A whole pass held at once (`gpus` by pod, `nodes`: each agent's read time) as the loop takes it:
    one part a node, in `nodes`' order then the records' own nodes', and the end (tests, benches)."""
    pid = next(_PASSES)
    by_node: dict[str, list[PodGpuEvidence]] = {n: [] for n in nodes}
    for g in gpus.values():
        by_node.setdefault(g.node, []).append(g)
    out = [Change("gpu-node", None, NodePart(pid, i, node, nodes.get(node), tuple(recs)))
           for i, (node, recs) in enumerate(by_node.items())]
    out.append(Change("gpu", None, PassEnd(pid, {}, (), log_pods)))
    return out


class AgentSource(PolledSource):
    """The `agents` source: thread `agent-poller`."""

    name = "agents"
    thread = "agent-poller"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.settings.controller.agents
        self.state = SourceState(self.name, ctx.health, pass_gauge=True)

    @classmethod
    def build(cls, ctx: SourceContext) -> AgentSource | None:
        return cls(ctx) if ctx.settings.controller.agents.poll_interval.total_seconds() > 0 else None

    def run(self) -> None:
        ctx, cfg, loop, stop = self.ctx, self.cfg, self.ctx.loop, self.ctx.stop
        reader = AgentReader.from_settings(ctx.now, token_file=cfg.token_file, ca_file=cfg.ca_file,
                                           server_name=cfg.server_name)
        namespace = cfg.namespace or ctx.settings.controller.lease_namespace or "default"
        interval = cfg.poll_interval.total_seconds()
        wait = 0.0  # the first pass at once: the API log poller waits for it
        while not stop.wait(wait):
            started = time.monotonic()
            pid = next(_PASSES)
            dcgm_nodes: dict[str, datetime] = {}
            dcgm: dict[tuple[str, str], PodGpuEvidence] = {}
            log_pods: set[tuple[str, str]] = set()
            try:
                endpoints = discover_agents(ctx.api, namespace, selector=cfg.selector, port=cfg.port,
                                            scheme=reader.scheme)
            except SourceError as e:
                self.state.error(ErrorClass.RETRYABLE if e.retryable else ErrorClass.PERMANENT, str(e))
                endpoints = []
            # Each agent's logs and GPU records are handed on as its document is read (a first pass
            # carries every container's log; a pass, every GPU pod's records: neither held whole).
            for i, rep in reader.read_each(endpoints):
                if stop.is_set():
                    break  # (the reads still out end on their own)
                if isinstance(rep, str):
                    self.state.error(ErrorClass.RETRYABLE, rep)
                    log.warning("node agent not read", extra={"error": rep})
                    continue
                loop.put_logs(log_changes(rep))
                log_pods |= rep.log_pods()
                loop.put(Change("gpu-node", None, NodePart(pid, i, rep.endpoint.node, rep.read_at, rep.gpus)))
            reader.forget(endpoints)
            for node, url in sorted(cfg.dcgm.items()):
                try:
                    scrape = read_dcgm(url)
                except DcgmError as e:
                    self.state.error(ErrorClass.RETRYABLE, str(e))
                    log.warning("dcgm-exporter not read", extra={"error": str(e)})
                    continue
                at = ctx.now()
                dcgm_nodes.setdefault(node, at)
                for g in pod_evidence(scrape, node=node, read_at=at):
                    dcgm.setdefault((g.namespace, g.pod), g)  # (an agent's answer wins: the loop's)
            loop.put(Change("gpu", None, PassEnd(pid, dcgm_nodes, tuple(dcgm.values()), frozenset(log_pods))))
            took = time.monotonic() - started
            self.state.passed(took)
            wait = max(0.0, interval - took)  # from the start of the pass before


def log_changes(rep: AgentReport) -> Iterator[tuple[Change, int]]:
    """The loop's changes for a document's container logs, each with its weight in the log backlog
    (`log_weight`): `"agent-quiet"` (the read time, the scans' source and up to QUIET_CHUNK quiet
    containers: `sources.agents.QuietLog`), each weighing what its scan would, then `"agent-log"` (the
    signal, and the line the increment starts after) for each with something to say. A pod's containers
    share one `Ref` (while queued: a pass's containers wait in the log backlog).

    Quiet first: a quiet container read again past half the evidence age marks its run before the run's
    confirming increments are judged, which then see it marked and schedule no deferral
    (`ChangeApplier._deferred`) for a run evaluated now anyway. The marks, the signals and the claims do
    not depend on the order (a refresh and an increment touch different signals; marks are a set)."""
    quiet = rep.quiet
    for i in range(0, len(quiet), QUIET_CHUNK):
        part = quiet[i:i + QUIET_CHUNK]
        yield Change("agent-quiet", None, (rep.read_at, rep.source, part)), SCAN_WEIGHT * len(part)
    refs: dict[tuple[str, str], Ref] = {}
    for c in rep.logs:
        ref = refs.get((c.namespace, c.pod))
        if ref is None:
            ref = refs[(c.namespace, c.pod)] = Ref("Pod", c.namespace, c.pod)
        yield Change("agent-log", None, (Signal(ref, c.container, c.scan, rep.read_at), c.after)), log_weight(c.scan)


# Quiet containers one `"agent-quiet"` change carries at most (a node's, most often: a change is applied
# whole between two reads of the loop's queue); each weighs SCAN_WEIGHT in the log backlog.
QUIET_CHUNK = 1000


def runs_changed(old: GpuByPod, new: GpuByPod, root_of: Callable[[Ref], Ref | None],
                 claims: Mapping[Key, RunClaims], dirty: set[Key]) -> set[Key]:
    """The evaluated runs (not already in `dirty`) of the pods of `new` whose devices changed from `old`
    (came, or moved state: `same_devices`): a part of a pass at a time (each agent's document as it is
    read), and a pass's pods gone at its end (`new` the gone, `old` empty).

    Readings alone (utilization, power, clocks) never change what a claim observes: they word a stalled
    run's reason (busy but cold, idle) and the GPU comparison's notes. A progressing run whose pods'
    devices stayed is left: its claims do not say them (its GPU spread's notes do, and a suspect once
    the run is slower: its next evaluation reads them, and a log increment showing a slower pace is
    evaluated at once, `planes.signals.alone`); it is re-evaluated when its evidence would age out
    (`Clock.within`). A run not evaluated yet (new, or kept out by a cap) reads the pass when it is.
    Pod by pod, each pod's run, this was a tenth of the loop at 50k pods (issue 30)."""
    out: set[Key] = set()
    for (ns, pod), g in new.items():
        was = old.get((ns, pod))
        if was is not None and same_devices(was, g):
            continue
        root = root_of(Ref("Pod", ns, pod))
        if root is not None and root.key not in dirty and root.key in claims:
            out.add(root.key)
    return out


def runs_not_progressing(held: Callable[[tuple[str, str]], bool],
                         member_pods: Callable[[Key], Iterable[tuple[str, str]]], claims: Mapping[Key, RunClaims],
                         dirty: set[Key], *, now: datetime | None = None,
                         every: timedelta = timedelta(0)) -> set[Key]:
    """At a pass's end, the evaluated runs (not in `dirty`) not progressing with any of their pods
    (`member_pods`: those its evaluation reads) `held` (in the pass or the one before), last evaluated
    `every` or longer before `now` (`claims.confirm_refresh`; 0: on every pass). Such a run is evaluated
    on each of its log increments anyway; a pass re-evaluating every such run as well had a fleet that
    had not shown progress yet (a start at 150k pods, 10,000 runs) evaluate 10,000 runs a pass on top
    of their increments (one of the loads that saturated its loop). Their wording lags readings by at
    most `every`, as a progressing run's notes do."""
    since = now - every if now is not None and every > timedelta(0) else None
    return {key for key, rc in claims.items()
            if rc.progressing.observed is not Observed.TRUE and key not in dirty
            and (since is None or rc.evaluated_at <= since) and any(held(p) for p in member_pods(key))}


def same_devices(a: PodGpuEvidence, b: PodGpuEvidence) -> bool:
    """The same devices in the same state for the claims (`claims.gpu.apply_gpu`): held, lost, hang
    hint, XIDs, row remaps; readings (utilization, power) and the read time aside."""
    if not (a.node == b.node and a.source == b.source and a.containers == b.containers):
        return False
    if same_held_bytes(a, b):  # (every pod on every pass: the bytes, before any value is built)
        return True
    sa, sb = held_state(a), held_state(b)  # (from the packed records)
    if sa is not None and sb is not None:
        return sa == sb
    return (len(a.devices) == len(b.devices)
            and all((x.uuid, x.index, x.lost, x.hang_hint, x.xids, x.mig_profile, x.remap_pending, x.remap_failed,
                     x.ecc_uncorrected)
                    == (y.uuid, y.index, y.lost, y.hang_hint, y.xids, y.mig_profile, y.remap_pending, y.remap_failed,
                        y.ecc_uncorrected)
                    for x, y in zip(a.devices, b.devices, strict=True)))


def gpu_records(old: GpuByPod, new: GpuByPod, run_of: Callable[[Ref], Ref | None],
                ) -> tuple[list[GpuSample], list[GpuXid]]:
    """A pass of GPU evidence as ADX records: one reading per device (a shared GPU once, under the
    first pod that holds it) and one XID record per code a device reports that it did not report in
    the pass before (the agents send the codes seen recently, not each event: a code is recorded
    when it appears, stamped when the agent first saw it, else with the pass that saw it)."""
    before: dict[tuple[str, str], set[int]] = {}
    for g in old.values():  # (every pod, every pass: read from the packed records, no device built)
        for u, _, _, _, codes, _ in sampled(g):
            before.setdefault((g.node, u), set()).update(codes)
    samples: list[GpuSample] = []
    xids: list[GpuXid] = []
    seen: set[tuple[str, str]] = set()
    for (ns, pod), g in sorted(new.items()):
        root = run_of(Ref("Pod", ns, pod))
        run = root.name if root is not None else ""
        for u, index, util, power, codes, xid_ages in sampled(g):
            key = (g.node, u)
            if key in seen:
                continue
            seen.add(key)
            samples.append(GpuSample(g.read_at, g.node, index if index is not None else -1, u,
                                     None if util is None else round(util * 100.0, 3), None, power, None, ns, pod,
                                     run))
            new_codes = sorted(set(codes) - before.get(key, set()))
            ages = dict(xid_ages) if new_codes else {}
            xids += [GpuXid(g.read_at - timedelta(seconds=ages.get(code, 0.0)), g.node, code, index, u,
                            namespace=ns, pod=pod, run=run) for code in new_codes]
    return samples, xids
