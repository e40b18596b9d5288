"""Offline source: a directory laid out as `kubectl cluster-info dump --output-directory` writes it.

Reads `nodes.json`, `<ns>/*.json`, `<ns>/<pod>/logs.txt` (split at kubectl's per-container
banners), and any other `*.json`/`*.yaml`/`*.yml` holding objects or Lists (multi-document YAML
too). Every problem names the file; a bad file or object is skipped, nothing else is.

Hostile input (docs/security.md): only regular files inside the dump are read (symlinks that
leave it, FIFOs, devices and sockets are named and skipped), object files are capped in size,
YAML aliases are refused, duplicate keys are warned about, and the default clock ignores
timestamps past the capture time and a single newest outlier.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from collector.claims.common import FUTURE_SKEW
from collector.correlate import RunIndex, Signal, build_index
from collector.kube import NODE_LEASE_NAMESPACE, MalformedObject, node_lease, normalize
from collector.model import EventFacts, NodeFacts, ObjectRecord, PodFacts, Ref, TauRunFacts
from collector.progress import LogScan, scan_text
from collector.safeload import MAX_OBJECT_BYTES, UnsafeInput, check_size, json_loads, yaml_documents
from collector.settings import TauGridContract

OBJECT_SUFFIXES = (".json", ".yaml", ".yml")
LOG_NAMES = ("logs.txt",)
# One container's log beside kubectl's logs.txt: `kubectl logs --timestamps -c C > C-current.txt`
# (it stands for that container's logs.txt section, which kubectl writes without timestamps) and
# `kubectl logs --previous --timestamps -c C > C-previous.txt` (the log before its restart).
CURRENT, PREVIOUS = "-current.txt", "-previous.txt"
ENVIRONMENT_KINDS = ("CustomResourceDefinition", "Deployment")
_BANNER = re.compile(r"^==== (START|END) logs for container (\S+) of pod (\S+)/(\S+) ====$")
MAX_LOG_BYTES = 64 << 20  # read at most the tail this big of one log file
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


@dataclass(slots=True)
class Problem:
    path: str
    message: str
    skipped: bool  # True: something was not read; False: read, but odd

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if not self.message.startswith(self.path) else self.message


@dataclass(slots=True)
class Dump:
    root: Path
    records: list[ObjectRecord] = field(default_factory=list)
    logs: list[tuple[Ref, str, LogScan]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    files: int = 0
    written: datetime | None = None  # newest file modification time: when kubectl wrote the dump
    log_paths: list[str] = field(default_factory=list)  # the file of each entry of `logs`
    unseen: dict[int, str] = field(default_factory=dict)  # entry of `logs` → what of it is not in view
    # For the supported-environment check: `kubectl version -o json` (or /version) and the raw
    # CustomResourceDefinitions and Deployments the dump holds.
    version: dict[str, Any] | None = None
    environment_objects: list[dict[str, Any]] = field(default_factory=list)
    leases: list[tuple[str, datetime, timedelta]] = field(default_factory=list)  # node Leases: holder, renew, period
    listed: set[str] = field(default_factory=set)  # kinds read as a typed List (NodeList, PodList): even if empty
    _clock: CaptureClock | None = None
    _clock_for: datetime | None = None

    @property
    def skipped(self) -> bool:
        return any(p.skipped for p in self.problems)

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

    def snapshot_kinds(self) -> set[str]:
        """The kinds this snapshot holds: those read as a typed List (an empty NodeList says "no
        nodes"), and any kind it has an object of. A kind not in it was not captured: its source is
        not synced, and claims that need it are unknown (a dump without Nodes has no node health)."""
        return self.listed | {r.ref.kind for r in self.records}

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
            self.problems.append(Problem(w, f"timestamp {t.isoformat()} stands alone, {t - t2} ahead of every "
                                            f"other source (next: {w2} at {t2.isoformat()}); ignored for the clock",
                                         False))
            stamps.pop(0)
        if late:
            named = "; ".join(f"{w} at {t.isoformat()}" for t, w in late[:CLOCK_EXAMPLES])
            more = f" and {len(late) - CLOCK_EXAMPLES} more" if len(late) > CLOCK_EXAMPLES else ""
            what = (f"the capture bound ({upper_basis})" if upper is not None
                    else f"the capture time {bound_base.isoformat() if bound_base else ''} (file times)")
            self.problems.append(Problem(late[0][1], f"{len(late)} timestamp(s) later than {what}; ignored for "
                                                     f"the clock: {named}{more}", False))
        if captured is not None:
            return CaptureClock(captured, timedelta(0), "--captured-at")
        at = stamps[0][0] if stamps else None
        if at is None:
            return CaptureClock(None, None, "no control-plane timestamp in the dump")
        if upper is None:
            self.problems.append(Problem(str(self.root.name), "no node Lease or heartbeat of a Ready node bounds the "
                                         "capture time: claims that need a recent step are unknown (add node Leases: "
                                         "kubectl get leases -n kube-node-lease -o json, or pass --at)", False))
            return CaptureClock(at, None, f"newest stamp: {stamps[0][1]}")
        return CaptureClock(at, max(upper, at) - at, f"newest stamp: {stamps[0][1]}; at most {upper_basis}")

    def signals(self, read_at: datetime) -> list[Signal]:
        return [Signal(ref=ref, source=c, scan=scan, read_at=read_at, unseen=self.unseen.get(i, ""))
                for i, (ref, c, scan) in enumerate(self.logs)]


def _newest_line(scan: LogScan) -> datetime | None:
    times = [x.at for x in scan.samples if x.at is not None]
    times += [h.at for h in scan.hangs if h.at is not None]
    return max(times, default=None)


def load_dump(root: Path, contract: TauGridContract | None = None, *,
              max_object_bytes: int = MAX_OBJECT_BYTES,
              log_regex_by_profile: Mapping[str, str] | None = None) -> Dump:
    """Read a dump. Logs are read after the objects, so that a pod's run profile can choose its
    progress regex (`log_regex_by_profile`, as the controller's settings do)."""
    contract = contract or TauGridContract()
    dump = Dump(root=root)
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: not a directory")
    real_root = os.path.realpath(root)
    logs: list[tuple[Path, str]] = []
    for path, st in _regular_files(dump, root, real_root):
        rel = path.relative_to(root).as_posix()
        if path.name in LOG_NAMES or path.suffix in OBJECT_SUFFIXES:
            mtime = datetime.fromtimestamp(st.st_mtime, UTC)
            dump.written = mtime if dump.written is None else max(dump.written, mtime)
        if path.name in LOG_NAMES or path.name.endswith((PREVIOUS, CURRENT)):
            dump.files += 1
            logs.append((path, rel))
        elif path.suffix in OBJECT_SUFFIXES:
            dump.files += 1
            _read_objects(dump, path, rel, contract, max_object_bytes)
    regex_of = regex_by_pod(dump.records, log_regex_by_profile) if log_regex_by_profile else {}
    _read_logs(dump, logs, regex_of)
    return dump


def unsafe_name(ref: Ref) -> str:
    """Why this object's namespace or name cannot be one path component, or "".

    Both become paths (`<dump>/<namespace>/<pod>/logs.txt`, a bundle's `<namespace>.<run>.<time>`);
    the API server never accepts `/`, `..` or an empty name, so a dump that holds one is forged.
    """
    for what, value in (("namespace", ref.namespace), ("name", ref.name)):
        if (not value and what == "name") or len(value) > 253 or value in (".", "..") or ".." in value \
                or any(c in value for c in "/\\\x00"):
            return f"{ref.kind} {what} {value[:100]!r} holds '/' or '..' or is not a name Kubernetes allows"
    return ""


def regex_by_pod(records: list[ObjectRecord], by_profile: Mapping[str, str]) -> dict[tuple[str, str], str]:
    """(namespace, pod) → the progress regex of its run's profile."""
    index = build_index(records)
    out: dict[tuple[str, str], str] = {}
    for root in index.roots():
        ev = index.evidence(root)
        facts = ev.taurun.facts if ev.taurun is not None else None
        regex = by_profile.get(facts.profile, "") if isinstance(facts, TauRunFacts) else ""
        if regex:
            for p in ev.pods:
                out[(p.ref.namespace, p.ref.name)] = regex
    return out


def _regular_files(dump: Dump, root: Path, real_root: str) -> Iterator[tuple[Path, os.stat_result]]:
    """Regular files under root, sorted; a symlink is followed only when it stays inside the dump.

    Directories are walked without following links; FIFOs, devices and sockets are named and
    skipped (reading one would block or read a device).
    """
    found: list[tuple[Path, os.stat_result]] = []
    for top, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            path = Path(top, name)
            rel = path.relative_to(root).as_posix()
            try:
                st = path.lstat()
                if stat.S_ISLNK(st.st_mode):
                    target = os.path.realpath(path)
                    if os.path.commonpath([real_root, target]) != real_root:
                        dump.problems.append(Problem(rel, "symbolic link leading out of the dump; not followed", True))
                        continue
                    st = os.stat(target)
                    if stat.S_ISDIR(st.st_mode):
                        continue  # its files are reached through their real place inside the dump
            except (OSError, ValueError) as e:
                dump.problems.append(Problem(rel, f"unreadable: {getattr(e, 'strerror', None) or e}", True))
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((path, st))
            elif not stat.S_ISDIR(st.st_mode):
                dump.problems.append(Problem(rel, f"not a regular file ({_file_type(st.st_mode)}); not read", True))
    found.sort(key=lambda x: x[0])
    return iter(found)


def _file_type(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def _read_regular(path: Path, limit: int | None = None, tail: bool = False) -> tuple[bytes, int]:
    """Read a file that must still be regular when opened (no FIFO swapped in meanwhile)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeInput(f"not a regular file ({_file_type(st.st_mode)}); not read")
        if limit is not None and st.st_size > limit:
            if not tail:
                check_size(st.st_size, limit, "one dump file")
            fh.seek(st.st_size - limit)
        return fh.read(), st.st_size


def _read_objects(dump: Dump, path: Path, rel: str, contract: TauGridContract, limit: int) -> None:
    try:
        data, _ = _read_regular(path, limit)
    except UnsafeInput as e:
        dump.problems.append(Problem(rel, str(e), True))
        return
    except OSError as e:
        dump.problems.append(Problem(rel, f"unreadable: {e.strerror}", True))
        return
    for where, doc in _documents(dump, data, rel, path.suffix):
        if isinstance(doc, dict) and "kind" not in doc and ("serverVersion" in doc or "gitVersion" in doc):
            dump.version = doc
            continue
        for item_where, obj in _items(dump, doc, where):
            add_object(dump, obj, rel, item_where, contract)


def add_object(dump: Dump, obj: Any, rel: str, where: str, contract: TauGridContract) -> None:
    """One object as read (from a file of the dump, or a live list): kept as a record, a node Lease
    or an environment object; a malformed or unsafely named one is a problem naming `rel`."""
    if isinstance(obj, dict) and obj.get("kind") in ENVIRONMENT_KINDS:
        dump.environment_objects.append(obj)
        return
    if isinstance(obj, dict) and obj.get("kind") == "Lease":
        _node_lease(dump, obj, where)
        return
    try:
        n = normalize(obj, contract, where=where)
    except MalformedObject as e:
        dump.problems.append(Problem(rel, str(e), True))
        return
    if n.record is not None and (unsafe := unsafe_name(n.record.ref)):
        dump.problems.append(Problem(rel, f"{where}: {unsafe}; refused, the object is not read", True))
        return
    dump.problems.extend(Problem(rel, p, False) for p in n.problems)
    if n.record is not None:
        dump.records.append(n.record)


def _node_lease(dump: Dump, obj: dict[str, Any], where: str) -> None:
    """A kubelet's node Lease (kube-node-lease): its renewals bound the capture time. Other Leases
    (leader election, a tenant's own) say nothing about it."""
    try:
        lease = node_lease(obj)
    except MalformedObject as e:
        dump.problems.append(Problem(where, str(e), False))
        return
    if lease is not None:
        dump.leases.append((lease.node, lease.renewed, lease.period))


def _documents(dump: Dump, data: bytes, rel: str, suffix: str) -> Iterator[tuple[str, Any]]:
    duplicates: list[str] = []
    if suffix == ".json":
        try:
            doc = json_loads(data, duplicates)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            dump.problems.append(Problem(rel, f"not valid JSON: {e}", True))
            return
        except RecursionError:
            dump.problems.append(Problem(rel, "not read: JSON nested too deeply", True))
            return
        dump.problems.extend(Problem(rel, d, False) for d in duplicates)
        yield rel, doc
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        dump.problems.append(Problem(rel, f"not UTF-8 at byte {e.start}", True))
        return
    docs = yaml_documents(text, duplicates)
    i = 0
    while True:
        try:
            doc = next(docs)
        except StopIteration:
            break
        except UnsafeInput as e:
            dump.problems.append(Problem(rel, f"{e}; kept the {i} document(s) before it", True))
            break
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            dump.problems.append(
                Problem(rel, f"YAML error{where} ({getattr(e, 'problem', None) or e}); "
                             f"kept the {i} document(s) before it", True)
            )
            break
        except RecursionError:
            dump.problems.append(Problem(rel, f"YAML nested too deeply; kept the {i} document(s) before it", True))
            break
        i += 1
        dump.problems.extend(Problem(rel, d, False) for d in duplicates)
        duplicates.clear()
        if doc is not None:
            yield (f"{rel}#{i}" if i > 1 else rel), doc
    dump.problems.extend(Problem(rel, d, False) for d in duplicates)


def _items(dump: Dump, doc: Any, where: str) -> Iterator[tuple[str, Any]]:
    """Objects of one document: the object itself, a `*List`'s items, or a bare array's."""
    if isinstance(doc, list):
        for j, item in enumerate(doc):
            yield f"{where}[{j}]", item
        return
    if not isinstance(doc, dict):
        dump.problems.append(Problem(where, f"expected an object or a List, got {type(doc).__name__}", True))
        return
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        item_kind = kind[: -len("List")] if kind != "List" else None
        if item_kind:
            dump.listed.add(item_kind)
        api_version = doc.get("apiVersion")
        for j, item in enumerate(doc["items"]):
            # The API omits kind/apiVersion on list items; kubectl's dump keeps them omitted.
            if isinstance(item, dict) and item_kind and "kind" not in item:
                item = {**item, "kind": item_kind}
                if api_version and "apiVersion" not in item:
                    item["apiVersion"] = api_version
            yield f"{where} items[{j}]", item
        return
    yield where, doc


def _read_log(dump: Dump, path: Path, rel: str, regex_of: Mapping[tuple[str, str], str],
              previous_of: Mapping[tuple[str, str, str], bytes] | None = None,
              containers_of: Mapping[tuple[str, str], list[str]] | None = None,
              own_files: Collection[tuple[str, str, str]] = ()) -> set[tuple[str, str, str]]:
    """One pod's log file; a container's previous log (`<container>-previous.txt`, from `kubectl logs
    --previous`), when the dump has one, is read before its current log as one signal, so steps that
    go back below the pre-restart high-water mark are replay, not progress.

    A log without kubectl's banners (a single container's `kubectl logs`, saved as logs.txt) is that
    container's: the pod's only app container, or, with no status to say, the one container whose
    previous log the dump holds."""
    used: set[tuple[str, str, str]] = set()
    parts = Path(rel).parts
    if len(parts) < 3:
        dump.problems.append(Problem(rel, "log file outside <namespace>/<pod>/, skipped", True))
        return used
    ns, pod = parts[-3], parts[-2]
    data = _log_bytes(dump, path, rel)
    if data is None:
        return used
    names = (containers_of or {}).get((ns, pod), [])
    previous = sorted(c for (n, q, c) in (previous_of or {}) if (n, q) == (ns, pod))
    default = names[0] if len(names) == 1 else previous[0] if not names and len(previous) == 1 else ""
    if not default and previous and not data.startswith(b"==== START logs for container "):
        dump.problems.append(Problem(rel, f"no kubectl banners say whose log this is and pod {ns}/{pod} has "
                                          f"{len(names) or 'no known'} container(s): "
                                          f"{', '.join(c + '-previous.txt' for c in previous)} not joined with it",
                                     False))
    for container, chunk in _split_containers(data, default):
        if (ns, pod, container) in own_files:
            continue  # its C-current.txt stands for it (kubelet-stamped; kubectl's section is not)
        prev = (previous_of or {}).get((ns, pod, container), b"")
        if prev:
            used.add((ns, pod, container))
            chunk = prev + (b"" if prev.endswith(b"\n") else b"\n") + chunk
        scan_log(dump, rel, Ref("Pod", ns, pod), container, chunk, regex_of.get((ns, pod)))
    return used


def scan_log(dump: Dump, rel: str, ref: Ref, container: str, chunk: bytes, regex: str | None) -> None:
    source = f"{rel}:{container}" if container else rel
    try:
        scan = scan_text(chunk, source=source, custom_regex=regex)
    except ValueError as e:  # a bad profile regex: say so, read with the built-in parsers
        dump.problems.append(Problem(rel, f"log regex {regex!r}: {e}; read with the built-in parsers", False))
        scan = scan_text(chunk, source=source)
    dump.problems.extend(Problem(rel, d, False) for d in scan.diagnostics)
    dump.logs.append((ref, container, scan))
    dump.log_paths.append(rel)


def _log_bytes(dump: Dump, path: Path, rel: str) -> bytes | None:
    try:
        data, size = _read_regular(path, MAX_LOG_BYTES, tail=True)
    except UnsafeInput as e:
        dump.problems.append(Problem(rel, str(e), True))
        return None
    except OSError as e:
        dump.problems.append(Problem(rel, f"unreadable: {e.strerror}", True))
        return None
    if size > MAX_LOG_BYTES:
        dump.problems.append(Problem(rel, f"{size} bytes; read the last {MAX_LOG_BYTES}", False))
    return data


def _read_logs(dump: Dump, logs: list[tuple[Path, str]], regex_of: Mapping[tuple[str, str], str]) -> None:
    """Each container's log: its `C-current.txt` where the dump has one, else its section of logs.txt,
    led by its previous log (`C-previous.txt`) as one signal."""
    previous_of: dict[tuple[str, str, str], bytes] = {}
    current_of: dict[tuple[str, str, str], tuple[bytes, str]] = {}
    combined: list[tuple[Path, str]] = []
    for path, rel in logs:
        parts = Path(rel).parts
        if not path.name.endswith((PREVIOUS, CURRENT)):
            combined.append((path, rel))
            continue
        if len(parts) < 3:
            dump.problems.append(Problem(rel, "log file outside <namespace>/<pod>/, skipped", True))
            continue
        data = _log_bytes(dump, path, rel)
        if data is None:
            continue
        suffix = PREVIOUS if path.name.endswith(PREVIOUS) else CURRENT
        for container, chunk in _split_containers(data, path.name[: -len(suffix)]):
            if suffix == PREVIOUS:
                previous_of[(parts[-3], parts[-2], container)] = chunk
            else:
                current_of[(parts[-3], parts[-2], container)] = (chunk, rel)
    containers_of: dict[tuple[str, str], list[str]] = {}
    for r in dump.records:
        if isinstance(r.facts, PodFacts):
            containers_of[(r.ref.namespace, r.ref.name)] = [c.name for c in r.facts.containers if not c.init]
    used: set[tuple[str, str, str]] = set()
    for path, rel in combined:
        used |= _read_log(dump, path, rel, regex_of, previous_of, containers_of, set(current_of))
    for (ns, pod, container), (chunk, rel) in sorted(current_of.items()):
        prev = previous_of.get((ns, pod, container), b"")
        if prev:
            used.add((ns, pod, container))
            chunk = prev + (b"" if prev.endswith(b"\n") else b"\n") + chunk
        scan_log(dump, rel, Ref("Pod", ns, pod), container, chunk, regex_of.get((ns, pod)))
    # A previous log whose container has no current log (it is waiting to restart): on its own. One
    # running again has a current log the dump does not hold: what it printed since is not in view.
    running = {(r.ref.namespace, r.ref.name, c.name) for r in dump.records if isinstance(r.facts, PodFacts)
               for c in r.facts.containers if c.state == "running" and c.restart_count > 0}
    for (ns, pod, container), chunk in sorted(previous_of.items()):
        if (ns, pod, container) not in used:
            rel = f"{ns}/{pod}/{container}{PREVIOUS}"
            scan_log(dump, rel, Ref("Pod", ns, pod), container, chunk, regex_of.get((ns, pod)))
            if (ns, pod, container) in running:
                dump.unseen[len(dump.logs) - 1] = (f"container {container} of pod {pod} restarted and runs again, but"
                                                   f" the dump holds only its log before the restart ({rel}), not "
                                                   "its current log")


def _split_containers(data: bytes, default: str) -> Iterator[tuple[str, bytes]]:
    """kubectl writes all containers of a pod into one logs.txt between START/END banners."""
    if b"==== START logs for container " not in data:
        yield default, data
        return
    current: str | None = None
    buf: list[bytes] = []
    for line in data.splitlines(keepends=True):
        m = _BANNER.match(line.decode("utf-8", "replace").rstrip("\r\n")) if line.startswith(b"==== ") else None
        if m is None:
            if current is not None:
                buf.append(line)
            continue
        if m.group(1) == "START":
            current, buf = m.group(2), []
        elif current is not None:
            yield current, b"".join(buf)
            current = None
    if current is not None:
        yield current, b"".join(buf)
