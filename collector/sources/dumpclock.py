"""The clocks of a `kubectl cluster-info dump` (DESIGN.md §8): when it was captured, judged from
control-plane stamps only (node Leases and heartbeats, Events, the kubelet's pod status, creation
times; never a tenant's log line or status), and how far each node's clock runs off, measured by its
kubelet's Events and Lease renewals. `sources.dump.Dump` holds what was read; this is the judgement.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from collector.claims.common import FUTURE_SKEW
from collector.correlate import RunIndex
from collector.kube import NODE_LEASE_NAMESPACE
from collector.model import EventFacts, NodeFacts, ObjectRecord, PodFacts, Ref
from collector.progress import LogScan

# Content timestamps later than the capture bound plus this are forged or from a skewed clock.
CLOCK_SKEW = FUTURE_SKEW
# The newest timestamp of a dump, this far ahead of every other source, is one forged value: a real
# dump's node heartbeats and kubelet events keep its sources within minutes of each other. (Only
# where no periodic stamp bounds the capture time.)
OUTLIER_GAP = timedelta(hours=1)
# How often a live kubelet refreshes what bounds the capture time from above: its node Lease (renewed
# every 10 s; `leaseDurationSeconds` when the Lease says) and its node status heartbeat (posted at least
# every nodeStatusReportFrequency, 5 min, when nothing changed; a minute of margin).
NODE_HEARTBEAT_PERIOD = timedelta(minutes=6)
NODE_SKEW_TOLERANCE = timedelta(seconds=15)  # Lease renewals of live kubelets lie within 10 s of each other
CLOCK_EXAMPLES = 3  # ignored stamps named in the one clock warning


@dataclass(frozen=True, slots=True)
class CaptureClock:
    """When a dump was captured, from control-plane stamps (DESIGN.md §8).

    `at` is the newest trustworthy control-plane stamp (node heartbeats and Leases, Event times, the
    kubelet's pod status, creation times): the capture cannot be earlier. `slack`: it cannot be later
    than `at + slack`, because live kubelets renew their node Lease and heartbeat periodically (None:
    nothing periodic bounds it). Tenant-written lines (logs, custom resources' status) and future
    deadlines (`deletionTimestamp`) never count.
    """

    at: datetime | None
    slack: timedelta | None
    basis: str

    def taken(self, at: datetime | None = None) -> datetime | None:
        """When the sources count as read: the capture time, or, for an evaluation `--at` a given
        instant, the latest capture time consistent with both (the user knows when they took it;
        the stamps still say it was not later than their bound)."""
        if at is None or self.at is None:
            return self.at or at
        latest = at if self.slack is None else min(at, self.at + self.slack)
        return max(self.at, latest)



class DumpClocks:
    """The clock judgements of a dump, over what `Dump` read (its fields, declared here for them)."""

    root: Path
    records: list[ObjectRecord]
    logs: list[tuple[Ref, str, LogScan]]
    log_paths: list[str]
    written: datetime | None
    leases: list[tuple[str, datetime, timedelta]]
    _clock: CaptureClock | None
    _clock_for: datetime | None

    def _clock_problem(self, path: str, message: str) -> None:
        """A clock stamp read but set aside (the dump names it among its problems)."""
        raise NotImplementedError

    def node_skew(self) -> dict[str, timedelta]:
        """Nodes whose clocks run ahead, and by how much: live kubelets renew their Leases within seconds
        of each other, so a renewal well past the others' median (of three nodes at least: a majority
        says which clocks are right) is its node's clock running ahead."""
        renewed = {holder: renew for holder, renew, _ in self.leases}
        if len(renewed) < 3:
            return {}
        mid = sorted(renewed.values())[len(renewed) // 2]
        return {n: t - mid for n, t in renewed.items() if t - mid > NODE_SKEW_TOLERANCE}

    def unplaced_nodes(self) -> frozenset[str]:
        """Nodes whose clocks are off by an amount nothing trustworthy measures: those their kubelet's
        Events show behind (a Lease cannot: a renewal that lags may be a kubelet gone quiet), or ahead
        with no Lease in the dump (`event_clocks`), and those with no Lease whose status heartbeat stands
        further past the median of the Ready nodes' (three at least) than a heartbeat period (kubelets
        post one every 5 min when nothing changes). Their stamps set no clock (one node hours ahead would
        make every run of the dump look stalled) and their pods' log stamps are not placed
        (`RunEvidence.node_clock_unsure`): unknown, never a stall or a step."""
        return self._unplaced(self._event_offsets())

    def _held(self) -> set[str]:
        """Nodes with a Lease in the dump."""
        return {holder for holder, _, _ in self.leases}

    def _unplaced(self, offsets: dict[str, timedelta]) -> frozenset[str]:
        held = self._held()
        return frozenset({n for n, d in offsets.items() if abs(d) > NODE_SKEW_TOLERANCE
                          and (d < timedelta(0) or n not in held)} | self._far_ahead())

    def _far_ahead(self) -> set[str]:
        """Nodes with no Lease whose heartbeat stands more than a heartbeat period past the median of the
        Ready nodes' (three at least). Node status is the kubelets' to write, not tenants': only these
        leave the capture's upper bound (`_upper`; an Event that could would let a tenant pull the
        bound in, and a step look inside its window at every instant the dump can have been taken)."""
        held = self._held()
        beats = {r.ref.name: r.facts.heartbeat for r in self.records if isinstance(r.facts, NodeFacts)
                 and r.facts.ready == "True" and r.facts.heartbeat is not None}
        if len(beats) < 3:
            return set()
        mid = sorted(beats.values())[len(beats) // 2]
        return {n for n, t in beats.items() if n not in held and t - mid > NODE_HEARTBEAT_PERIOD + NODE_SKEW_TOLERANCE}

    def event_clocks(self) -> dict[str, timedelta]:
        """Nodes whose clocks run off by more than NODE_SKEW_TOLERANCE, by how far (negative: behind), as
        their kubelets' Events show (`_event_offsets`)."""
        return {n: d for n, d in self._event_offsets().items() if abs(d) > NODE_SKEW_TOLERANCE}

    def _event_offsets(self) -> dict[str, timedelta]:
        """Each node's clock offset as its kubelet's Events in the dump show it. A kubelet stamps an
        Event's first time on its node's clock and the API server its creationTimestamp on the
        cluster's as it arrives, a moment later: first − created is at most the node's offset (less by
        the Event's delay), the largest of a node's Events the closest. Events are tenant-writable, so
        a measurement only ever takes a node's stamps away (capture time, its pods' log stamps) or
        moves a capture bound earlier, never a step later: a forged Event costs verdicts, never makes one."""
        node_of = {(r.ref.namespace, r.ref.name): r.facts.node_name for r in self.records
                   if isinstance(r.facts, PodFacts) and r.facts.node_name}
        offsets: dict[str, timedelta] = {}
        for r in self.records:
            f = r.facts
            if not isinstance(f, EventFacts) or f.component != "kubelet" or f.first is None or r.created is None:
                continue
            g = f.regarding
            node = g.name if g.kind == "Node" else node_of.get((g.namespace, g.name), "") if g.kind == "Pod" else ""
            if node:
                d = f.first - r.created
                if node not in offsets or d > offsets[node]:
                    offsets[node] = d
        return offsets

    def place_clocks(self, index: RunIndex) -> None:
        """Its nodes' clocks into `index`: a node measured ahead (`node_skew`) has its stamps read
        earlier; one ahead by an unmeasured amount (`unplaced_nodes`) has them placed nowhere."""
        index.node_skew.update(self.node_skew())
        index.node_clock_unsure.update(self.unplaced_nodes())
        if self._clock is not None and self._clock.at is not None:  # (judged: a dump's, not a live read's)
            index.node_behind.update(self.node_behind(self._clock.at))

    def node_behind(self, at: datetime) -> dict[str, timedelta | None]:
        """Nodes whose clocks may run behind by more than NODE_SKEW_TOLERANCE, judged at capture instant
        `at`, at most by how much (None: nothing bounds it). A clock behind makes steps look older, and
        only a kubelet Event measures it (`_event_offsets`; off beyond the tolerance: unplaced). Where
        none does, every stamp the node's kubelet wrote (its Lease renewal, heartbeat, its containers'
        start and exit times) was taken before the capture: a step it stamped is at least as old as that newest stamp
        shows on the same clock, whatever the offset, and looks older than that by `at` minus it at most
        (a Lease lagging the others' is a clock behind or a kubelet gone quiet: either way, this bound)."""
        measured, skew = self._event_offsets(), self.node_skew()
        own: dict[str, datetime] = {}

        def seen(n: str, *times: datetime | None) -> None:
            for t in times:
                if n and t is not None and (n not in own or t > own[n]):
                    own[n] = t

        for holder, renew, _ in self.leases:
            seen(holder, renew)
        named: set[str] = set()
        for r in self.records:
            f = r.facts
            if isinstance(f, NodeFacts):
                seen(r.ref.name, f.heartbeat)
            elif isinstance(f, PodFacts) and f.node_name:
                # its containers' start and exit times (the container runtime's, on its clock); not the pod's
                # startTime or conditions, which the API server's clock may stamp (a later stamp would
                # shrink the bound: a stall called early)
                named.add(f.node_name)
                seen(f.node_name, *(t for c in f.containers for t in (c.state_since, c.last_finished)))
        out: dict[str, timedelta | None] = dict.fromkeys(named - set(own) - set(measured))
        for n in set(own) - set(measured):
            lag = at - (own[n] - skew.get(n, timedelta(0)))
            if lag > NODE_SKEW_TOLERANCE:
                out[n] = lag
        return out

    def clock(self, captured: datetime | None = None) -> CaptureClock:
        """The capture clock (`captured`: the user says when it was taken). Judged once: its warnings
        are added once."""
        if self._clock is None or self._clock_for != captured:
            self._clock, self._clock_for = self._judge(captured), captured
        return self._clock

    def _stamps(self) -> list[tuple[datetime, str]]:
        """Control-plane stamps: what the API server, kubelets and controllers wrote, never a log
        line, a custom resource's status (tenants may write it) or a deadline."""
        out: list[tuple[datetime, str]] = []
        held, offsets = self._held(), self._event_offsets()
        skew, unplaced = self.node_skew(), self._unplaced(offsets)
        # a node its Events measured ahead: its stamps, that far earlier, still bound the capture from below
        # (late by no more than the delay of the Event that measured it: seconds, under the tolerance)
        ahead = {n: d for n, d in offsets.items() if d > NODE_SKEW_TOLERANCE and n not in held}
        # Where some nodes' clocks are measured (a Lease, a kubelet Event), a node none measures (no
        # Lease, its Events gone) does not move the capture's lower bound: it may run minutes ahead,
        # and a bound that late closes every run's stall window early. (No node measured at all: the
        # kubelets' stamps are all there is, the outlier rule in `_judge` aside.)
        measured = held | set(offsets)
        for r in self.records:
            what = f"{r.ref.kind} {r.ref.namespace}/{r.ref.name}" if r.ref.namespace else f"{r.ref.kind} {r.ref.name}"
            times: list[datetime | None] = [r.created]
            kubelet: list[datetime | None] = []  # stamped on a node's clock: its skew taken out
            f = r.facts
            node = ""
            if isinstance(f, NodeFacts):
                kubelet += [f.heartbeat]
                times += [f.ready_since]
                node = r.ref.name
            elif isinstance(f, EventFacts):
                # first/last are the reporter's clock (a kubelet's may run ahead); the API server's
                # creationTimestamp (in `times`) is what keeps moving on the cluster's clock
                pass
            elif isinstance(f, PodFacts):
                kubelet.append(f.start_time)
                kubelet += [c.last_transition for c in r.conditions]
                for c in f.containers:
                    kubelet += [c.state_since, c.last_finished]
                node = f.node_name
            off = skew.get(node, timedelta(0))
            if node in ahead:
                off = ahead[node]
            elif node in unplaced or (node and measured and node not in measured):
                kubelet = []  # a clock off (or perhaps off) by an amount nothing measures: none of its stamps
            t = max([x for x in times if x is not None] + [x - off for x in kubelet if x is not None], default=None)
            if t is not None:
                out.append((t, what))
        out += [(renew - skew.get(holder, timedelta(0)), f"Lease {NODE_LEASE_NAMESPACE}/{holder}")
                for holder, renew, _ in self.leases]
        return out

    def _upper(self) -> tuple[datetime | None, str]:
        """The latest the capture can be: the newest node Lease renewal or heartbeat of a Ready node,
        plus how often a live kubelet refreshes it."""
        ready = {r.ref.name for r in self.records if isinstance(r.facts, NodeFacts) and r.facts.ready == "True"}
        nodes = any(isinstance(r.facts, NodeFacts) for r in self.records)
        skew = self.node_skew()
        bounds: list[tuple[datetime, str]] = []
        leases = [(renew - skew.get(holder, timedelta(0)) + period, holder, renew) for holder, renew, period
                  in self.leases if not nodes or holder in ready]
        if leases:
            t, holder, renew = max(leases)
            bounds.append((t, f"node Lease of {holder} renewed {renew.isoformat()}"))
        far = self._far_ahead()
        beats = [(r.facts.heartbeat - skew.get(r.ref.name, timedelta(0)), r.ref.name) for r in self.records
                 if isinstance(r.facts, NodeFacts) and r.facts.heartbeat is not None and r.ref.name in ready
                 and r.ref.name not in far]
        if beats:
            t, node = max(beats)
            bounds.append((t + NODE_HEARTBEAT_PERIOD, f"node {node} heartbeat {t.isoformat()}"))
        if not bounds:
            return None, ""
        return min(bounds)

    def _judge(self, captured: datetime | None) -> CaptureClock:
        """The capture clock, warning (once, summarised) about the stamps it leaves out.

        A stamp later than the upper bound (or, with none, the newest file time) plus CLOCK_SKEW is
        ignored. With no upper bound, the newest stamp must also be corroborated: when it stands more
        than OUTLIER_GAP ahead of every other one, it is one forged or skewed value and is left out
        (only one: two agreeing sources are evidence).
        """
        stamps = self._stamps()
        upper: datetime | None
        if captured is not None:
            upper, upper_basis = captured, "--captured-at"
        else:
            upper, upper_basis = self._upper()
        bound_base = upper if upper is not None else self.written
        late: list[tuple[datetime, str]] = []
        if bound_base is not None:
            bound = bound_base + CLOCK_SKEW
            late = [x for x in stamps if x[0] > bound]
            stamps = [x for x in stamps if x[0] <= bound]
            # Log lines never set the clock (tenants write them), but one stamped past the bound is
            # named with the rest: its steps are not read as progress.
            late += [(t, f"log {rel}") for (_, _, scan), rel in zip(self.logs, self.log_paths, strict=False)
                     if (t := _newest_line(scan)) is not None and t > bound]
            late.sort(reverse=True)
        stamps.sort(reverse=True)
        if upper is None and len(stamps) >= 2 and stamps[0][0] - stamps[1][0] > OUTLIER_GAP:
            (t, w), (t2, w2) = stamps[0], stamps[1]
            self._clock_problem(w, f"timestamp {t.isoformat()} stands alone, {t - t2} ahead of every "
                                            f"other source (next: {w2} at {t2.isoformat()}); ignored for the clock",
                              )
            stamps.pop(0)
        if late:
            named = "; ".join(f"{w} at {t.isoformat()}" for t, w in late[:CLOCK_EXAMPLES])
            more = f" and {len(late) - CLOCK_EXAMPLES} more" if len(late) > CLOCK_EXAMPLES else ""
            what = (f"the capture bound ({upper_basis})" if upper is not None
                    else f"the capture time {bound_base.isoformat() if bound_base else ''} (file times)")
            self._clock_problem(late[0][1], f"{len(late)} timestamp(s) later than {what}; ignored for "
                                                     f"the clock: {named}{more}")
        if captured is not None:
            return CaptureClock(captured, timedelta(0), "--captured-at")
        at = stamps[0][0] if stamps else None
        if at is None:
            return CaptureClock(None, None, "no control-plane timestamp in the dump")
        if upper is None:
            self._clock_problem(str(self.root.name), "no node Lease or heartbeat of a Ready node bounds the "
                                         "capture time: claims that need a recent step are unknown (add node Leases: "
                                         "kubectl get leases -n kube-node-lease -o json, or pass --at)")
            return CaptureClock(at, None, f"newest stamp: {stamps[0][1]}")
        return CaptureClock(at, max(upper, at) - at, f"newest stamp: {stamps[0][1]}; at most {upper_basis}")


def _newest_line(scan: LogScan) -> datetime | None:
    times = [x.at for x in scan.samples if x.at is not None]
    times += [h.at for h in scan.hangs if h.at is not None]
    return max(times, default=None)
