"""Stragglers from logs (issue 28): the rank consistently last, by how much, since when; nobody named
on healthy jitter, counter offsets, too few ranks or steps, or a lag that clocks can explain."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from collector.claims.stragglers import MIN_STEPS, Track, detect
from collector.cli import main
from collector.progress import scan_lines

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


def lockstep(n: int = 8, steps: int = 60, step_s: float = 10.0, slow: int | None = None, ratio: float = 0.0,
             from_step: int = 0, jitter: float = 0.03, seed: int = 1, node: str = "n0",
             hiccups: float = 0.0) -> list[Track]:
    """Ranks that synchronize every step: each prints step k once its own compute is done; the step
    ends when the slowest rank is done (the others wait in the collective)."""
    rng = random.Random(seed)
    t = T0
    at: list[list[datetime]] = [[] for _ in range(n)]
    for k in range(steps):
        done = []
        for r in range(n):
            c = step_s * (1 + rng.uniform(-jitter, jitter))
            if hiccups and rng.random() < hiccups:
                c *= 1 + rng.uniform(0.3, 1.0)  # one step 30-100 % longer (heavy-tailed noise)
            if r == slow and k >= from_step:
                c *= 1 + ratio
            done.append(c)
        for r in range(n):
            at[r].append(t + timedelta(seconds=done[r]))
        t += timedelta(seconds=max(done))
    return [Track(str(r), f"job-{r}", node, tuple(range(1, steps + 1)), tuple(at[r])) for r in range(n)]


def now_of(ts: list[Track]) -> datetime:
    return max(t.at[-1] for t in ts)


def test_a_lockstep_rank_15_percent_slower_is_named_with_its_lag_and_since() -> None:
    ts = lockstep(slow=5, ratio=0.15, from_step=20)
    got = detect(ts, now_of(ts))
    assert got is not None and [s.rank for s in got.suspects] == ["5"]
    s = got.suspects[0]
    assert s.basis == "arrival" and 0.10 < s.lag_ratio < 0.20 and s.lag_s is not None and 1.0 < s.lag_s < 2.0
    # since: the onset (step 21 printed), give or take a step
    assert s.since is not None and abs((s.since - ts[5].at[20]).total_seconds()) <= 25
    assert "rank 5" in got.reason and "last" in got.reason


def test_healthy_ranks_with_jitter_name_nobody_across_many_seeds() -> None:
    for seed in range(200):
        ts = lockstep(jitter=0.08, seed=seed)
        got = detect(ts, now_of(ts))
        assert got is not None and got.suspects == (), (seed, got.reason)
    assert "no rank apart" in got.reason


def test_noisy_healthy_ranks_few_of_them_name_nobody() -> None:
    """Few ranks agree closely by chance: their lags' spread alone is no yardstick; each step's own
    noise bounds how close a median of so many steps can be."""
    for seed in range(300):
        ts = lockstep(n=4 + 4 * (seed % 2), steps=40, jitter=0.2, hiccups=0.03, seed=seed)
        for now in (ts[0].at[20], now_of(ts)):
            got = detect(ts, now)
            assert got is not None and got.suspects == (), (seed, got.reason)
    ts = lockstep(n=4, steps=40, jitter=0.2, hiccups=0.03, slow=1, ratio=0.3, seed=1)
    got = detect(ts, now_of(ts))
    assert got is not None and [s.rank for s in got.suspects] == ["1"]


def test_too_few_ranks_or_steps_name_nobody() -> None:
    ts = lockstep(n=2, slow=1, ratio=0.5)
    got = detect(ts, now_of(ts))
    assert got is not None and got.suspects == () and "too few" in got.reason
    ts = lockstep(steps=MIN_STEPS - 2, slow=1, ratio=0.5)
    got = detect(ts, now_of(ts))
    assert got is not None and got.suspects == () and "needed" in got.reason
    assert detect(lockstep(n=1), T0 + timedelta(days=1)) is None


def test_a_log_lagging_whole_steps_at_equal_pace_is_no_straggler() -> None:
    ts = lockstep(jitter=0.0)
    # rank 3's counter (or its log) runs 2 steps behind at the same pace: lag of two steps
    t3 = ts[3]
    ts[3] = Track("3", t3.pod, t3.node, tuple(s - 2 for s in t3.steps[2:]), t3.at[2:])
    got = detect(ts, now_of(ts))
    assert got is not None and got.suspects == ()


def test_steps_not_known_yet_are_not_judged() -> None:
    ts = lockstep(slow=5, ratio=0.3, from_step=50)
    got = detect(ts, ts[0].at[45])
    assert got is not None and got.suspects == ()


def test_across_nodes_a_lag_clocks_could_explain_is_not_named() -> None:
    ts = lockstep(step_s=1.0, slow=2, ratio=0.15, jitter=0.0)  # 0.15 s behind: within clock tolerance
    ts = [Track(t.rank, t.pod, f"node-{t.rank}", t.steps, t.at) for t in ts]
    got = detect(ts, now_of(ts))
    assert got is not None and got.suspects == ()
    same = lockstep(step_s=1.0, slow=2, ratio=0.15, jitter=0.0)  # one node, one clock: decidable
    got = detect(same, now_of(same))
    assert got is not None and [s.rank for s in got.suspects] == ["2"]


def test_ranks_that_drift_apart_name_the_slow_pace() -> None:
    rng = random.Random(3)
    ts = []
    for r in range(6):
        per = 10.0 * (1.25 if r == 4 else 1.0)
        t, at = T0, []
        for _ in range(40):
            t += timedelta(seconds=per * (1 + rng.uniform(-0.03, 0.03)))
            at.append(t)
        ts.append(Track(str(r), f"w-{r}", f"n{r}", tuple(range(1, 41)), tuple(at)))
    got = detect(ts, now_of(ts))
    assert got is not None and [s.rank for s in got.suspects] == ["4"]
    assert got.suspects[0].basis == "pace" and 0.2 < got.suspects[0].lag_ratio < 0.3


def test_half_the_ranks_behind_is_no_single_straggler() -> None:
    ts = lockstep(n=8, jitter=0.01)
    for r in (1, 3, 5, 7):
        ts[r] = Track(ts[r].rank, ts[r].pod, ts[r].node, ts[r].steps, tuple(a + timedelta(seconds=2) for a in ts[r].at))
    got = detect(ts, now_of(ts))
    assert got is not None and got.suspects == ()


def test_rank_prefixed_lines_of_one_log_keep_every_ranks_pace() -> None:
    line = (" iteration {s:>8}/  250000 | consumed samples: {c:>12} | elapsed time per iteration (ms): 10012.2 | "
            "lm loss: 2.504220E+00 | loss scale: 1.0 | number of skipped iterations:   0 |")
    ts = lockstep(n=4, steps=30, slow=2, ratio=0.2)
    lines = sorted((t.at[k], f"[rank{t.rank}]:" + line.format(s=k + 1, c=(k + 1) * 1024))
                   for t in ts for k in range(30))
    scan = scan_lines([f"{a.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} {x}" for a, x in lines], source="t")
    assert [r.rank for r in scan.ranks] == [0, 1, 2, 3] and all(len(r.steps) == 30 for r in scan.ranks)
    assert scan.summary_of().seen == 30  # the progress stream is still rank 0's alone
    got = detect([Track(str(r.rank), "p", "n", r.steps, r.at) for r in scan.ranks], lines[-1][0])
    assert got is not None and [s.rank for s in got.suspects] == ["2"]
    # a reader that sends no paces (the node agent) parses only the progress stream, as before
    from collector.progress.scan import LineScanner

    sc = LineScanner("t", None, 1 << 20, paces=False)
    sc.feed_all([f"{a.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} {x}" for a, x in lines])
    quiet = sc.finish()
    assert quiet.ranks == () and quiet.samples == scan.samples and not sc.side


def test_explain_names_the_straggler_in_json_and_text_and_leaves_the_claims_alone(tmp_path: Path) -> None:
    """A dump: an indexed Job's pod whose log carries every rank's lines (torchrun --tee), stamped by
    the kubelet; rank 6 of 8 is 20 % slower from step 30 on."""
    from tests.claims.test_restarts import NS, explain, indexed_job, job_pod, megatron, run_of, stamp
    from tests.claims.test_restarts import T0 as JOB_T0
    from tests.dumpkit import write_dump

    job = indexed_job("train", JOB_T0)
    p = job_pod(job, "train-0-x7k2p", JOB_T0)
    start = JOB_T0 + timedelta(minutes=100)
    ts = lockstep(steps=60, slow=6, ratio=0.2, from_step=30)
    shift = start - T0
    lines = sorted((t.at[k] + shift, f"[rank{t.rank}]:{megatron(k + 1)}") for t in ts for k in range(60))
    log = "".join(f"{stamp(a)} {x}\n" for a, x in lines)

    def claims_of(text: str, d: str) -> tuple[dict[str, object], dict[str, object]]:
        dump = write_dump(tmp_path / d, [job, p], logs={(NS, p["metadata"]["name"]): text},
                          captured=lines[-1][0] + timedelta(seconds=5))
        run = run_of(explain(dump), "train")
        # the contract (docs/explain.md): every run entry has these keys, `stragglers` among them
        assert set(run) == {"namespace", "name", "kind", "uid", "finished", "claims", "blocked", "goodput",
                            "stragglers", "work_at_risk", "context"}
        if run["stragglers"] is not None:
            assert set(run["stragglers"]) == {"suspects", "compared", "steps", "reason", "untrusted_readings"}
            for x in run["stragglers"]["suspects"]:
                assert set(x) == {"kind", "rank", "pod", "node", "gpu", "lag_ratio", "lag_seconds", "since", "basis",
                                  "evidence"}
        return run["claims"], run["stragglers"]

    claims, st = claims_of(log, "d")
    assert claims["progressing"]["observed"] == "true"  # type: ignore[index]
    suspects = st["suspects"]
    assert isinstance(suspects, list) and [(x["kind"], x["rank"], x["basis"]) for x in suspects] == \
        [("rank", "6", "arrival")]
    s = suspects[0]
    assert 0.15 < s["lag_ratio"] < 0.25 and s["pod"] == "train-0-x7k2p" and s["node"] == "gpu-2"
    assert s["since"] is not None and st["compared"] == 8
    # rank 0's lines alone: the same claims, nobody to compare
    only0 = "".join(f"{stamp(a)} {x}\n" for a, x in lines if x.startswith("[rank0]:"))
    claims0, st0 = claims_of(only0, "e")
    assert claims0 == claims and st0 is None
    text = CliRunner().invoke(main, ["explain", "--from-dump", str(tmp_path / "d")])
    assert "straggler" in text.stdout and "rank 6" in text.stdout and "slower per step (arrival)" in text.stdout


def test_many_ranks_are_judged_against_all_of_them_and_stay_fast() -> None:
    import time

    ts = lockstep(n=96, steps=50, slow=40, ratio=0.12)
    t = time.perf_counter()
    got = detect(ts, now_of(ts))
    assert time.perf_counter() - t < 2.0
    assert got is not None and [s.rank for s in got.suspects] == ["40"] and got.compared == 96
    healthy = lockstep(n=96, steps=50, jitter=0.08, seed=5)
    got = detect(healthy, now_of(healthy))
    assert got is not None and got.suspects == ()


def test_the_controllers_history_joins_each_ranks_steps_across_polls() -> None:
    """A 500-line tail of a 64-rank log holds ~8 steps per rank: too few alone; the polls joined hold more."""
    from collector.progress.history import merge_history

    line = " iteration {s:>8}/  250000 | lm loss: 2.504220E+00 | loss scale: 1.0 |"
    ts = lockstep(n=64, steps=40, slow=9, ratio=0.2, from_step=10)
    lines = sorted((t.at[k], f"[rank{t.rank}]:" + line.format(s=k + 1)) for t in ts for k in range(40))
    text = [f"{a.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} {x}" for a, x in lines]
    held = None
    for end in [*range(500, len(text), 500), len(text)]:  # a poll per 500 new lines, each reading the last 500
        tail = scan_lines(text[max(0, end - 500):end], source="t")
        held = tail if held is None else merge_history(held, tail)
    assert held is not None and max(len(r.steps) for r in tail.ranks) <= 9
    got = detect([Track(str(r.rank), "p", "n", r.steps, r.at) for r in tail.ranks], lines[-1][0])
    assert got is not None and got.suspects == () and "needed" in got.reason
    assert len(held.ranks) == 64 and all(len(r.steps) >= 35 for r in held.ranks)
    assert all(list(r.steps) == sorted(set(r.steps)) for r in held.ranks)
    got = detect([Track(str(r.rank), "p", "n", r.steps, r.at) for r in held.ranks], lines[-1][0])
    assert got is not None and [s.rank for s in got.suspects] == ["9"]


def test_a_ray_heads_driver_reporting_after_its_workers_is_no_straggler() -> None:
    from collector.claims.stragglers import tracks
    from collector.correlate import Signal, build_index
    from collector.kube import normalize
    from collector.model import Ref
    from tests.claims.test_recheck_at import pod as mkpod
    from tests.claims.test_recheck_at import taurun

    ts = lockstep(n=4, jitter=0.02)
    head = ts[0]
    ts[0] = Track(head.rank, head.pod, head.node, head.steps, tuple(a + timedelta(seconds=2) for a in head.at))
    objs = [taurun(workers=4)]
    for i in range(4):
        p = mkpod(f"r-{i}")
        p["metadata"]["labels"].update({"ray.io/node-type": "head" if i == 0 else "worker", "ray.io/group": "gpu"})
        objs.append(p)
    index = build_index([n.record for n in map(normalize, objs) if n.record is not None])
    line = " iteration {s:>8}/  250000 | lm loss: 2.504220E+00 | loss scale: 1.0 |"
    for i, t in enumerate(ts):
        text = "".join(f"{a.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} {line.format(s=s)}\n"
                       for s, a in zip(t.steps, t.at, strict=True))
        index.set_signal(Signal(Ref("Pod", "ns", f"r-{i}"), "main", scan_lines(text.splitlines(), source="t"),
                                now_of(ts)))
    ev = index.evidence(Ref("TauRun", "ns", "r"))
    got = tracks(ev, ev.signals)
    assert sorted(t.pod for t in got) == ["r-1", "r-2", "r-3"]
    verdict = detect(got, now_of(ts))
    assert verdict is not None and verdict.suspects == ()
    # the same four as peers (no Ray head among them): the late one is named
    assert [s.pod for s in detect(ts, now_of(ts)).suspects] == ["job-0"]  # type: ignore[union-attr]
