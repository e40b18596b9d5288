"""The API log pass's plan (collector/sources/logs.py) is what it was before it was made cheaper:
`_candidates` over the targets' keys and ranks remembered between passes, and `fair_order`'s
round-robin by `zip_longest`, against the previous code kept here as the reference. Seeded
passes over generated targets (pods of one or more containers, profile regexes, agent-read pods,
restarts, runs whose claims stand past the next pass, signals the index holds or not) with reads,
failures and a ceiling in between: the same containers due, in the same order, with the same
urgency, cost and rank, and the same counts skipped, pass after pass."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.logrotation import LogKey, slot_of
from collector.model import Ref
from collector.sources.logs import ApiLogPoller, ApiLogSettings, Candidate, LogTarget, fair_order

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def _old_fair_order(candidates: Iterable[Candidate], waited: Mapping[LogKey, int], turn: int) -> list[Candidate]:
    classes: tuple[dict[str, list[Candidate]], dict[str, list[Candidate]]] = ({}, {})
    for c in candidates:
        classes[0 if c.urgent else 1].setdefault(c.key[0], []).append(c)
    out: list[Candidate] = []
    for by_tenant in classes:
        tenants = sorted(by_tenant)
        if not tenants:
            continue
        k = turn % len(tenants)
        runs: deque[Iterator[Candidate]] = deque(
            iter(sorted(by_tenant[t], key=lambda c: (-waited.get(c.key, 0), c.rank)))
            for t in tenants[k:] + tenants[:k])
        while runs:
            it = runs.popleft()
            nxt = next(it, None)
            if nxt is not None:
                out.append(nxt)
                runs.append(it)
    return out


def _old_candidates(self: ApiLogPoller, targets: Sequence[LogTarget], agent_pods: Collection[tuple[str, str]],
                    held: Callable[[Ref, str], bool], quiet: Mapping[tuple[str, str], datetime],
                    horizon: datetime) -> tuple[list[Candidate], dict[str, int]]:
    out: list[Candidate] = []
    agent = rotation = claims = 0
    passes = self.rotation.passes
    pod: tuple[str, str] = ("", "")
    rank = 0
    for target in targets:
        ref, container, regex, restarts, slot = target
        rank = rank + 1 if (ref.namespace, ref.name) == pod else 0
        pod = (ref.namespace, ref.name)
        if not regex and (ref.namespace, ref.name) in agent_pods:
            agent += 1
            continue
        key = (ref.namespace, ref.name, container)
        restarted = restarts != self._previous_read.get(key, restarts)
        if key not in self.planner.waited and not self.rotation.due(key, restarted, slot):
            rotation += 1
            continue
        last = self.rotation.read_pass(key)
        until = quiet.get((ref.namespace, ref.name))
        if until is not None and until > horizon and last is not None and not restarted \
                and passes - last[0] < self.rotation.quiet_every and held(ref, container):
            claims += 1
            continue
        urgent = last is None or restarted or (until is not None and last[1])
        out.append(Candidate(key, target, urgent, 2 if restarts > self._previous_read.get(key, 0) else 1, rank))
    return out, {"agent": agent, "rotation": rotation, "claims": claims}


def _fields(cs: Iterable[Candidate]) -> list[tuple[object, ...]]:
    return [(c.key, c.target, c.urgent, c.cost, c.rank) for c in cs]


def _targets(rng: random.Random, restarts: dict[tuple[str, str], int]) -> list[LogTarget]:
    out: list[LogTarget] = []
    for r in range(rng.randrange(1, 12)):
        ns = f"team-{rng.randrange(4)}"
        slot = slot_of(f"TauRun\x1f{ns}\x1frun-{r}")
        regex = "loss=(?P<loss>[0-9.]+)" if rng.random() < 0.1 else ""
        for p in range(rng.randrange(1, 6)):
            if rng.random() < 0.1:
                continue  # a pod not running this pass
            ref = Ref("Pod", ns, f"run-{r}-w{p}")
            for c in ("main", "sidecar", "fluentbit")[: rng.choice((1, 1, 2, 3))]:
                out.append((ref, c, regex, restarts.get((ref.name, c), 0), slot))
    return out


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_the_plan_is_the_previous_codes_pass_after_pass(seed: int) -> None:
    rng = random.Random(seed)
    poller = ApiLogPoller(None, ApiLogSettings(quiet_every=rng.choice((1, 2, 4))), lambda: T0)  # type: ignore[arg-type]
    restarts: dict[tuple[str, str], int] = {}
    targets = _targets(rng, restarts)
    for n in range(12):
        if rng.random() < 0.3:  # the runs or their pods changed (a new list), else the same list again
            if rng.random() < 0.5:
                for ref, c, *_ in rng.sample(targets, min(3, len(targets))):
                    restarts[(ref.name, c)] = restarts.get((ref.name, c), 0) + 1
                targets = [(t[0], t[1], t[2], restarts.get((t[0].name, t[1]), 0), t[4]) for t in targets]
            else:
                targets = _targets(rng, restarts)
        elif rng.random() < 0.3:
            targets = list(targets)  # a copy of the same tuples, as ApiLogSource hands them on
        pods = sorted({(ref.namespace, ref.name) for ref, *_ in targets})
        agent_pods = frozenset(p for p in pods if rng.random() < 0.15)
        horizon = T0 + timedelta(seconds=30 * n + 40)
        quiet = {p: horizon + timedelta(seconds=rng.choice((-20, 10, 600))) for p in pods if rng.random() < 0.5}
        held_keys = {(ref.namespace, ref.name, c) for ref, c, *_ in targets if rng.random() < 0.8}

        def held(ref: Ref, c: str, held_keys: set[LogKey] = held_keys) -> bool:
            return (ref.namespace, ref.name, c) in held_keys

        # what run_pass does before its plan: the keys, the pruning, the rotation's pass
        kept, keys, ranks = poller._keys_of(targets)
        assert kept == targets
        assert keys == [(ref.namespace, ref.name, c) for ref, c, *_ in targets]
        wanted = set(keys)
        for key in [k for k in poller._previous_read if k not in wanted]:
            del poller._previous_read[key]
        poller.rotation.begin_pass(wanted)
        old, old_skipped = _old_candidates(poller, targets, agent_pods, held, quiet, horizon)
        new, new_skipped = poller._candidates(zip(kept, keys, ranks, strict=True), agent_pods, held, quiet, horizon)
        assert _fields(new) == _fields(old) and new_skipped == old_skipped, (seed, n)
        turn = poller.planner.turn + 1
        order = poller.planner.order(new)
        assert _fields(order) == _fields(_old_fair_order(old, poller.planner.waited, turn)), (seed, n)
        # this pass's reads: a ceiling's share of the order, some failing, some with progress
        asked: set[LogKey] = set()
        for c in order[: rng.randrange(len(order) + 1)]:
            asked.add(c.key)
            if rng.random() < 0.1:
                poller.rotation.failed(c.key)
                continue
            poller._previous_read[c.key] = c.target[3]
            poller.rotation.read(c.key, progress=rng.random() < 0.3,
                                 last_line=(T0 + timedelta(seconds=30 * n)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        poller.planner.settle(new, asked)


def test_a_pods_containers_rank_in_order_and_a_changed_list_is_keyed_again() -> None:
    poller = ApiLogPoller(None, ApiLogSettings(), lambda: T0)  # type: ignore[arg-type]
    a, b = Ref("Pod", "ns", "a"), Ref("Pod", "ns", "b")
    targets: list[LogTarget] = [(a, "main", "", 0, 0), (a, "side", "", 0, 0), (b, "main", "", 0, 0)]
    assert poller._keys_of(targets)[1:] == ([("ns", "a", "main"), ("ns", "a", "side"), ("ns", "b", "main")], [0, 1, 0])
    targets[2] = (b, "other", "", 0, 0)  # changed in place: still keyed anew
    assert poller._keys_of(targets)[1][2] == ("ns", "b", "other")
    assert fair_order([], {}, 3) == []
