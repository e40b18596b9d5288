"""One log line must not take down everyone's output (issue 26, "High").

The attack: a tenant's container prints a step number above 2^63 (or 5,000 digits). Before the fix
the number went through the parsers unchecked: `scan` raised on 5,000 digits, and a 23-digit step
reached orjson (64-bit), a JSON double and a Kusto long, so `explain -o json` failed for the whole
dump, `bundle` for the run, the agent's `/evidence` for the node, and the ADX export raised. Now
every number is bounded at the parser (steps < 2^53, ranks < 2^20, XID codes < 2^16): the line
yields nothing, the scan names it once and goes on, and the good lines around it still count.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from collector.agent.evidence import Snapshot, evidence_document
from collector.agent.logs import ContainerLog
from collector.agent.nvml import NvmlStatus
from collector.cli import main
from collector.model import Ref
from collector.progress import LogScan, scan_report, scan_text
from exporters.adx.rows import progress_rows
from tests.dumpkit import pod, ts, write_dump
from tests.test_explain_fixtures import NOW, megatron_log, taurun

BIG = "99999999999999999999999"  # > 2^63
JUST_OVER = str(2**53 + 1)  # fits int64, not a JSON double: Kusto/JS readers would round it
HUGE = "9" * 5000  # past Python's int() digit limit
LIMIT = 2**53
DUMP_TAIL = ("Received a dump signal due to a collective timeout from this local rank and we will try our best to "
             "dump the debug info.")

# Every parser family, each line carrying one number no trainer prints.
HOSTILE = {
    "megatron-step": f" iteration {BIG}/ {BIG} | lm loss: 2.0 | number of skipped iterations: 0 |",
    "megatron-int64": f" iteration {JUST_OVER}/ 250000 | lm loss: 2.0 |",
    "megatron-digits": f" iteration {HUGE}/ 250000 | lm loss: 2.0 |",
    "megatron-skipped": f" iteration 5/ 10 | number of skipped iterations: {BIG} | number of nan iterations: 0 |",
    "deepspeed": f"[Rank 0] step={BIG}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]",
    "deepspeed-skipped": f"[Rank 0] step=100, skipped={BIG}, lr=[0.0001], mom=[(0.9, 0.999)]",
    "hf-dict": f"{{'loss': 1.0, 'step': {BIG}}}",
    "lightning-position": f"Epoch 0:  50%|█████     | {BIG}/2 [00:01<00:01,  1.00it/s, loss=1.0, v_num=1]",
    "lightning-epoch": f"Epoch {BIG}:  50%|█████     | 1/2 [00:01<00:01,  1.00it/s, loss=1.0, v_num=1]",
    "lightning-product": "Epoch 9007199254740000:  50%|█████     | 1/9000 [00:01<00:01,  1.00it/s, loss=1.0]",
    "hf-bar-total": f" 50%|█████     | 1/{BIG} [00:01<00:01,  1.00it/s]",
    "torchtitan": f"[titan] 2025-06-16 22:30:50,322 - root - INFO - step: {BIG}  loss:  6.1384  memory: 49.66GiB",
    "nemo": f"Training epoch 0, iteration 1/9 | global_step: {BIG} | reduced_train_loss: 1.0",
    "automodel": f"2026-08-10 15:55:20 | INFO | root | step {BIG} | epoch 0 | loss 0.6974 | grad_norm 1.5",
    "rank-tag": f"[rank{BIG}]: iteration 1/ 2 | lm loss: 1.0 |",
    "rank-tag-digits": f"[rank{HUGE}]: iteration 1/ 2 | lm loss: 1.0 |",
    "rank-eq": f"rank={BIG} iteration 1/ 2 | lm loss: 1.0 |",
    "watchdog-seq": (f"[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective "
                     f"operation timeout: WorkNCCL(SeqNum={BIG}, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 1 ms"),
    "watchdog-timeout": (f"[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
                         f"Timeout(ms)={BIG}) ran for 1 milliseconds before timing out."),
    "watchdog-rank": (f"[Rank {BIG}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
                      "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 1 milliseconds before timing out."),
    "dump-enqueued": (f"[PG ID 0 PG GUID 0(default_pg) Rank 1] {DUMP_TAIL} Last enqueued NCCL work: {BIG}, "
                      "last completed NCCL work: 1."),
    "lagging-rank": f"[{BIG}] (pid 22) didn't join collective: ALLREDUCE",
    "gloo": f"[Rank 0] Timed out waiting {BIG}ms for recv operation to complete",
    "xid": f"NVRM: Xid (PCI:0000:9b:00): {BIG}, pid=1, name=python",
    "resume-megatron": f"  successfully loaded checkpoint from /ckpt [ t 0, p 0 ] at iteration {BIG}",
    "resume-titan": f"[titan] 2025-06-25 13:10:45,513 - root - INFO - Loading the checkpoint at step {BIG}.",
    "resume-hf": f"[INFO|trainer.py:1791] 2023-12-12 10:12:06,000 >>   Continuing training from global step {BIG}",
}


def _ints(obj: Any) -> list[int]:
    if isinstance(obj, bool):
        return []
    if isinstance(obj, int):
        return [obj]
    if isinstance(obj, dict):
        return [i for v in obj.values() for i in _ints(v)]
    if isinstance(obj, list | tuple):
        return [i for v in obj for i in _ints(v)]
    return []


def _safe(doc: Any) -> None:
    """What every exporter needs: orjson encodes it, and no integer is past a JSON double's exact range."""
    orjson.dumps(doc)
    assert all(-LIMIT < i < LIMIT for i in _ints(doc)), sorted(_ints(doc), key=abs)[-3:]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_number_out_of_range_voids_its_line_and_nothing_else(name: str) -> None:
    scan = scan_text(HOSTILE[name] + "\n", source="t")
    assert (scan.samples, scan.hangs, scan.xids) == ((), (), ())
    assert scan.resumes == ()
    _safe(scan_report(scan))
    if name != "xid":  # a kernel XID line past the catalogue is dropped silently (the agent reads it too)
        assert len(scan.diagnostics) == 1 and "out of range" in scan.diagnostics[0], scan.diagnostics
        assert len(scan.diagnostics[0]) < 200  # the number is not echoed in full


def test_numbers_at_the_bounds_still_parse() -> None:
    top = str(2**53 - 1)
    scan = scan_text(f" iteration {top}/ {top} | lm loss: 2.0 |\n", source="t")
    assert [(s.step, s.total) for s in scan.samples] == [(2**53 - 1, 2**53 - 1)]
    dump = (f"[PG ID 0 PG GUID 0(default_pg) Rank 1048575] {DUMP_TAIL} Last enqueued NCCL work: -1, "
            "last completed NCCL work: -1.")
    assert [(h.rank, h.seq) for h in scan_text(dump + "\n", source="t").hangs] == [(2**20 - 1, -1)]


def test_a_custom_regex_step_out_of_range_is_named_not_raised() -> None:
    scan = scan_text(f"done {BIG} steps\ndone 7 steps\n", source="t", custom_regex=r"done (?P<step>\d+) steps")
    assert [s.step for s in scan.samples] == [7]
    assert any("out of range" in d for d in scan.diagnostics)
    _safe(scan_report(scan))


# The issue's case: numbers past 2^63 (and past 2^53), no line past int()'s digit limit.
OVER_INT64 = [k for k, v in HOSTILE.items() if HUGE not in v]
ATTACKS = {"over-2^63": OVER_INT64, "5000-digits": [k for k in HOSTILE if k not in OVER_INT64]}


def _good_and_hostile(attack: str = "", n_hostile: int = 400) -> tuple[str, str]:
    good, last = megatron_log(NOW - timedelta(minutes=10))
    stamp = f"{ts(last)} "
    keys = ATTACKS[attack] if attack else list(HOSTILE)
    bad = "".join(stamp + HOSTILE[keys[i % len(keys)]] + "\n" for i in range(n_hostile))
    return good + bad, ts(last + timedelta(seconds=60))


def test_the_good_lines_around_them_still_count_and_diagnostics_stay_bounded() -> None:
    text, _ = _good_and_hostile()
    scan = scan_text(text, source="t")
    assert [s.step for s in scan.samples] == [122, 123, 124, 125]
    assert scan.hangs == () and scan.xids == () and scan.resumes == ()
    assert len(scan.diagnostics) <= 3
    assert any("more lines with a number out of range" in d for d in scan.diagnostics)
    _safe(scan_report(scan))


def _dump(tmp_path: Path, attack: str) -> tuple[Path, str]:
    text, at = _good_and_hostile(attack)
    tr = taurun("llm", "research", "Running", NOW - timedelta(hours=1), workers=1)
    p = pod("llm-w0", "research", NOW - timedelta(hours=1), node="gpu-1", gpus=8, labels={"taugrid.io/run": "llm"})
    return write_dump(tmp_path / "d", [tr, p], logs={("research", "llm-w0"): text}), at


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_explain_json_still_answers_for_the_whole_dump(tmp_path: Path, attack: str) -> None:
    dump, at = _dump(tmp_path, attack)
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "-o", "json", "--at", at])
    assert r.exit_code == 0, (r.output, r.exception)
    out = json.loads(r.stdout)
    run = next(x for x in out["runs"] if x["name"] == "llm")
    progressing = run["claims"]["progressing"]
    assert progressing["observed"] == "true", progressing["reason"]
    assert {e["field"]: e["value"] for e in progressing["evidence"]}["last_step"] == 125
    _safe(out)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_bundle_still_writes_the_run(tmp_path: Path, attack: str) -> None:
    dump, at = _dump(tmp_path, attack)
    r = CliRunner().invoke(main, ["bundle", "research/llm", "--from-dump", str(dump), "--at", at,
                                  "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, (r.output, r.exception)
    where = Path(r.stdout.strip())
    scans = json.loads((where / "logs" / "scan.json").read_text())
    _safe(scans)
    assert "125" in json.dumps(scans)


def _scan(attack: str) -> LogScan:
    return scan_text(_good_and_hostile(attack)[0], source="research/llm-w0/main")


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_the_agents_evidence_document_still_serializes(attack: str) -> None:
    c = ContainerLog("research", "llm-w0", "uid-1", "main", _scan(attack), 0.0)
    snap = Snapshot(node="gpu-0", at=0.0, nvml=NvmlStatus("ok", "ok"), gpus=(), hang_since={}, hang_sustain_s=60.0,
                    allocations=(), podresources_up=True, podresources_last_success=0.0, podresources_error="",
                    xids=(), logs=(c,))
    doc = evidence_document(snap)
    _safe(doc)
    samples = doc["logs"][0]["samples"]  # type: ignore[index]
    assert [s[0] for s in samples] == [122, 123, 124, 125]


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_the_adx_progress_rows_fit_a_kusto_long(attack: str) -> None:
    rows = progress_rows(Ref("TauRun", "research", "llm"), "main", "logs", False, _scan(attack), "c1", None)
    assert [r["Step"] for r in rows] == [122, 123, 124, 125]
    _safe(rows)
