"""Which container logs a poll pass reads (collector/logrotation.py): progress-carrying containers
every pass, quiet ones every few passes, a new or restarted one at once; and the live poller
reading a run that way through the simulator's log endpoint."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from collector.controller import Controller
from collector.logrotation import RESYNC, LogRotation, last_stamp, slot_of
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.server import Simulator
from tests.controller.test_controller import T0, Clock, apply_run, settings, wait_until

HEAD, QUIET = ("ns", "run-head", "main"), ("ns", "run-w1", "main")


def _passes(rot: LogRotation, passes: int, progress: dict[tuple[str, str, str], bool]) -> list[set[str]]:
    """The pods read in each pass."""
    out = []
    for _ in range(passes):
        rot.begin_pass(progress)
        read = set()
        for key, has_steps in progress.items():
            if rot.due(key, restarted=False):
                rot.read(key, has_steps)
                read.add(key[1])
        out.append(read)
    return out


def test_progress_every_pass_quiet_ones_every_nth_spread_evenly() -> None:
    quiet = {("ns", f"run-w{i}", "main"): False for i in range(400)}
    passes = _passes(LogRotation(4), 13, {HEAD: True, **quiet})
    assert all("run-head" in p for p in passes)
    assert len(passes[0]) == 401  # all read once at first
    for p in passes[1:]:  # then a quarter of the quiet ones each pass, not all of them every fourth
        assert 70 <= len(p) - 1 <= 130, [len(p) for p in passes]
    for key in quiet:  # each exactly every 4 passes after its first slot, never more than 4 apart
        at = [i for i, p in enumerate(passes) if key[1] in p]
        assert at[0] == 0 and 1 <= at[1] <= 4 and all(b - a == 4 for a, b in zip(at[1:], at[2:], strict=False)), at
    assert all(len(p) == 401 for p in _passes(LogRotation(1), 3, {HEAD: True, **quiet}))


def test_a_runs_quiet_containers_share_its_slot_and_runs_spread_over_the_passes() -> None:
    """With its run's slot, a run's quiet ranks are read in the same pass (one re-evaluation of the run,
    one deadline where their evidence ages), and each pass still reads about an even share of the runs."""
    runs = {f"run{r}": slot_of(f"Job\x1fns\x1frun{r}") for r in range(200)}
    keys = {("ns", f"{run}-w{i}", "main"): slot for run, slot in runs.items() for i in range(9)}
    rot = LogRotation(4)
    passes: list[set[str]] = []
    for _ in range(13):
        rot.begin_pass(keys)
        read = set()
        for key, slot in keys.items():
            if rot.due(key, restarted=False, slot=slot):
                rot.read(key, progress=False)
                read.add(key[1])
        passes.append(read)
    assert len(passes[0]) == len(keys)
    for p in passes[1:]:
        by_run = Counter(pod.rsplit("-w", 1)[0] for pod in p)
        assert set(by_run.values()) <= {9}, by_run  # whole runs, never a part of one
        assert 30 <= len(by_run) <= 70, [len(x) for x in passes]  # about a quarter of the 200 runs
    for run in runs:  # each run every 4 passes after its first slot
        at = [i for i, p in enumerate(passes) if f"{run}-w0" in p]
        assert at[0] == 0 and 1 <= at[1] <= 4 and all(b - a == 4 for a, b in zip(at[1:], at[2:], strict=False)), at
    # without a slot each container keeps its own: a run's ranks fall in different passes
    rot = LogRotation(4)
    spread = []
    for _ in range(5):
        rot.begin_pass(keys)
        spread.append({key[1] for key in keys if rot.due(key, restarted=False) and not rot.read(key, False)})
    assert any(0 < sum(f"run0-w{i}" in p for i in range(9)) < 9 for p in spread[1:])


def test_new_restarted_and_failed_reads_are_due_at_once() -> None:
    rot = LogRotation(10)
    rot.begin_pass([QUIET])
    assert rot.due(QUIET, restarted=False)  # never read
    rot.read(QUIET, progress=False)
    assert not rot.due(QUIET, restarted=False)  # not twice in a pass
    assert rot.due(QUIET, restarted=True)  # restarted since: its previous log is read now, not passes later
    rot.failed(QUIET)
    assert rot.due(QUIET, restarted=False)
    rot.read(QUIET, progress=False)
    rot.begin_pass([])  # no longer polled: forgotten
    rot.begin_pass([QUIET])
    assert rot.due(QUIET, restarted=False)


def test_a_container_that_starts_printing_steps_is_read_every_pass_from_then() -> None:
    rot = LogRotation(3)
    rot.begin_pass([QUIET])
    rot.read(QUIET, progress=False)
    gaps = 0
    while True:
        rot.begin_pass([QUIET])
        gaps += 1
        if rot.due(QUIET, restarted=False):
            break
    assert 1 <= gaps <= 3
    rot.read(QUIET, progress=True)
    for _ in range(3):
        rot.begin_pass([QUIET])
        assert rot.due(QUIET, restarted=False)


def test_quiet_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="quiet_every must be at least 1"):
        LogRotation(0)


WATCHDOG = ("[rank2]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 2] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
            "Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")


def test_live_poller_reads_the_quiet_ranks_less_and_still_sees_their_hang() -> None:
    """Rank 0 prints steps, ranks 1 and 2 print nothing: rank 0 is read every pass, the others
    every third; a watchdog timeout that rank 2 prints later still reaches the run's evidence."""
    clock = Clock(T0)
    with Simulator(watch_window=50, clock=clock) as sim:
        sim.start()
        apply_run(sim, "llm", workers=3)  # profile a100-2x8
        for i in range(5):
            at = T0 - timedelta(seconds=50 - 10 * i)
            sim.store.append_log("research", "llm-w0", "main", [f"[{at:%H:%M:%S}] my-trainer step={i + 1}"], at)
        api = KubeApi(api_client_for(sim.base_url))
        reads: Counter[str] = Counter()
        get_text = api.get_text

        def counted(path: str, query: Any = ()) -> bytes:
            if path.endswith("/log"):
                reads[path.split("/")[-2]] += 1
            out: bytes = get_text(path, query)
            return out
        api.get_text = counted  # type: ignore[method-assign]
        # (the rotation alone: with the settled-run skip, a true run's rank 0 also waits for its window,
        # which this standing clock never nears; tests/controller/test_log_budget.py tests that skip)
        c = Controller(api, settings(log_poll_interval=timedelta(seconds=0.1), log_quiet_every=3,
                                     log_regex_by_profile={"a100-2x8": r"step=(?P<step>\d+)"},
                                     log_skip_settled=False), clock.now)
        c.open()
        try:
            wait_until(lambda: reads["llm-w0"] >= 13, what="13 passes")
            w0, w1, w2 = reads["llm-w0"], reads["llm-w1"], reads["llm-w2"]
            assert 3 <= w1 <= w0 / 3 + 2 and 3 <= w2 <= w0 / 3 + 2, reads
            sim.store.append_log("research", "llm-w2", "main", [WATCHDOG], T0)

            def hang_seen() -> bool:
                rc = next(r for r in c.claims.values() if r.ref.name == "llm")
                return any(h.kind == "nccl-watchdog-timeout" for sig in c.index.evidence(rc.ref).signals
                           if sig.ref.name == "llm-w2" for h in sig.scan.hangs)
            before = reads["llm-w0"]
            wait_until(hang_seen, what="rank 2's watchdog timeout in the run's evidence")
            assert reads["llm-w0"] - before <= 3 + 2  # within one rotation (and a pass in flight)
        finally:
            c.close()


def test_reads_after_the_first_ask_for_the_lines_since_the_last_one() -> None:
    rot = LogRotation(4)
    rot.begin_pass([HEAD])
    assert rot.since(HEAD) is None  # never read: the whole tail
    rot.read(HEAD, progress=True, last_line="2026-01-10T10:00:09.123456789Z")
    wholes = 0
    for _ in range(4 * RESYNC):
        rot.begin_pass([HEAD])
        since = rot.since(HEAD)
        if since is None:
            wholes += 1
        else:
            assert since == "2026-01-10T10:00:09Z"  # whole seconds: that second's lines come again
        rot.read(HEAD, progress=False)  # nothing new: the last line read stands, so does "progress"
    assert wholes == 4  # one read in RESYNC is whole again, so a log that went back is not missed
    rot.begin_pass([HEAD])
    assert rot.due(HEAD, restarted=False)  # it carried progress once: every pass, steps or not
    rot.failed(HEAD)
    assert rot.since(HEAD) is None  # after a failed read, the whole tail again


def test_an_answer_like_the_one_before_is_unchanged() -> None:
    rot = LogRotation(4)
    rot.begin_pass([HEAD])
    body = b"2026-01-10T10:00:09.1Z step=3\n"
    rot.read(HEAD, progress=True, last_line="2026-01-10T10:00:09.1Z", data=body)  # a whole read
    assert not rot.unchanged(HEAD, "2026-01-10T10:00:09Z", body)  # another question than the read before
    assert rot.unchanged(HEAD, None, body)  # the same whole tail again: nothing new
    rot.read(HEAD, progress=False, since="2026-01-10T10:00:09Z", data=body)
    assert rot.unchanged(HEAD, "2026-01-10T10:00:09Z", body)
    assert not rot.unchanged(HEAD, "2026-01-10T10:00:09Z", body + b"2026-01-10T10:00:09.2Z step=4\n")
    assert not rot.unchanged(HEAD, "2026-01-10T10:00:10Z", body)  # another since: another question
    rot.read(HEAD, progress=False, since="2026-01-10T10:00:09Z", data=None)  # a previous log came with it
    assert not rot.unchanged(HEAD, "2026-01-10T10:00:09Z", body)
    rot.read(QUIET, progress=False, data=b"")  # a log with no line yet
    assert rot.unchanged(QUIET, None, b"") and not rot.unchanged(QUIET, None, body)


@pytest.mark.parametrize(("data", "stamp"), [
    (b"2026-01-10T10:00:01.5Z a\n2026-01-10T10:00:09.123456789Z step=3\n", "2026-01-10T10:00:09.123456789Z"),
    (b"2026-01-10T10:00:09Z no newline at the end", "2026-01-10T10:00:09Z"),
    (b"2026-01-10T10:00:09.1Z only\n", "2026-01-10T10:00:09.1Z"),
    (b"", None),
    (b"\n", None),
    (b"no timestamps here\n", None),
    (b"2026-01-10 10:00:09 step=3\n", None),  # not the kubelet's prefix
    (b"x" * 100_000 + b"\n", None),
])
def test_last_stamp_reads_the_kubelet_prefix_of_the_last_line(data: bytes, stamp: str | None) -> None:
    assert last_stamp(data) == stamp


def test_live_poller_reads_only_new_lines_and_keeps_the_whole_history() -> None:
    """After its first read, the poller asks the simulator's log endpoint for the lines since the
    last one; polls that find nothing new keep what the signal holds; every step stays counted."""
    clock = Clock(T0)
    with Simulator(watch_window=50, clock=clock) as sim:
        sim.start()
        apply_run(sim, "llm", workers=1)

        def steps(first: int, n: int, base: int) -> None:
            for i in range(first, first + n):
                at = T0 - timedelta(seconds=base - 10 * (i - first))
                sim.store.append_log("research", "llm-w0", "main", [f"[{at:%H:%M:%S}] my-trainer step={i}"], at)
        steps(1, 5, 300)
        api = KubeApi(api_client_for(sim.base_url))
        queries: list[dict[str, Any]] = []
        get_text = api.get_text

        def recorded(path: str, query: Any = ()) -> bytes:
            out: bytes = get_text(path, query)
            if path.endswith("/llm-w0/log"):
                queries.append({**dict(query), "lines": out.count(b"\n")})
            return out
        api.get_text = recorded  # type: ignore[method-assign]
        c = Controller(api, settings(log_poll_interval=timedelta(seconds=0.1),
                                     log_regex_by_profile={"a100-2x8": r"step=(?P<step>\d+)"}), clock.now)
        c.open()
        try:
            wait_until(lambda: len(queries) >= 6, what="six reads")
            assert "sinceTime" not in queries[0] and queries[0]["lines"] == 5
            quiet = [q for q in queries[1:6] if "sinceTime" in q]
            assert quiet and all(q["lines"] == 1 for q in quiet)  # the last line's second, nothing more

            def signal() -> Any:
                return next(s for s in c.index.evidence(next(iter(c.claims.values())).ref).signals
                            if s.ref.name == "llm-w0")
            first_read = signal().read_at
            # reads that find nothing new (the same answer as the read before) move only the read time
            held = signal().scan
            clock.advance(1)
            n = len(queries)
            wait_until(lambda: len(queries) >= n + 2 and signal().read_at > first_read, what="a fresher read")
            assert signal().scan is held
            steps(6, 5, 200)
            wait_until(lambda: signal().scan.samples and signal().scan.samples[-1].step == 10, what="step 10")
            sig = signal()
            assert [s.step for s in sig.scan.samples] == list(range(1, 11))  # the history and the new lines
            assert sig.read_at >= first_read
            since_reads = [q for q in queries if "sinceTime" in q]
            assert since_reads and max(q["lines"] for q in since_reads) <= 6  # never the whole log again...
            assert len(since_reads) >= len(queries) * (RESYNC - 2) / RESYNC - 2  # ... but one read in RESYNC
        finally:
            c.close()
