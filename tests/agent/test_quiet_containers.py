"""What a quiet container costs the controller once node agents send it each pass (issue 30, fleet
memory): its increments with nothing new only move the held signal's read time, and the signal takes
the index's own `Ref` of its pod (`ChangeApplier._refresh`), so a pod's containers hold one `Ref`, the
pod record's, not one each; a document's containers of one pod share one while queued
(`planes.node_agents.log_changes`). Measured with tracemalloc through the agents' path (document →
`sources.agents.parse_evidence` → `log_changes` → the loop); and the same claims and held signals as
with the per-container refs (hypothesis, against the `_refresh` before)."""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.bench_controller import realistic_pod, run_name
from collector.controller import Controller
from collector.correlate import Signal
from collector.kube import NodeLease, normalize
from collector.model import Ref
from collector.planes.base import Change, log_weight
from collector.planes.node_agents import log_changes
from collector.progress.model import LogScan
from collector.settings import ControllerSettings, Settings
from collector.sources.agents import AgentEndpoint, parse_evidence, quiet_scan
from collector.sources.kube_api import KubeApi, api_client_for, resources_for
from tests.test_explain_fixtures import taurun

NOW0 = datetime(2026, 12, 5, 4, 0, tzinfo=UTC)
PODS = 4  # a run's pods, 8 to a node; each pod has two containers (realistic_pod)
TOTAL = 500_000


@dataclass
class _Log:
    """One container's log as its node's agent has read it: lines, and the steps printed."""

    lines: int = 3
    rows: list[list[Any]] = field(default_factory=list)  # [step, at, loss, skipped, total, line]
    diagnostics: list[str] = field(default_factory=list)
    sent: int | None = None  # lines sent in the document before (None: none sent yet)

    def entry(self, ns: str, pod: str, container: str) -> dict[str, Any]:
        """This pass's part of the document: what came after the lines sent (led by the last step
        before them, as agents send), or the whole log the first time."""
        after = self.sent
        rows = self.rows if after is None else [r for r in self.rows if r[5] > after]
        if after is not None:
            lead = [r for r in self.rows if r[5] <= after][-1:]
            rows = lead + rows
        self.sent = self.lines
        return {"namespace": ns, "pod": pod, "container": container, "format": "megatron" if self.rows else None,
                "lines": self.lines, "samples": rows, "diagnostics": list(self.diagnostics),
                **({} if after is None else {"after": after})}


class _Fleet:
    """A controller (its loop alone, never opened) holding `runs` runs of PODS GPU pods, fed each
    pass one agent document per node for every container."""

    def __init__(self, runs: int, *, old_refresh: bool = False, per_change: bool = False) -> None:
        self.clock = [NOW0]
        self.per_change = per_change  # each container its own "agent-log" change (the quiet ones too)
        s = Settings(controller=replace(ControllerSettings(), leader_election=False, log_poll_interval=timedelta(0)))
        self.c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")), s, lambda: self.clock[0])
        self.old = old_refresh
        if old_refresh:  # the signal keeps the Ref its first document came with (the code before)
            self.c._refresh = _old_refresh.__get__(self.c)  # type: ignore[method-assign]
        res = {r.kind: r for r in resources_for(s.taugrid)}
        created = NOW0 - timedelta(hours=3)
        self.nodes: dict[str, list[tuple[str, str, str]]] = {}
        self.logs: dict[tuple[str, str, str], _Log] = {}
        for r in range(runs):
            ns, run = run_name(r)
            objs = [taurun(run, ns, "Running", created, workers=PODS - 1)]
            for j in range(PODS):
                node = f"gpu-{(r * PODS + j) // 8:05d}"
                p = realistic_pod(ns, run, j, created, node)
                objs.append(p)
                for ct in p["spec"]["containers"]:
                    self.nodes.setdefault(node, []).append((ns, p["metadata"]["name"], ct["name"]))
                    self.logs[(ns, p["metadata"]["name"], ct["name"])] = _Log()
            objs += [_node(n) for n in sorted({f"gpu-{(r * PODS + j) // 8:05d}" for j in range(PODS)})]
            for o in objs:
                rec = normalize(o).record
                assert rec is not None
                self.c._upsert(res[o["kind"]], rec)
        self.synced()
        self.c.ready.set()
        self.c.evaluate()

    def synced(self) -> None:
        """Every resource's watch alive, every node's kubelet Lease renewed now (its clock measured)."""
        for kind in ("Pod", "Node", "TauRun", "Event", "Workload", "Job", "RayCluster", "RayJob"):
            self.c.index.synced[kind] = self.clock[0]
        for node in self.nodes:
            self.c.clocks.lease(NodeLease(node, self.clock[0], timedelta(seconds=40)), timedelta(0), listed=False)

    def agent_pass(self, seconds: float = 30.0) -> None:
        """The clock on, then each node's document through the agents' decode and the loop."""
        self.clock[0] += timedelta(seconds=seconds)
        self.synced()
        for node, containers in self.nodes.items():
            doc = {"version": 1, "node": node, "epoch": "e", "poll": 1,
                   "logs": [self.logs[k].entry(*k) for k in containers]}
            rep = parse_evidence(orjson.loads(orjson.dumps(doc)), AgentEndpoint(node, f"agent-{node}", "http://10.0.0.1:9402"),
                                 self.clock[0])
            if self.old or self.per_change:  # (node_agents before: a change a container; a Ref each before that)
                # (in the document's order, as the changes came; the names as decoded)
                at = {(c.namespace, c.pod, c.container): (c.namespace, c.pod, c.container, c.scan, c.after)
                      for c in rep.logs} | \
                    {q[:3]: (*q[:3], quiet_scan(rep.source, q[4], q[3]), q[5]) for q in rep.quiet}
                for k in containers:
                    ns, pod, container, scan, after = at[k]
                    sig = Signal(Ref("Pod", ns, pod), container, scan, rep.read_at)
                    self.c._apply(Change("agent-log", None, (sig, after)))
                continue
            for change, _ in log_changes(rep):
                self.c._apply(change)
        self.c.evaluate()

    def held(self, key: tuple[str, str, str]) -> Signal:
        ns, pod, container = key
        sig = self.c.index.signal_of(self.c.index.get("Pod", ns, pod).ref, container)  # type: ignore[union-attr]
        assert sig is not None
        return sig


def _node(name: str) -> dict[str, Any]:
    stamp = NOW0.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": stamp}]}}


def _old_refresh(self: Controller, prev: Signal, read_at: datetime) -> None:
    """`ChangeApplier._refresh` before: the read time moved, the signal's own `Ref` kept."""
    self.index.set_signal(replace(prev, read_at=read_at))
    if read_at - prev.read_at > self.settings.claims.evidence_max_age / 2:
        root = self._root_of(prev.ref)
        if root is not None:
            self._dirty.add(root.key)


def _bytes_per_container(runs: int, *, old_refresh: bool = False) -> float:
    """What the loop holds from the first agent pass on, per container, all quiet (a first document
    of 3 lines, then 4 passes with nothing new), evaluations left out (their claims are the runs')."""
    f = _Fleet(runs, old_refresh=old_refresh)
    gc.collect()
    tracemalloc.start(40)
    try:
        for _ in range(5):
            f.agent_pass()
        gc.collect()
        snap = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    snap = snap.filter_traces([tracemalloc.Filter(False, "*/collector/evaluation.py", all_frames=True),
                               tracemalloc.Filter(False, tracemalloc.__file__)])
    return sum(s.size for s in snap.statistics("filename")) / len(f.logs)


def test_a_quiet_entry_decodes_as_a_whole_one_does() -> None:
    """`sources.agents._scan`'s short path (an entry whose samples, findings, tokens and diagnostics are
    all empty: a quiet container's, most of a pass's) gives what the whole decode gives, for entries as
    the agent renders them (`agent.evidence._log`) and hostile ones; the whole decode is forced by a
    sample row it refuses, which adds nothing."""
    from collector.agent.evidence import _log
    from collector.agent.logs import ContainerLog
    from collector.progress.model import LogScan
    from collector.sources.agents import _scan
    rendered = _log(ContainerLog("ml", "head-0", "uid-1", "fluent-bit", LogScan("fluent-bit", None, (), (), (), (), 3),
                                 NOW0.timestamp(), 3), 10)
    rendered = orjson.loads(orjson.dumps(rendered))  # (as off the wire)
    assert set(rendered) >= {"samples", "hangs", "xids", "resumes", "tokens", "diagnostics"}
    for entry in (rendered, {**rendered, "format": "megatron", "after": None}, {"lines": 3}, {},
                  {"format": "x" * 300, "lines": 2**70}, {"lines": "3"}, {"lines": -4, "format": 5}, {"lines": True},
                  {**rendered, "samples": "", "hangs": {}, "xids": 0, "resumes": None, "tokens": [],
                   "diagnostics": ""}):
        quiet = _scan(entry, "node/a")
        whole = _scan({**entry, "samples": [["refused"]]}, "node/a")
        assert quiet == whole and repr(quiet) == repr(whole), entry
        assert quiet.format is whole.format  # (interned: one string a format)
    # an entry with anything in those fields takes the whole decode
    assert _scan({**rendered, "diagnostics": ["cut"]}, "node/a").diagnostics == ("cut",)
    assert _scan({**rendered, "tokens": [9.5, "2026-12-05T04:00:00+00:00"]}, "node/a").tokens is not None


def test_a_quiet_container_holds_the_pods_ref_and_one_scan_across_passes() -> None:
    f = _Fleet(2)
    f.agent_pass()
    first = {k: f.held(k).scan for k in f.logs}
    for _ in range(3):
        f.agent_pass()
    for (ns, pod, container), log in f.logs.items():
        sig = f.held((ns, pod, container))
        assert sig.ref is f.c.index.get("Pod", ns, pod).ref  # type: ignore[union-attr]
        assert sig.scan is first[(ns, pod, container)] and sig.scan.lines == log.lines == 3
        assert sig.read_at == f.clock[0] and sig.scan.memo is None  # (no memo: nothing derived kept on it)


def test_a_documents_containers_of_one_pod_share_one_ref_while_queued() -> None:
    logs = [{"namespace": "ns", "pod": f"p{i // 3}", "container": f"c{i % 3}", "lines": 3, "samples": []}
            for i in range(9)]
    rep = parse_evidence({"version": 1, "node": "n", "logs": logs}, AgentEndpoint("n", "a", "http://10.0.0.1:1"), NOW0)
    changes = list(log_changes(rep))
    sigs = [ch.payload[0] for ch, _ in changes]
    assert [(s.ref.key, s.source) for s in sigs] == [(("Pod", "ns", f"p{i // 3}"), f"c{i % 3}") for i in range(9)]
    assert len({id(s.ref) for s in sigs}) == 3 and all(s.ref.uid == "" for s in sigs)
    assert all(ch.op == "agent-log" and ch.payload[1] is None and w == log_weight(ch.payload[0].scan) == 2
               and s.read_at is NOW0 for (ch, w), s in zip(changes, sigs, strict=True))


def test_an_increments_quiet_containers_are_one_change_a_thousand() -> None:
    """An increment's containers with nothing new (`sources.agents.QuietLog`) go to the loop as rows of
    `"agent-quiet"` changes, QUIET_CHUNK a change, each weighing what its scan would; the others as
    `"agent-log"` changes; every pod among those the agent reads."""
    from collector.planes.node_agents import QUIET_CHUNK
    logs = [{"namespace": "ns", "pod": f"p{i}", "container": "main", "lines": 3, "after": 3, "samples": [],
             "format": "megatron" if i % 2 else None} for i in range(2 * QUIET_CHUNK + 5)]
    logs[7] = {**logs[7], "lines": 4}  # (a line with nothing in it: quiet all the same, its count moved)
    logs[9] = {**logs[9], "diagnostics": ["a note"]}  # (something to say: its own change)
    logs[11] = {**logs[11], "after": None}  # (whole: its own change)
    rep = parse_evidence({"version": 1, "node": "n", "logs": logs}, AgentEndpoint("n", "a", "http://10.0.0.1:1"), NOW0)
    assert [c.pod for c in rep.logs] == ["p9", "p11"] and len(rep.quiet) == len(logs) - 2
    assert rep.quiet[7] == ("ns", "p7", "main", 4, "megatron", 3) and rep.quiet[0][4] is None
    assert rep.log_pods() == {("ns", f"p{i}") for i in range(len(logs))}
    assert quiet_scan(rep.source, rep.quiet[7][4], rep.quiet[7][3]) == LogScan("agent:n", "megatron", (), (), (), (), 4)
    changes = list(log_changes(rep))
    assert [ch.op for ch, _ in changes] == ["agent-quiet"] * 3 + ["agent-log"] * 2  # (quiet first: log_changes)
    rows = [r for ch, _ in changes[:3] for r in ch.payload[2]]
    assert rows == list(rep.quiet) and all(ch.payload[:2] == (NOW0, "agent:n") for ch, _ in changes[:3])
    assert [w for _, w in changes[:3]] == [2 * len(ch.payload[2]) for ch, _ in changes[:3]] == \
        [2 * QUIET_CHUNK, 2 * QUIET_CHUNK, 2 * (len(logs) - 2 - 2 * QUIET_CHUNK)]


def test_a_quiet_container_costs_a_ref_less() -> None:
    """Bytes held per quiet container (its signal, scan and source string, its pod's entries in the
    index's signal table and the loop's run memo, shared by its two containers): ~600 with the pod's
    Ref, ~680 with one of its own (the code before: it exceeds the bound)."""
    new = _bytes_per_container(25)
    old = _bytes_per_container(25, old_refresh=True)
    assert new <= 630, new
    assert old - new >= 70, (old, new)  # a Ref (a 4-tuple: 80 B with its GC header) a container


# --- the same claims as with a Ref a container ------------------------------------------------------

_KINDS = ("quiet", "steps", "line", "diag", "undiag", "whole")


def _change(log: _Log, kind: str, at: datetime, rng_loss: float) -> None:
    """One container's log moves on by `kind`: nothing, steps a second apart, a line with no step,
    a diagnostic, its notes gone, or the agent restarted (its next document is whole)."""
    if kind == "steps":
        step = log.rows[-1][0] + 1 if log.rows else 1000
        for i in range(5):
            log.lines += 1
            log.rows.append([step + i, (at - timedelta(seconds=4 - i)).isoformat(), rng_loss + 0.01 * i, False, TOTAL,
                             log.lines])
    elif kind == "line":
        log.lines += 1
    elif kind == "diag":
        log.diagnostics.append(f"diagnostic at line {log.lines}")
    elif kind == "undiag":
        log.diagnostics.clear()
    elif kind == "whole":
        log.sent = None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.sampled_from(_KINDS), st.floats(1.5, 3.0)), min_size=8, max_size=8),
                min_size=1, max_size=6),
       st.lists(st.sampled_from((30.0, 30.0, 30.0, 200.0)), min_size=6, max_size=6))
def test_the_same_claims_and_signals_as_with_a_ref_a_container(passes: list[list[tuple[str, float]]],
                                                                gaps: list[float]) -> None:
    _alike(_Fleet(1), _Fleet(1, old_refresh=True), passes, gaps)


def _alike(one: _Fleet, other: _Fleet, passes: list[list[tuple[str, float]]], gaps: list[float]) -> None:
    """Both fleets fed the same logs pass after pass: after each, the same claims, held signals and runs
    marked."""
    keys = sorted(one.logs)
    assert len(keys) == 8 and keys == sorted(other.logs)
    for moves, gap in zip(passes, gaps, strict=False):
        for f in (one, other):
            for k, (kind, loss) in zip(keys, moves, strict=True):
                _change(f.logs[k], kind, f.clock[0] + timedelta(seconds=gap), loss)
            f.agent_pass(gap)
        assert one.c.claims.keys() == other.c.claims.keys()
        for key in one.c.claims:
            assert repr(one.c.claims[key]) == repr(other.c.claims[key])
        for k in keys:
            a, b = one.held(k), other.held(k)
            assert a == b and repr(a) == repr(b) and a.scan.summary_of() == b.scan.summary_of()
        assert one.c._dirty == other.c._dirty
        # `one` applies a document's quiet rows before its increments (`log_changes`): a row that marks
        # a run (read again past half the evidence age) is seen by the run's confirming increment, which
        # then defers nothing for a run evaluated now anyway; in the document's order an increment
        # before the row has deferred it. Never more deferrals, and the same runs marked.
        assert one.c._rechecks.deferrals <= other.c._rechecks.deferrals


_Q, _STEPS, _LINE = ("quiet", 2.0), ("steps", 2.0), ("line", 2.0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.sampled_from(_KINDS), st.floats(1.5, 3.0)), min_size=8, max_size=8),
                min_size=1, max_size=6),
       st.lists(st.sampled_from((30.0, 30.0, 30.0, 200.0)), min_size=6, max_size=6))
# (found by the search against quiet rows applied after a document's increments: one deferral more)
@example([[_Q] * 8, [_Q, _Q, _Q, _STEPS, _Q, _Q, _Q, _Q], [_Q, _LINE, _Q, _STEPS, _Q, _Q, _Q, _Q]], [30.0] * 6)
def test_quiet_rows_are_the_agent_log_changes_they_stand_for(passes: list[list[tuple[str, float]]],
                                                              gaps: list[float]) -> None:
    """The loop's `"agent-quiet"` rows (`ChangeApplier._quiet`) leave the index, the claims and the runs
    marked as an `"agent-log"` change of each row's scan does (the path before them), pass after pass,
    for containers whose logs go quiet, step, gain a line, a note or lose it, or are sent whole."""
    _alike(_Fleet(1), _Fleet(1, per_change=True), passes, gaps)



def test_read_again_replaces_only_a_held_signal_whose_scan_is_the_same_in_its_place() -> None:
    """`RunIndex.read_again` (the quiet rows' look): the held signal read again in its place (a pod's few
    signals in a tuple, many in a dict), its ref the pod record's; nothing replaced for a source not
    held, a pod not held, or a scan `same` refuses."""
    f = _Fleet(1)
    ns, pod, _ = next(iter(f.logs))
    rec = f.c.index.get("Pod", ns, pod)
    assert rec is not None
    key = ("Pod", ns, pod)
    for count in (3, 12):  # (12: past SMALL_SIGNALS, held in a dict)
        for k in range(count):
            f.c.index.set_signal(Signal(Ref("Pod", ns, pod), f"s{count}-{k}", quiet_scan("agent:n", None, k), NOW0))
        before = [s.source for s in f.c.index.signals_of(key)]
        later = NOW0 + timedelta(seconds=30)
        prev = f.c.index.read_again(key, f"s{count}-1", later, lambda scan: scan.lines == 1)
        assert prev is not None and prev.read_at == NOW0 and prev.ref is not rec.ref
        got = f.c.index.signal_at(key, f"s{count}-1")
        assert got is not None and got.read_at == later and got.ref is rec.ref and got.scan is prev.scan
        assert [s.source for s in f.c.index.signals_of(key)] == before  # (its place kept)
        assert f.c.index.read_again(key, f"s{count}-2", later, lambda scan: False) is None
        assert f.c.index.signal_at(key, f"s{count}-2").read_at == NOW0  # type: ignore[union-attr]
        assert f.c.index.read_again(key, "absent", later, lambda scan: True) is None
        assert f.c.index.read_again(("Pod", ns, "no-such-pod"), f"s{count}-1", later, lambda scan: True) is None
