"""torchtitan, NeMo 2, NeMo Automodel and Megatron-LM validation blocks, on real logs (issue "Claims
that fail closed by construction"); provenance of every fixture in tests/fixtures/SOURCES.tsv.

Each format: exact steps, losses, lines and timestamps; which lines must never be training samples
(validation, evaluation, placeholders); and checkpoint-resume lines where the trainer prints them.
"""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from pathlib import Path

from collector.progress import scan_lines, scan_path, scan_report, scan_text
from collector.progress.model import FORMATS, ResumeFinding

TRAINING = "training_logs"


def _rows(fixtures: Path, name: str) -> list[tuple[int | None, float | None, int]]:
    scan = scan_path(fixtures / TRAINING / name)
    return [(s.step, s.loss, s.line) for s in scan.samples]


def test_every_training_log_fixture_has_its_provenance(fixtures: Path) -> None:
    with open(fixtures / "SOURCES.tsv", newline="") as f:
        listed = {row["file"] for row in csv.DictReader(f, delimiter="\t")}
    files = {f"{TRAINING}/{p.name}" for p in (fixtures / TRAINING).iterdir() if p.is_file()}
    assert files - listed == set()


# -- torchtitan -----------------------------------------------------------------------------------
def test_torchtitan_steps_behind_rank_tag_and_logger_prefix(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "torchtitan_step_lines_rank0_prefix_torchtitan_1287.txt")
    assert scan.format == "torchtitan"
    assert [(s.step, s.loss, s.line) for s in scan.samples] == [
        (200, 6.1384, 2), (210, 6.0388, 5), (220, 6.0348, 6), (230, 5.9670, 7), (240, 5.8311, 8), (250, 5.8383, 10),
    ]  # "Dumping profiler traces at step 200" and the GC lines are not steps
    # the trainer's own time from the [titan] logger prefix (no kubelet stamp in the paste)
    assert scan.samples[0].at == datetime(2025, 6, 16, 22, 30, 50, 322000, tzinfo=UTC)
    assert scan.samples[-1].at == datetime(2025, 6, 16, 22, 32, 0, 846000, tzinfo=UTC)
    assert scan.diagnostics == () and scan.hangs == () and scan.resumes == ()


def test_torchtitan_grad_norm_format(fixtures: Path) -> None:
    rows = _rows(fixtures, "torchtitan_grad_norm_format_torchtitan_3393.txt")
    assert [r[0] for r in rows] == list(range(14, 22))
    assert rows[0][1] == 3.24405 and rows[-1][1] == 3.00867


# torchtitan/tools/utils.py Color, placed as components/metrics.py's step line places them
_COLOURS = {
    "step:": "\x1b[31m", "loss:": "\x1b[32m", "grad_norm:": "\x1b[38;2;180;60;0m",
    "memory:": "\x1b[38;2;54;234;195m", "tps:": "\x1b[34m", "tflops:": "\x1b[36m", "mfu:": "\x1b[35m",
}


def _coloured(line: str) -> str:
    for field, code in _COLOURS.items():
        line = line.replace(f" {field}", f" {code}{field}", 1)
    return line + "\x1b[39m"


def test_torchtitan_with_ansi_colours_reads_the_same(fixtures: Path) -> None:
    plain = (fixtures / TRAINING / "torchtitan_grad_norm_format_torchtitan_3393.txt").read_text().splitlines()
    coloured = [_coloured(line) for line in plain]
    assert all("\x1b[31mstep:" in c and "\x1b[32mloss:" in c for c in coloured)  # the control
    a, b = scan_lines(plain, source="plain"), scan_lines(coloured, source="colour")
    assert [(s.step, s.loss, s.at) for s in b.samples] == [(s.step, s.loss, s.at) for s in a.samples]
    assert len(b.samples) == 8 and b.format == "torchtitan"


def test_torchtitan_other_ranks_do_not_count(fixtures: Path) -> None:
    # every rank logs when LOG_RANK lists them: rank 0's steps are the stream, rank 1's echo is not
    lines = (fixtures / TRAINING / "torchtitan_grad_norm_format_torchtitan_3393.txt").read_text().splitlines()
    echoed = [x for line in lines for x in (line, line.replace("[rank0]:", "[rank1]:", 1))]
    scan = scan_lines(echoed, source="t")
    assert [s.step for s in scan.samples] == list(range(14, 22))
    assert [s.line for s in scan.samples] == list(range(1, 17, 2))
    assert "only rank 0 counted" in scan.diagnostics[-1]


def test_torchtitan_pipeline_placeholder_loss_is_no_loss(fixtures: Path) -> None:
    # with pipeline parallelism the logged rank prints "loss: -1.0000": the steps count, the loss is unknown
    rows = _rows(fixtures, "torchtitan_pipeline_loss_placeholder_torchtitan_1232.txt")
    assert rows == [(1, None, 3), (2, None, 5), (3, None, 6), (4, None, 7)]


def test_torchtitan_validation_and_nan() -> None:
    # components/metrics.py log_validation: "validate step: {step:2}  loss: {loss:7.4f}  memory: ..."
    validate = ("[rank0]:[titan] 2025-06-16 22:40:00,000 - root - INFO - validate step: 250  loss:  5.9000  "
                "memory: 49.66GiB(52.28%)  tps: 5,862")
    nan = ("[rank0]:[titan] 2025-06-16 22:40:14,000 - root - INFO - step: 260  loss:     nan  "
           "memory: 49.66GiB(52.28%)  tps: 5,862  tflops: 339.48  mfu: 34.33%")
    scan = scan_lines([validate, nan], source="t")
    assert [s.step for s in scan.samples] == [260]  # validation is not a step
    loss = scan.samples[0].loss
    assert loss is not None and loss != loss  # a NaN loss is kept: it is evidence
    assert scan_report(scan)["progress"]["nonfinite_loss"] is True  # type: ignore[index]


def test_torchtitan_resume_line(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "torchtitan_loading_checkpoint_at_step_torchtitan_1287.txt")
    at = datetime(2025, 6, 25, 13, 10, 45, 513000, tzinfo=UTC)
    assert scan.resumes == (ResumeFinding(6, at, 400, "torchtitan"),)
    assert scan.samples == ()  # "Training starts at step 401." is not a step done


# -- NeMo 2 ---------------------------------------------------------------------------------------
def test_nemo2_progress_printer(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "nemo2_progress_printer_bionemo_recipes_740.txt")
    assert scan.format == "nemo"
    assert [(s.step, s.loss, s.line, s.total) for s in scan.samples] == [
        (120, 1.233, 1, 149), (121, 1.288, 2, 149), (122, 1.333, 3, 149),
        (123, 1.245, 4, 149), (124, 1.375, 5, 149), (125, 1.34, 6, 149),
    ]  # the loss is reduced_train_loss, never val_loss (4.106 on every line)
    assert scan.diagnostics == ()


def test_nemo2_progress_printer_first_steps(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "nemo2_progress_printer_from_global_step_0_nemo_10128.txt")
    assert [s.step for s in scan.samples] == list(range(9))
    assert scan.samples[0].loss == 11.02 and scan.samples[-1].loss == 7.113
    assert scan_report(scan)["progress"]["total"] == 9  # type: ignore[index]


def test_nemo2_steps_come_from_global_step_not_the_epoch_iteration() -> None:
    # the format string of nemo/lightning/pytorch/callbacks/progress_printer.py: iteration restarts
    # each epoch, global_step does not; validation prints "Validation: iteration n/N"
    lines = [
        "Training epoch 0, iteration 8/9 | lr: 0.0006 | global_step: 8 | reduced_train_loss: 7.113",
        "Validation: iteration 1/2",
        "Validation: iteration 2/2",
        "Training epoch 1, iteration 0/9 | lr: 0.0006 | global_step: 9 | reduced_train_loss: 7.0",
        "Training epoch 1, iteration 1/9 | lr: 0.0006 | global_step: 10 | reduced_train_loss: nan",
    ]
    scan = scan_lines(lines, source="t")
    assert [(s.step, s.line) for s in scan.samples] == [(8, 1), (9, 4), (10, 5)]
    assert scan.format == "nemo" and scan.diagnostics == ()
    assert scan_report(scan)["progress"]["nonfinite_loss"] is True  # type: ignore[index]
    # no global_step (excluded from the printer's metrics): past the first epoch the step is unknown
    odd = scan_lines(["Training epoch 0, iteration 3/9 | reduced_train_loss: 8.0",
                      "Training epoch 1, iteration 0/9 | reduced_train_loss: 7.0"], source="t")
    assert [s.step for s in odd.samples] == [3, None]
    assert any("without global_step" in d for d in odd.diagnostics)


def test_nemo_megatron_progress_bar_and_lightning_restore_is_no_resume(fixtures: Path) -> None:
    # MegatronProgressBar writes "Epoch 0: :" (its own ": " after tqdm's) and reduced_train_loss=
    scan = scan_path(fixtures / TRAINING / "nemo_megatron_bar_then_lightning_restore_index_31160729218.txt")
    assert scan.format == "lightning"
    assert [(s.step, s.loss, s.line) for s in scan.samples] == [(6024, 0.0252, 1)]
    # Lightning restores the best checkpoint after fit (and for test/validate runs): not a training resume
    assert scan.resumes == ()


# -- NeMo Automodel -------------------------------------------------------------------------------
def test_automodel_step_lines(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "automodel_step_lines_automodel_3473.txt")
    assert scan.format == "automodel"
    assert [(s.step, s.loss) for s in scan.samples] == [
        (9, 0.6974), (10, 0.8534), (11, 0.6172), (12, 0.6357), (13, 0.6749), (14, 0.5133), (15, 0.7918),
    ]
    assert scan.samples[0].at == datetime(2026, 8, 10, 15, 55, 20, tzinfo=UTC)
    assert scan.samples[-1].at == datetime(2026, 8, 10, 15, 55, 36, tzinfo=UTC)


def test_automodel_validation_lines_are_not_steps(fixtures: Path) -> None:
    # nemo_automodel/recipes/llm/train_ft.py log_val_metrics: "[val] step {} | epoch {} | loss {:.4f} | lr ..."
    lines = (fixtures / TRAINING / "automodel_step_lines_automodel_3473.txt").read_text().splitlines()[:2]
    lines.append("2026-08-10 15:55:24 | INFO | root | [val] step 10 | epoch 0 | loss 0.9120 | lr 1.00e-05 | "
                 "num_label_tokens 8190")
    scan = scan_lines(lines, source="t")
    assert [(s.step, s.line) for s in scan.samples] == [(9, 1), (10, 2)]
    assert scan.samples[-1].loss == 0.8534


# -- Megatron-LM ----------------------------------------------------------------------------------
def test_megatron_validation_blocks_are_never_training_samples(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "megatron_lm_validation_blocks_skipped_iterations_index_9506752970.txt")
    assert scan.format == "megatron"
    steps = [s.step for s in scan.samples]
    assert steps == list(range(10, 160, 10))  # "validation loss at iteration 50/100/150" add nothing
    by_step = {s.step: s for s in scan.samples}
    # iteration 10: every iteration skipped (no loss printed); 20: 6 of 10 skipped; 30: 5 of 10
    assert by_step[10].skipped and by_step[10].loss is None
    assert by_step[20].skipped and not by_step[30].skipped
    assert by_step[50].loss == 9.236888 and by_step[60].loss == 8.638345  # not 8.889540, the validation loss
    assert by_step[150].at == datetime(2025, 4, 13, 23, 43, 25, tzinfo=UTC)
    assert scan.resumes == ()  # "successfully saved checkpoint" is a save
    # evaluation words before an iteration line never make a step, even with Megatron's "N/ M |" shape
    for label in ("Validation", "Evaluating", "Testing", "Sanity Checking"):
        assert scan_text(f"{label}: iteration 5/ 10 | lm loss: 2.0 |\n", source="t").samples == ()


def test_megatron_resume_line(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "megatron_lm_loaded_checkpoint_at_iteration_index_66011901751.txt")
    assert scan.resumes == (ResumeFinding(3, None, 100, "megatron"),)  # the load attempt on line 1 is not counted
    # the path is the tenant's: the last "at iteration N" on the line is Megatron's own
    forged = "  successfully loaded checkpoint from /ckpt/at iteration 999999 [ t 0, p 0 ] at iteration 7\n"
    assert [r.step for r in scan_text(forged, source="t").resumes] == [7]


def test_hf_trainer_resume_line(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "hf_trainer_continuing_from_global_step_llamafactory_1813.txt")
    assert scan.resumes == (ResumeFinding(1, datetime(2023, 12, 12, 10, 12, 6, tzinfo=UTC), 200000, "hf-trainer"),)
    assert scan.samples == ()  # the 0/139495 bar: nothing done yet


def test_resume_lines_of_other_ranks_are_echoes() -> None:
    line = "[titan] 2025-06-25 13:10:45,513 - root - INFO - Loading the checkpoint at step 400."
    scan = scan_lines([f"[rank{r}]:{line}" for r in range(4)], source="t")
    assert [(r.line, r.step) for r in scan.resumes] == [(1, 400)]


def test_new_formats_are_in_the_vocabulary() -> None:
    assert {"torchtitan", "nemo", "automodel"} <= set(FORMATS)


def test_a_trainers_own_rfc3339_time_after_the_kubelets_is_read_past() -> None:
    """`kubectl logs --timestamps` of a trainer whose logger prints its own RFC 3339 time first: the
    kubelet's stamp is kept, the trainer's is read past, and the Lightning bar behind it still counts."""
    from collector.progress import scan_text

    bar = ("Epoch 0:  45%|████▌     | 450/1000 [07:30<09:10,  1.00it/s, loss=2.31, v_num=0]")
    line = f"2026-01-10T10:00:00.123456789Z 2026-01-10T10:00:00.120+00:00 {bar}\n"
    scan = scan_text(line, source="t")
    assert [(x.step, x.at is not None) for x in scan.samples] == [(450, True)]
    assert scan.samples[0].at is not None and scan.samples[0].at.microsecond == 123456


def test_tokens_per_second_per_gpu_where_the_trainer_prints_it(fixtures: Path) -> None:
    """Energy per token needs the trainer's own tokens/s per GPU: torchtitan's `tps:` (per device,
    thousands separated), NeMo Automodel's `tps N(M/gpu)`; the newest line's, with its time."""
    titan = scan_path(fixtures / TRAINING / "torchtitan_step_lines_rank0_prefix_torchtitan_1287.txt")
    assert titan.tokens is not None and titan.tokens.per_gpu == 5862.0
    assert titan.tokens.at is not None and titan.tokens.at.strftime("%H:%M:%S") == "22:32:00"
    auto = scan_path(fixtures / TRAINING / "automodel_step_lines_automodel_3473.txt")
    assert auto.tokens is not None and auto.tokens.per_gpu == 2539.60
    assert auto.tokens.at is not None and auto.tokens.at.strftime("%H:%M:%S") == "15:55:36"
    # a rate no device reaches, or none at all, is no rate
    huge = scan_text("2026-01-10T12:00:00Z step: 5  loss: 2.0  memory: 1GiB(1%)  tps: 9,999,999,999  mfu: 1%\n",
                     source="x")
    assert huge.samples and huge.tokens is None
    megatron = scan_path(fixtures / TRAINING / "megatron_iteration_log_lines_epfllm_megatron_llm_11_truncated.txt")
    assert megatron.samples and megatron.tokens is None  # Megatron prints no tokens/s
