"""A node agent's document reaches the loop in batches (`Controller.put_logs`): one queue entry and one
take from the log backlog for many containers, split at LOG_BATCH_WEIGHT, every change in its order,
the backlog's weight the same as one change at a time took and given back once the batch is applied."""

from __future__ import annotations

import queue
import random
import threading
from datetime import timedelta
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.controller import LOG_BATCH_WEIGHT, Controller
from collector.correlate import Signal
from collector.model import Ref
from collector.planes.base import Change, log_weight
from collector.progress import LogScan, ProgressSample
from collector.settings import ControllerSettings, Settings
from collector.sources.kube_api import KubeApi, api_client_for
from tests.controller.test_confirm_defer import NOW0, _looping, _wait


def _scan(rng: random.Random, i: int) -> LogScan:
    """A container's part of a document: most quiet (no sample), some a pass of steps, a few a long
    first tail (heavier than a batch)."""
    u = rng.random()
    n = 0 if u < 0.7 else rng.randrange(1, 60) if u < 0.95 else rng.randrange(LOG_BATCH_WEIGHT, 2 * LOG_BATCH_WEIGHT)
    samples = tuple(ProgressSample(k, NOW0, 2.0, k + 1, "megatron") for k in range(n))
    return LogScan(f"agent:n{i}", "megatron" if n else None, samples, (), (), (), n + 3)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1), st.integers(0, 400))
def test_a_documents_changes_are_queued_in_order_in_batches_of_their_weight(seed: int, n: int) -> None:
    rng = random.Random(seed)
    c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")),
                   Settings(controller=ControllerSettings(leader_election=False)), lambda: NOW0)
    sent = []
    for i in range(n):
        scan = _scan(rng, i)
        sent.append((Change("agent-log", None, (Signal(Ref("Pod", "ns", f"p{i}"), "main", scan, NOW0), None)), scan))
    queued: list[Change] = []
    done = threading.Event()

    def loop() -> None:  # as the loop: takes each queued change and gives its weight back once applied
        while not (done.is_set() and c._changes.empty()):
            try:
                q = c._changes.get(timeout=0.05)
            except queue.Empty:
                continue
            queued.append(q)
            c._log_backlog.give(q.weight)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    c.put_logs((ch, log_weight(scan)) for ch, scan in sent)  # (the backlog's budget, 20,000, spent and given back)
    done.set()
    t.join(10)
    inner = [x for q in queued for x in (q.payload if q.op == "batch" else (q,))]
    assert inner == [ch for ch, _ in sent] and all(a is b for a, (b, _) in zip(inner, sent, strict=True))
    total = sum(log_weight(scan) for _, scan in sent)
    assert sum(q.weight for q in queued) == total and c._log_backlog.held == 0
    for q in queued:
        parts = q.payload if q.op == "batch" else (q,)
        assert q.weight == sum(log_weight(x.payload[0].scan) for x in parts)
        assert q.weight <= LOG_BATCH_WEIGHT or len(parts) == 1  # (one heavier than a batch goes alone)
        assert all(x.weight == 0 for x in parts if x is not q)  # (the batch gives the weight back, once)
    # as few batches as that bound allows, taken greedily: each but the last could not take the next one
    for q, nxt in zip(queued, queued[1:], strict=False):
        first = (nxt.payload if nxt.op == "batch" else (nxt,))[0]
        assert q.weight + log_weight(first.payload[0].scan) > LOG_BATCH_WEIGHT


def test_the_loop_applies_an_agents_document_batched_as_its_changes() -> None:
    """The agents' pass as the poller queues it (its GPU parts, then each document's containers in a
    batch): the workers' quiet increments move their read times, the head's confirming steps defer the
    run's evaluation, and the backlog is given back whole."""
    with _looping(timedelta(seconds=120)) as (f, feed):
        t0 = f.c.claims[f.key].evaluated_at
        d0 = f.c._rechecks.deferrals
        for i in range(1, 3):
            f.move(30)
            for change in f.gpu_changes(100 + i):
                f.c.put(change)
            scan, after = feed.increment("ok", f.clock[0], 30, 0)
            doc = [(ch, ch.payload[0].scan) for ch in f.worker_changes()]
            doc.append((Change("agent-log", None, (Signal(f.head, f.container, scan, f.clock[0]), after)), scan))
            f.c.put_logs((ch, log_weight(scan)) for ch, scan in doc)
            assert _wait(partial(lambda n: f.c._rechecks.deferrals == n, d0 + i)), i
            assert _wait(lambda: f.c._log_backlog.held == 0)
            for ch, _ in doc[:-1]:  # every quiet worker read at this pass's instant
                sig = ch.payload[0]
                held = f.c.index.signal_of(sig.ref, sig.source)
                assert held is not None and held.read_at == f.clock[0]
        assert f.c.claims[f.key].evaluated_at == t0  # confirming: deferred, not evaluated at once
