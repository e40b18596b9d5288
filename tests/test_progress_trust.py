"""Progress that is really progress (issue 7): each class on real message text.

Log lines are real trainer/NCCL formats (tests/fixtures/training_logs, SOURCES.tsv), stamped as
`kubectl logs --timestamps` writes them, scanned by the real scanner and judged by the real engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from collector.claims import evaluate
from collector.correlate import Signal
from collector.model import Observed, Plane, Ref
from collector.progress import scan_text
from tests.progress.conftest import FIXTURES
from tests.test_progress_claims import NOW, POD, ROOT, S, run_with

TRAINING = FIXTURES / "training_logs"


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


def megatron(step: int, loss: str = "2.504220E+00", skipped: int = 0) -> str:
    # the fixture's line shape (epfLLM/Megatron-LLM #11)
    return (f" iteration {step:>8}/  250000 | consumed samples: {step * 1024:>12} | elapsed time per iteration (ms): "
            f"86545.2 | learning rate: 9.150E-06 | global batch size:  1024 | lm loss: {loss} | loss scale: 1.0 | "
            f"grad norm: 0.231 | number of skipped iterations: {skipped:>3} | number of nan iterations:   0 |")


def ds_step(step: int, skipped: int) -> str:
    # DeepSpeed steps_per_print (deepspeedai/DeepSpeed #931: "[Rank 0] step=510, skipped=8,")
    return (f"[2023-04-28 06:59:46,878] [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, skipped={skipped}, "
            "lr=[9.9e-05], mom=[(0.9, 0.999)]")


def log(lines: list[tuple[datetime, str]], source: str = "main", ref: Ref = POD) -> Signal:
    text = "".join(f"{stamp(t)} {line}\n" for t, line in lines)
    return Signal(ref, source, scan_text(text, source=source), NOW)


def claim(*signals: Signal, restarted_at: datetime | None = None):  # type: ignore[no-untyped-def]
    rc, _ = run_with(*signals, restarted_at=restarted_at)
    return rc.progressing, rc  # type: ignore[attr-defined]


# --- 1. the stall window is robust to one old outlier ------------------------------------------------
def test_one_past_checkpoint_pause_does_not_keep_two_silent_hours_verified() -> None:
    t0 = NOW - timedelta(hours=3)
    lines = [(t0 + timedelta(seconds=30 * i), megatron(100 + i)) for i in range(5)]
    resume = lines[-1][0] + timedelta(hours=1)  # a one-hour checkpoint save
    lines += [(resume + timedelta(seconds=30 * i), megatron(105 + i)) for i in range(6)]
    last = lines[-1][0]
    assert NOW - last > timedelta(hours=1, minutes=50)
    p, _ = claim(log(lines))
    assert p.observed is Observed.FALSE and p.reason.startswith("STALLED"), p.reason
    # the window says what it was built from, and that the outlier was clipped
    assert "p99 of last 10 step intervals, one 1h00m outlier clipped" in p.reason, p.reason
    # the same log, read a minute after its last line, is progressing
    fresh = [(t + (NOW - last) - timedelta(minutes=1), text) for t, text in lines]
    p, _ = claim(log(fresh))
    assert p.observed is Observed.TRUE and "window 3m15s: 3 × 1m00s from p99 of last 10 step intervals" in p.reason, \
        p.reason


def test_recurring_pauses_widen_the_window_up_to_the_ceiling() -> None:
    # every 10 steps a 10-minute evaluation: twice in the recent intervals, so not an outlier
    t = NOW - timedelta(hours=1)
    lines = []
    for i in range(25):
        lines.append((t, megatron(100 + i)))
        t += timedelta(minutes=10) if i % 10 == 9 else timedelta(seconds=30)
    last = lines[-1][0]

    def silent(minutes: float) -> list[tuple[datetime, str]]:
        return [(x + (NOW - last) - timedelta(minutes=minutes), text) for x, text in lines]

    # The pauses widen the window past the 30 s steps' own (3 × 30 s, floor 1 min) ...
    p, _ = claim(log(silent(4)))
    assert p.observed is Observed.TRUE, p.reason
    assert "outlier clipped" not in p.reason
    # ... but never past the ceiling: max(floor, min(10 × the 30 s median step, 30 min)) = 5 min,
    # not 3 × 10 min: twelve silent minutes are a stall, whatever the run did before.
    p, _ = claim(log(silent(12)))
    assert p.observed is Observed.FALSE and "ceiling 5m00s" in p.reason, p.reason
    # A profile whose runs pause for long evaluations by design sets its own ceiling.
    _, ev = run_with(log(silent(12)))
    long_evals = replace(S, stall_ceiling_by_profile={"p": timedelta(minutes=35)})
    p = evaluate(ev, NOW, long_evals).progressing  # type: ignore[arg-type]
    assert p.observed is Observed.TRUE, p.reason
    assert "window 30m: 3 × 10m" in p.reason, p.reason  # 3 × the pauses, under the 35 min ceiling


def test_a_sidecar_that_prints_never_widens_or_stands_for_the_trainer() -> None:
    """A log shipper beside the trainer prints its own counter every 5 minutes; the trainer (the GPU
    container) steps every 10 s and stopped 3 minutes ago: stalled on its own window, and the
    sidecar's lines are not the run's progress."""
    trainer = [(NOW - timedelta(minutes=13) + timedelta(seconds=10 * i), megatron(100 + i)) for i in range(60)]
    shipper = [(NOW - timedelta(minutes=60) + timedelta(minutes=5 * i), megatron(1000 + i)) for i in range(13)]
    rc, _ = run_with(log(trainer, "main"), log(shipper, "shipper"), sidecars=("shipper",))
    p = rc.progressing  # type: ignore[attr-defined]
    assert p.observed is Observed.FALSE and p.reason.startswith("STALLED 3m"), p.reason
    assert "window 1m15s" in p.reason, p.reason  # the trainer's own: floor 1 min + a scrape


# --- 2. validity ---------------------------------------------------------------------------------------
def test_deepspeed_steps_mostly_skipped_are_not_progress() -> None:
    t0 = NOW - timedelta(minutes=30)
    lines = [(t0 + timedelta(minutes=i), ds_step(10 * (i + 1), 0)) for i in range(10)]
    # fp16 overflow: `skipped=` rises with `step=`, 7 of every 10 steps skipped
    lines += [(t0 + timedelta(minutes=10 + i), ds_step(110 + 10 * i, 7 * (i + 1))) for i in range(12)]
    sig = log(lines)
    assert [x.skipped for x in sig.scan.samples[-12:]] == [True] * 12
    p, _ = claim(sig)
    assert p.observed is Observed.FALSE, p.reason
    assert "skipped" in p.reason and "fp16 overflow" in p.reason and "last real step 100" in p.reason
    assert p.cause == "skipped-steps"
    assert {e.field: e.value for e in p.evidence}["skipped_steps"] == 12


def test_deepspeed_per_step_lines_with_most_steps_skipped_are_not_progress() -> None:
    # one line per step; 4 of every 5 steps overflow, so a real update still appears every 5 steps
    t0 = NOW - timedelta(minutes=10)
    lines, skipped = [], 0
    for i in range(1, 41):
        skipped += 0 if i % 5 == 0 else 1
        lines.append((t0 + timedelta(seconds=15 * i), ds_step(i, skipped)))
    p, _ = claim(log(lines))
    assert p.observed is Observed.FALSE, p.reason
    assert "of the last 20 step reports skipped" in p.reason and "fp16 overflow" in p.reason, p.reason
    # the same cadence with one step in five skipped is progress
    lines, skipped = [], 0
    for i in range(1, 41):
        skipped += 1 if i % 5 == 0 else 0
        lines.append((t0 + timedelta(seconds=15 * i), ds_step(i, skipped)))
    p, _ = claim(log(lines))
    assert p.observed is Observed.TRUE, p.reason


def test_hf_bar_advancing_while_every_step_overflows_is_not_progress() -> None:
    # huggingface/transformers #14531: the bar moves, every step is a DeepSpeed overflow skip
    scan = scan_text((TRAINING / "hf_bar_then_deepspeed_overflow_transformers_14531.txt").read_bytes(), source="t")
    assert scan.samples and all(x.skipped for x in scan.samples)
    # the overflow printed after the bar keeps its own timestamp
    assert [x.at.strftime("%H:%M:%S.%f")[:-3] if x.at else None for x in scan.samples] == \
        ["00:36:54.800", "00:36:55.194", "00:36:55.588", "00:36:55.985"]


def test_loss_stuck_at_zero_is_not_progress() -> None:
    t0 = NOW - timedelta(minutes=5)
    lines = []
    for i in range(1, 9):
        loss = "2.1503" if i <= 4 else "0.0"
        lines.append((t0 + timedelta(seconds=30 * i), f" {i}%|█         | {i}/100 [00:{i:02d}<01:30,  1.00it/s]"))
        lines.append((t0 + timedelta(seconds=30 * i, milliseconds=5),
                      f"{{'loss': {loss}, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.{i}}}"))
    p, _ = claim(log(lines))
    assert p.observed is Observed.FALSE and "loss stuck at exactly 0.0 since step 5" in p.reason, p.reason
    assert p.cause == "invalid-steps"


def test_non_finite_loss_in_a_megatron_line_is_not_progress() -> None:
    t0 = NOW - timedelta(minutes=5)
    lines = [(t0 + timedelta(seconds=30 * i), megatron(100 + i)) for i in range(5)]
    lines += [(t0 + timedelta(seconds=30 * (5 + i)), megatron(105 + i, loss="nan")) for i in range(3)]
    p, _ = claim(log(lines))
    assert p.observed is Observed.FALSE and "loss is nan since step 105" in p.reason, p.reason
    assert p.cause == "invalid-steps"


# --- 3. Hugging Face loss dicts carry no step --------------------------------------------------------
def test_loss_dicts_without_a_step_are_activity_with_a_null_step() -> None:
    t0 = NOW - timedelta(minutes=5)
    lines = [(t0 + timedelta(seconds=40 * i), f"{{'loss': {2.5 - i / 10:.4f}, 'grad_norm': 1.2, "
                                                f"'learning_rate': 5e-05, 'epoch': 0.{i}}}") for i in range(6)]
    p, _ = claim(log(lines))
    assert p.observed is Observed.TRUE, p.reason
    assert "activity (loss dict, no step number)" in p.reason and "step 6" not in p.reason
    last_step = [e for e in p.evidence if e.field == "last_step"]
    assert last_step and last_step[0].value is None
    assert json.loads(json.dumps(last_step[0].to_json()))["value"] is None


# --- 4. progress bars ----------------------------------------------------------------------------------
def test_bar_followed_by_nccl_watchdog_on_the_same_line() -> None:
    # pytorch/pytorch #118369: a Lightning frame, then the watchdog error, on one line
    scan = scan_text((TRAINING / "lightning_bar_then_nccl_watchdog_pytorch_118369.txt").read_bytes(), source="t")
    assert [(x.step, x.loss) for x in scan.samples] == [(32040, 2.6)]
    assert [(h.line, h.rank, h.seq) for h in scan.hangs][:2] == [(1, 0, 96120), (2, 0, 96117)]
    assert scan.hangs[-1].rank == 7 and scan.hangs[-1].seq == 64088


def test_bar_frames_joined_by_carriage_returns_with_a_loss_dict_and_an_nccl_error() -> None:
    line = ("\r 50%|█████     | 90/180 [01:30<01:30,  1.00it/s]\r 50%|█████     | 91/180 [01:31<01:29,  1.00it/s]"
            "{'loss': 1.87, 'grad_norm': 0.9, 'learning_rate': 4e-05, 'epoch': 0.5}\r"
            " 51%|█████     | 92/180 [01:32<01:28,  1.00it/s][rank0]:[E321 02:07:08.408271257 "
            "ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, "
            "OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 "
            "milliseconds before timing out.")
    scan = scan_text(line + "\n", source="t")
    assert [(x.step, x.loss, x.total) for x in scan.samples] == [(91, 1.87, 180), (92, None, 180)]
    assert [(h.kind, h.rank, h.seq) for h in scan.hangs] == [("nccl-watchdog-timeout", 0, 1580)]


def test_bars_behind_a_launcher_prefix_count_and_logger_validation_bars_do_not() -> None:
    ray = ("(RayTrainWorker pid=2172, ip=10.0.0.3)  22%|██▏       | 40/180 [00:17<01:02,  2.3it/s]\n"
           "(RayTrainWorker pid=2172, ip=10.0.0.3) {'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, "
           "'epoch': 0.5}\n"
           "(RayTrainWorker pid=2172, ip=10.0.0.3)  23%|██▎       | 41/180 [00:18<01:01,  2.3it/s]\n")
    scan = scan_text(ray, source="t")
    assert [(x.step, x.loss, x.total) for x in scan.samples] == [(40, 2.31, 180), (41, None, 180)]
    logged = ("2023-06-14 22:33:06,424 - INFO:  24%|##3       | 40/170 [00:24<01:20, 6.17s/it]\n"
              "I0614 22:33:12.688123 140 trainer.py:88]  25%|##4       | 41/170 [00:25<01:19, 6.16s/it]\n"
              "{'loss': 2.05, 'grad_norm': 0.7, 'learning_rate': 5e-05, 'epoch': 0.24}\n")
    assert [(x.step, x.loss) for x in scan_text(logged, source="t").samples] == [(41, 2.05)]
    # h2oai/h2o-llmstudio #162: a validation bar written through a logger
    val = scan_text((TRAINING / "validation_bar_behind_logger_prefix_h2o_llmstudio_162.txt").read_bytes(), source="t")
    assert val.samples == ()


def test_evaluation_bar_with_the_training_total_is_not_mixed_in() -> None:
    lines = [" 10%|█         | 10/100 [00:10<01:30,  1.00it/s]",
             "{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}"]
    # an evaluation pass whose bar has the same length (100 batches) as training (100 steps)
    lines += [f"{i}%|{'█' * (i // 10):<10}| {i}/100 [00:0{i % 10}<00:00, 50.0it/s]" for i in (5, 50, 100)]
    lines += ["{'eval_loss': 2.9, 'eval_runtime': 2.0, 'epoch': 0.1}",
              " 11%|█         | 11/100 [00:11<01:29,  1.00it/s]"]
    scan = scan_text("\n".join(lines) + "\n", source="t")
    assert [x.step for x in scan.samples] == [10, 11]


# --- 5 and 9. a hang is positive evidence, with its suspect ----------------------------------------
def test_watchdog_with_no_step_lines_is_a_hang_not_unknown() -> None:
    text = (TRAINING / "nccl_watchdog_timeout_torch2x_format_llamafactory_7396.txt").read_text()
    t = NOW - timedelta(minutes=2)
    p, _ = claim(log([(t, line) for line in text.splitlines()]))
    assert p.observed is Observed.FALSE, p.reason
    assert p.reason.startswith("HUNG: nccl watchdog timeout: ALLREDUCE timed out after 600000 ms"), p.reason
    assert p.cause == "hung"


def test_watchdog_that_pushed_the_step_lines_out_of_the_tail_is_a_hang(tmp_path: Path) -> None:
    from collector.progress import scan_path

    t0 = NOW - timedelta(minutes=30)
    steps = [(t0 + timedelta(seconds=20 * i), megatron(100 + i)) for i in range(30)]
    dump = (TRAINING / "nccl_watchdog_timeout_torch2x_format_llamafactory_7396.txt").read_text().splitlines()
    hang = [(NOW - timedelta(minutes=3), line) for line in dump * 40]  # every rank's dump, repeated
    path = tmp_path / "main.log"
    path.write_text("".join(f"{stamp(t)} {line}\n" for t, line in steps + hang))
    tail = scan_path(path, max_bytes=16_384)  # the tail the controller reads holds no step line
    assert tail.samples == () and tail.hangs
    p, _ = claim(Signal(POD, "main", tail, NOW))
    assert p.observed is Observed.FALSE and p.reason.startswith("HUNG: nccl watchdog timeout"), p.reason
    assert p.cause == "hung"


def test_hang_names_the_rank_furthest_behind_and_its_pod() -> None:
    # pytorch/pytorch #118369: rank 7 is at SeqNum 64088 while rank 0 is past 96117
    text = (TRAINING / "lightning_bar_then_nccl_watchdog_pytorch_118369.txt").read_text()
    t = NOW - timedelta(minutes=1)
    p, _ = claim(log([(t, line) for line in text.splitlines()]))
    assert p.observed is Observed.FALSE
    assert "suspect rank 7 (pod r-0 on node n) at SeqNum 64088, others up to 96117" in p.reason, p.reason
    suspects = [e for e in p.evidence if e.field == "hang_suspect"]
    assert [e.ref for e in suspects] == ["r-0/main"] and "rank 7" in suspects[0].value


def test_hang_suspect_across_pods() -> None:
    watchdog = ("[rank{r}]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
                "Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")
    t = NOW - timedelta(minutes=1)
    a = log([(t, watchdog.format(r=0, seq=1580))])
    b = log([(t, watchdog.format(r=1, seq=1577))], ref=Ref("Pod", "ns", "r-1"))
    from collector.claims.progressing import _suspects

    suspects = _suspects([(sig, h) for sig in (a, b) for h in sig.scan.hangs])
    assert [s[0] for s in suspects] == ["rank 1 (pod r-1) at SeqNum 1577, others up to 1580"]


# --- 6 and 7. high-water marks per signal; restarts ---------------------------------------------------
def test_a_lagging_rank_is_not_replay() -> None:
    t0 = NOW - timedelta(minutes=10)
    rank0 = log([(t0 + timedelta(seconds=20 * i), megatron(100 + i)) for i in range(30)], source="main")
    rank1 = log([(t0 + timedelta(seconds=20 * i + 5), megatron(90 + i)) for i in range(30)], source="worker")
    p, _ = claim(rank0, rank1)
    assert p.observed is Observed.TRUE, p.reason
    assert not [e for e in p.evidence if e.field == "replayed_steps"]


def test_a_ray_counter_on_another_scale_is_not_a_restart() -> None:
    t0 = NOW - timedelta(minutes=10)
    logs = log([(t0 + timedelta(seconds=20 * i), megatron(100 + i)) for i in range(30)])
    ray = log([(t0 + timedelta(seconds=20 * i + 3), megatron(4000 + 32 * i)) for i in range(30)],
              source="ray-metrics", ref=Ref("RayCluster", "ns", "rc"))
    from collector.claims.progress import analyze
    from tests.test_progress_claims import S

    view = analyze([ray, logs], S, NOW)
    assert view.replayed == 0 and view.high_water == {"r-0/main": 129, "rc/ray-metrics": 4000 + 32 * 29}


def test_recent_restart_does_not_force_false_once_steps_pass_the_old_mark() -> None:
    from collector.claims.progress import analyze
    from tests.test_progress_claims import S

    restart = NOW - timedelta(minutes=8)
    before = [(NOW - timedelta(minutes=25) + timedelta(seconds=20 * i), megatron(100 + i)) for i in range(40)]
    # high-water mark 139; restored from step 130, replays 130..138 (139 is the mark), then 140..149
    after = [(restart + timedelta(minutes=1, seconds=20 * i), megatron(130 + i)) for i in range(10)]
    after += [(restart + timedelta(minutes=1, seconds=20 * (10 + i)), megatron(140 + i)) for i in range(10)]
    view = analyze([log(before + after)], S, NOW)
    assert view.replayed == 9 and view.last_step == 149
    last = view.advances[-1]
    assert last.step == 149 and NOW - last.at <= view.window  # advancing again: not stalled
    # the first step past the old mark closes the replay; the restart gap does not stretch the window
    resumed = [a for a in view.advances if a.replay_from is not None]
    assert [a.step for a in resumed] == [140] and view.window < timedelta(minutes=2)
    # the same, judged as a claim once the restart is older than the running claim's restart window
    p, rc = claim(log(before + after), restarted_at=NOW - S.restart_window - timedelta(seconds=1))
    assert p.observed is Observed.TRUE and "step 149" in p.reason, p.reason
    assert rc.goodput.badput_s["replaying"] > 0


def test_recent_restart_recovered_past_the_old_mark_keeps_running_and_progressing_true() -> None:
    restart = NOW - timedelta(minutes=8)  # inside the running claim's restart window
    before = [(NOW - timedelta(minutes=25) + timedelta(seconds=20 * i), megatron(100 + i)) for i in range(40)]
    after = [(restart + timedelta(minutes=1, seconds=20 * i), megatron(130 + i)) for i in range(20)]  # → 149
    p, rc = claim(log(before + after), restarted_at=restart)
    assert rc.running.observed is Observed.TRUE, rc.running.reason
    recovered = [e for e in rc.running.evidence if "recovered" in str(e.value)]
    assert recovered and recovered[0].at == restart
    assert p.observed is Observed.TRUE and "step 149" in p.reason, p.reason


def test_recent_restart_still_replaying_is_not_running() -> None:
    restart = NOW - timedelta(minutes=8)
    before = [(NOW - timedelta(minutes=25) + timedelta(seconds=20 * i), megatron(100 + i)) for i in range(40)]
    after = [(restart + timedelta(minutes=1, seconds=20 * i), megatron(120 + i)) for i in range(19)]  # ≤ 138 < 139
    p, rc = claim(log(before + after), restarted_at=restart)
    assert rc.running.observed is Observed.FALSE and "restarted" in rc.running.reason, rc.running.reason
    assert p.observed is Observed.FALSE


# --- 8. goodput: before the first evidence is unobserved -------------------------------------------
def test_time_before_the_first_log_line_is_unobserved() -> None:
    t0 = NOW - timedelta(minutes=10)  # the log tail starts here; the pod was scheduled hours ago
    lines = [(t0, "INFO:megatron.core.datasets.blended_megatron_dataset_builder:Building dataset splits")]
    lines += [(t0 + timedelta(minutes=2, seconds=30 * i), megatron(100 + i)) for i in range(16)]
    _, rc = claim(log(lines))
    g = rc.goodput
    scheduled = NOW - timedelta(hours=3) + timedelta(minutes=1)
    assert math.isclose(g.badput_s["unobserved"], (t0 - scheduled).total_seconds())
    assert math.isclose(g.badput_s["starting"], 120)
    inside = g.productive_s + sum(v for k, v in g.badput_s.items() if k != "queued")
    assert math.isclose(inside, g.allocated_s)


def test_checkpoint_evidence_plane_is_kept() -> None:
    # sanity: the helpers above build log signals on the logs plane
    assert log([(NOW, megatron(1))]).plane is Plane.LOGS and ROOT.kind == "TauRun"


# --- XID findings in the run's own logs name the cause of a stall ------------------------------------
def test_an_xid_logged_after_the_last_step_is_named_in_the_stall() -> None:
    t0 = NOW - timedelta(minutes=20)
    lines = [(t0 + timedelta(seconds=20 * i), megatron(100 + i)) for i in range(20)]
    xid = (FIXTURES / "xid_nvsmi" / "dmesg_xid119_gsp_rpc_timeout_h100_gpud.log").read_text().splitlines()[2]
    xid = xid.split("] ", 1)[1]  # the NVRM text, as the driver's forwarded message reaches a container log
    lines.append((lines[-1][0] + timedelta(seconds=5), xid))
    p, _ = claim(log(lines))
    assert p.observed is Observed.FALSE and p.reason.startswith("STALLED"), p.reason
    assert "GPU Xid 119 in r-0" in p.reason, p.reason
    ev = [e for e in p.evidence if e.field == "xid"]
    assert ev and ev[0].value.startswith("Xid 119 on 0000:9b:00")
    # an XID before the last step is history, not the cause
    early = [lines[0], (lines[0][0] + timedelta(seconds=1), xid), *lines[1:20]]
    p, _ = claim(log(early))
    assert not [e for e in p.evidence if e.field == "xid"]
