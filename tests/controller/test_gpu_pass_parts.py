"""The agents' GPU pass reaches the loop agent by agent (`planes.node_agents.NodePart`, then `PassEnd`):
each pod's record replaces the pass before's as its agent's document is read, so the fleet's records
are never held twice (issue 30: the whole pass at once was 116 MiB more at 150k pods). Searched against
the loop as it was, one change holding the whole pass (`_whole_pass`, 30a2985): after every pass the
same records, nodes, newest read, runs marked, pods read by agents, GpuSamples and XIDs exported and
claims, over seeded passes with documents read in any order, agents not read, pods gone, devices
lost, XIDs coming and going, GPUs shared and moved between pods, and dcgm-exporters beside agents."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.bench_controller import fleet_controller
from collector.claims import gpuspread
from collector.claims.memo import ByInputs
from collector.gpu import GpuDevice, PodGpuEvidence
from collector.model import Ref
from collector.planes.base import Change
from collector.planes.node_agents import NodePart, PassEnd, gpu_records, pass_changes
from exporters.adx.rows import GpuSample, GpuXid
from tests.controller.test_gpu_pass_memo import runs_to_recheck

RUNS, PODS, NODES = 3, 4, 5
NOW0 = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)


class _Sink:
    """The record sink's GPU tables, as written."""

    def __init__(self) -> None:
        self.samples: Counter[GpuSample] = Counter()
        self.xids: Counter[GpuXid] = Counter()

    def gpu(self, samples: Any = (), xids: Any = ()) -> None:
        self.samples.update(samples)
        self.xids.update(xids)

    def __getattr__(self, name: str) -> Any:  # (its other tables: claims, events, samples)
        return lambda *a, **kw: None


def _controller(clock: list[datetime]) -> tuple[Any, list[dict[str, Any]]]:
    c, pods = fleet_controller(RUNS, PODS, NODES, lambda: clock[0])
    c.sink = _Sink()
    return c, pods


def _whole_pass(c: Any, gpus: dict[tuple[str, str], PodGpuEvidence], nodes: dict[str, datetime],
                log_pods: frozenset[tuple[str, str]]) -> None:
    """The loop's "gpu" change as it was (30a2985): the whole pass at once. But for one rule: a GPU an
    agent reports is its pod's, not a dcgm-exporter's pod's that sorts first (the agent's answer wins,
    as it does for a pod both report; the pass comes agent by agent, and an agent's records are
    exported as they come)."""
    c._dirty |= runs_to_recheck(c._gpus, gpus, c.index.root_of, c.index.member_pods, c.claims, c._dirty,
                                now=c.now(), every=c.settings.claims.confirm_refresh)
    agents = {k: g for k, g in gpus.items() if g.source != "dcgm"}
    samples, xids = gpu_records(c._gpus, agents, c.index.root_of)
    taken = {(x.node, x.uuid) for x in samples}
    more, more_xids = gpu_records(c._gpus, {k: g for k, g in gpus.items() if k not in agents}, c.index.root_of)
    c.sink.gpu([*samples, *(x for x in more if (x.node, x.uuid) not in taken)],
               [*xids, *(x for x in more_xids if (x.node, x.uuid) not in taken)])
    for ns, pod in c.agent_log_pods - log_pods:
        root = c._root_of(Ref("Pod", ns, pod))
        if root is not None:
            c._dirty.add(root.key)
    c._gpus, c._agent_nodes, c.agent_log_pods = gpus, nodes, log_pods
    c._agents_newest = max(nodes.values(), default=None)


def _device(pod: int, i: int, rng: random.Random, *, uuid: str | None = None) -> GpuDevice:
    return GpuDevice(uuid=uuid or f"GPU-{pod:04d}{i:04d}-0000-4000-8000-000000000000", index=i,
                     utilization=rng.uniform(0.0, 1.0), sm_active=rng.uniform(0.0, 0.9),
                     power_w=rng.uniform(100.0, 700.0), power_limit_w=700.0,
                     lost=rng.random() < 0.05, xids=tuple(sorted(rng.sample((13, 31, 48, 79), rng.randint(0, 1))))
                     if rng.random() < 0.2 else ())


def _pass(seed: int, pods: list[dict[str, Any]], now: datetime) -> tuple[
        list[tuple[str, datetime, list[PodGpuEvidence]]], dict[str, datetime], list[PodGpuEvidence],
        frozenset[tuple[str, str]]]:
    """One pass (seeded): the agents read, in their endpoints' order, each with its node's pods' records
    (a pod left out now and then, a GPU moved to the next pod of its node, a pod one agent names on
    another's node); dcgm-exporters' nodes and records (some of pods an agent reported too); the pods
    whose logs agents read."""
    rng = random.Random(seed)
    agents: list[tuple[str, datetime, list[PodGpuEvidence]]] = []
    by_node: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for k, p in enumerate(pods):
        by_node.setdefault(p["spec"]["nodeName"], []).append((k, p))
    nodes = sorted(by_node)
    for node in nodes:
        if rng.random() < 0.15:
            continue  # its agent not read this pass
        at = now - timedelta(seconds=rng.randint(0, 20))
        recs = []
        for j, (k, p) in enumerate(by_node[node]):
            if rng.random() < 0.1:
                continue
            devs = [_device(k, i, rng) for i in range(rng.choice((1, 2, 8)))]
            if j and rng.random() < 0.2:  # a GPU the pod before it on the node holds (shared, or moved)
                devs[0] = _device(by_node[node][j - 1][0], 0, rng)
            recs.append(PodGpuEvidence(p["metadata"]["namespace"], p["metadata"]["name"], node, "agent", at,
                                       tuple(devs), ("main",)))
        agents.append((node, at, recs))
    dcgm_nodes = {n: now for n in nodes if rng.random() < 0.2}
    dcgm = [PodGpuEvidence(p["metadata"]["namespace"], p["metadata"]["name"], n, "dcgm", now,
                           (_device(k, 0, rng),), ()) for n in dcgm_nodes for k, p in by_node[n]]
    logs = frozenset((p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods if rng.random() < 0.7)
    return agents, dcgm_nodes, dcgm, logs


def _state(c: Any) -> tuple[Any, ...]:
    return (c._gpus, c._agent_nodes, c._agents_newest, c._dirty, c.agent_log_pods, c.sink.samples, c.sink.xids)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 1 << 16), st.randoms(use_true_random=False), st.booleans(),
                          st.integers(0, 300)), min_size=1, max_size=6))
def test_a_pass_agent_by_agent_is_the_whole_pass_at_once(passes: list[tuple[int, random.Random, bool, int]]) -> None:
    clock = [NOW0]
    gpuspread._CORES = ByInputs()  # (another test's kept comparisons)
    whole, pods = _controller(clock)
    parts, _ = _controller(clock)
    for seed, order, evaluate, tick in passes:
        agents, dcgm_nodes, dcgm, logs = _pass(seed, pods, clock[0])
        # as it was: the poller merged the pass (a pod two agents name: the later agent's; dcgm where
        # no agent answered), then one change
        gpus = {(g.namespace, g.pod): g for _, _, recs in agents for g in recs}
        nodes = {node: at for node, at, _ in agents}
        for g in dcgm:
            gpus.setdefault((g.namespace, g.pod), g)
        for n, at in dcgm_nodes.items():
            nodes.setdefault(n, at)
        _whole_pass(whole, gpus, nodes, logs)
        # now: each agent's part as its document comes (in any order), then the end
        came = list(enumerate(agents))
        order.shuffle(came)
        named: dict[tuple[str, str], int] = {}
        for i, (node, at, recs) in came:
            parts._apply(Change("gpu-node", None, NodePart(7 + seed, i, node, at, tuple(recs))))
            # read now, used now: the node fresh as read, each pod's record the newest agent's so far
            assert parts._agent_nodes[node] == at and parts._agents_newest is not None and parts._agents_newest >= at
            for g in recs:
                k = (g.namespace, g.pod)
                if named.setdefault(k, i) <= i:
                    named[k] = i
                    assert parts._gpus[k] is g
        parts._apply(Change("gpu", None, PassEnd(7 + seed, dcgm_nodes, tuple(dcgm), logs)))
        assert _state(parts) == _state(whole)
        assert parts._gpu_passing is None
        if evaluate:
            # (the same runs, in the order each set of runs marked gives them)
            assert sorted(map(repr, parts.evaluate())) == sorted(map(repr, whole.evaluate()))
        clock[0] += timedelta(seconds=tick)


def test_a_pod_two_agents_name_is_the_later_agents_whichever_came_first() -> None:
    """A pod named in two agents' documents (a pod replaced on another node between the two reads) holds
    the record of the agent later in the pass's order, as the whole pass merged them; its run is marked
    (the first record differed from the one before)."""
    clock = [NOW0]
    c, pods = _controller(clock)
    rng = random.Random(3)
    ns, name, node = pods[0]["metadata"]["namespace"], pods[0]["metadata"]["name"], pods[0]["spec"]["nodeName"]
    first = PodGpuEvidence(ns, name, node, "agent", NOW0, (_device(0, 0, rng),), ("main",))
    for ch in pass_changes({(ns, name): first}, {node: NOW0}):
        c._apply(ch)
    c.evaluate()
    early = PodGpuEvidence(ns, name, "elsewhere", "agent", NOW0, (_device(0, 0, rng),), ("main",))
    late = PodGpuEvidence(ns, name, node, "agent", NOW0, first.devices, ("main",))
    c._apply(Change("gpu-node", None, NodePart(99, 1, node, NOW0, (late,))))
    c._apply(Change("gpu-node", None, NodePart(99, 0, "elsewhere", NOW0, (early,))))  # came after, earlier order
    c._apply(Change("gpu", None, PassEnd(99, {}, (), frozenset())))
    assert c._gpus[(ns, name)] is late
    assert set(c._agent_nodes) == {node, "elsewhere"}


def test_a_pass_cut_short_is_not_taken_for_the_next() -> None:
    """A poller stopped mid-pass (its thread restarted) leaves parts of a pass that never ends: the next
    pass's end removes what that pass did not name, whatever the part before said."""
    clock = [NOW0]
    c, pods = _controller(clock)
    rng = random.Random(5)
    recs = {(p["metadata"]["namespace"], p["metadata"]["name"]): PodGpuEvidence(
        p["metadata"]["namespace"], p["metadata"]["name"], p["spec"]["nodeName"], "agent", NOW0,
        (_device(k, 0, rng),), ("main",)) for k, p in enumerate(pods)}
    (k0, g0), (k1, g1) = list(recs.items())[:2]
    c._apply(Change("gpu-node", None, NodePart(1, 0, g0.node, NOW0, (g0,))))  # pass 1: cut short
    c._apply(Change("gpu-node", None, NodePart(2, 0, g1.node, NOW0, (g1,))))
    c._apply(Change("gpu", None, PassEnd(2, {}, (), frozenset())))
    assert set(c._gpus) == {k1} and set(c._agent_nodes) == {g1.node}


def test_a_replaced_record_is_not_held_by_a_kept_comparison() -> None:
    """Each part forgets the kept GPU comparisons of the runs whose records it replaced: the pass
    before's records go as the new ones come, not at the pass's end."""
    clock = [NOW0]
    c, pods = _controller(clock)
    gpuspread._CORES = ByInputs()

    def records(seed: int) -> dict[tuple[str, str], PodGpuEvidence]:
        rng = random.Random(seed)
        return {(p["metadata"]["namespace"], p["metadata"]["name"]): PodGpuEvidence(
            p["metadata"]["namespace"], p["metadata"]["name"], p["spec"]["nodeName"], "agent", clock[0],
            tuple(_device(k, i, rng) for i in range(8)), ("main",)) for k, p in enumerate(pods)}
    for ch in pass_changes(records(1), {f"gpu-{n:04d}": clock[0] for n in range(NODES)}):
        c._apply(ch)
    c.evaluate()
    assert gpuspread._CORES._kept
    new = records(2)
    first = next(iter(new.values()))
    c._apply(Change("gpu-node", None, NodePart(50, 0, first.node, clock[0], tuple(
        g for g in new.values() if g.node == first.node))))
    held = {id(g) for g in c._gpus.values()}
    for inputs, _, _ in gpuspread._CORES._kept.values():
        assert all(id(e) in held for e in inputs)  # (only the records still current)
