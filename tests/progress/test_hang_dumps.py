"""Hang findings from torch >= 2.4 collective-timeout logs (real pastes; tests/fixtures/SOURCES.tsv).

The rank that is behind often prints no watchdog line at all, only the heartbeat monitor's dump line
("Received a dump signal ... Last enqueued NCCL work: N, last completed NCCL work: M"). Every rank's
counters become a finding with its global rank, so the suspect logic can compare ranks; the process
group is kept because sequence numbers only compare inside one group.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector.claims.progressing import _suspects
from collector.correlate import Signal
from collector.model import Ref
from collector.progress import HangFinding, scan_path, scan_report, scan_text
from collector.progress.hangs import HANG_TRIGGERS, match_hang, may_be_hang
from collector.progress.model import HANG_KINDS
from tests.test_progress_trust import log

TRAINING = "training_logs"


def _hangs(fixtures: Path, name: str) -> tuple[HangFinding, ...]:
    return scan_path(fixtures / TRAINING / name).hangs


def test_dump_lines_on_every_rank(fixtures: Path) -> None:
    assert _hangs(fixtures, "nccl_dump_signal_default_pg_vllm_omni_2928.txt") == (
        HangFinding("nccl-timeout-dump", 1, None, None, 1, None, seq=233659, completed=233659, pg="0"),
        HangFinding("nccl-timeout-dump", 2, None, None, 0, None, seq=233659, completed=233659, pg="0"),
    )
    assert "nccl-timeout-dump" in HANG_KINDS


def test_dump_from_another_rank_then_that_ranks_watchdog(fixtures: Path) -> None:
    # rank 2 is told by rank 6's timeout; rank 7 times out itself (torch >= 2.6 PG-status line)
    assert _hangs(fixtures, "nccl_dump_signal_from_rank6_and_pg_status_openrlhf_1126.txt") == (
        HangFinding("nccl-timeout-dump", 1, None, None, 2, None, seq=460631, completed=460630, pg="0"),
        HangFinding("nccl-watchdog-timeout", 3, "ALLREDUCE", 600000, 7, None, seq=460631),
        HangFinding("nccl-watchdog-exception", 4, None, None, 7, None, seq=460631, completed=460630, pg="0"),
    )


def test_torch26_pg_status_and_a_watchdog_line_after_a_bar(fixtures: Path) -> None:
    hangs = _hangs(fixtures, "nccl_pg_status_torch26_ranks_differ_ms_swift_10183.txt")
    assert [(h.kind, h.line, h.rank, h.seq, h.completed, h.pg) for h in hangs] == [
        ("nccl-watchdog-timeout", 1, 3, 7219, None, None),  # behind a "Train:" tqdm bar on the same line
        ("nccl-watchdog-exception", 2, 3, 7219, 7218, "0"),
        ("nccl-watchdog-timeout", 3, 2, 7219, None, None),
        ("nccl-watchdog-exception", 4, 2, 7219, 7218, "0"),
    ]
    assert hangs[1].at == datetime(2026, 9, 18, 19, 29, 24, tzinfo=UTC)


def test_timeout_at_nccl_work_lines(fixtures: Path) -> None:
    hangs = _hangs(fixtures, "nccl_timeout_at_nccl_work_llamafactory_6269.txt")
    assert [(h.kind, h.rank, h.seq, h.completed, h.pg) for h in hangs] == [
        ("nccl-watchdog-exception", 0, 7753, 7752, "1"),
        ("nccl-async-error", 0, None, None, None),
        ("nccl-watchdog-exception", 2, 7753, 7752, "1"),
        ("nccl-async-error", 2, None, None, None),
        ("nccl-watchdog-exception", 6, 7753, 7752, "1"),
    ]


def test_the_global_rank_wins_over_the_rank_inside_a_subgroup(fixtures: Path) -> None:
    # "[rank13]:... [Rank 1] Watchdog caught ..." : torchrun's tag is the global rank, "[Rank 1]" the
    # rank inside PG GUID d03b... (the old code named rank 1, another pod's rank)
    hangs = _hangs(fixtures, "nccl_watchdog_subgroup_rank13_prime_rl_3186.txt")
    assert [(h.kind, h.rank, h.seq, h.completed, h.pg) for h in hangs] == [
        ("nccl-watchdog-timeout", 13, 1438, None, None),
        ("nccl-watchdog-exception", 13, 1438, 1437, "d03ba143833c6bf31b072ffdb22f1745957fcbfb"),
    ]
    # the same without the scanner taking the tag off: the tag after a collector's date prefix
    two = _hangs(fixtures, "nccl_watchdog_two_subgroups_nccl_1610.txt")
    assert [(h.rank, h.seq, h.pg) for h in two] == [(13, 216, None), (13, 216, "119"), (15, 57, None), (15, 57, "112")]


def test_sequence_numbers_of_different_groups_are_told_apart(fixtures: Path) -> None:
    # rank 0's dump counts the default group (1261); rank 13 timed out in PG d03b... at 1438: the
    # numbers do not compare, and the findings say so through `pg`
    rank0 = _hangs(fixtures, "nccl_dump_signal_rank0_default_pg_prime_rl_3186.txt")
    rank13 = _hangs(fixtures, "nccl_watchdog_subgroup_rank13_prime_rl_3186.txt")
    assert [(h.kind, h.rank, h.seq, h.completed, h.pg) for h in rank0] == [("nccl-timeout-dump", 0, 1261, 1259, "0")]
    assert {h.pg for h in rank0} & {h.pg for h in rank13} == set()


def test_nothing_enqueued_is_minus_one(fixtures: Path) -> None:
    hangs = _hangs(fixtures, "nccl_dump_signal_nothing_enqueued_sglang_10216.txt")
    assert hangs == (HangFinding("nccl-timeout-dump", 2, None, None, 6, None, seq=-1, completed=-1, pg="0"),)


def test_report_carries_the_new_fields(fixtures: Path) -> None:
    scan = scan_path(fixtures / TRAINING / "nccl_dump_signal_from_rank6_and_pg_status_openrlhf_1126.txt")
    first = scan_report(scan)["hang"][0]  # type: ignore[index]
    assert first["kind"] == "nccl-timeout-dump" and first["seq"] == 460631 and first["rank"] == 2


def test_the_rank_behind_is_named_from_dump_lines_alone() -> None:
    # The laggard prints no watchdog line, only the dump line with a lower last-enqueued counter. The
    # line is the real message (vllm-project/vllm-omni #2928) with this scenario's ranks and counters.
    dump = ("[rank{r}]:[E418 01:32:50.907313453 ProcessGroupNCCL.cpp:1890] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
            "Received a dump signal due to a collective timeout from  rank 0 and we will try our best to dump the "
            "debug info. Last enqueued NCCL work: {e}, last completed NCCL work: {c}.This is most likely caused by "
            "incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not "
            "same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be "
            "caused by GIL deadlock or other reasons such as network errors or bugs in the communications library "
            "(e.g. NCCL), etc.")
    t = datetime(2026, 1, 10, 11, 59, tzinfo=UTC) - timedelta(minutes=1)
    a = log([(t, dump.format(r=0, e=233660, c=233659))])
    b = log([(t, dump.format(r=5, e=233659, c=233659))], ref=Ref("Pod", "ns", "r-1"))
    assert [(h.kind, h.rank, h.seq) for h in b.scan.hangs] == [("nccl-timeout-dump", 5, 233659)]
    suspects = _suspects([(sig, h) for sig in (a, b) for h in sig.scan.hangs])
    assert [s[0] for s in suspects] == ["rank 5 (pod r-1) at SeqNum 233659, others up to 233660"]


def test_triggers_cover_the_dump_lines() -> None:
    # the older heartbeat-monitor wording (no "collective"), as vendor forks of ProcessGroupNCCL print it
    line = ("[PG 0 Rank 0] Received a timeout signal from this local rank and will start to dump the debug info. "
            "Last enqueued NCCL work: 2, last completed NCCL work: 1.")
    assert may_be_hang(line) and any(t in line for t in HANG_TRIGGERS)
    h = match_hang(line)
    assert h is not None and (h.kind, h.rank, h.seq, h.completed, h.pg) == ("nccl-timeout-dump", 0, 2, 1, "0")
    assert scan_text(line + "\n", source="t").hangs[0].seq == 2


def test_no_suspect_is_named_across_process_groups(fixtures: Path) -> None:
    """Rank 0's dump counts the default group (1261), rank 13 timed out in a sub-group at 1438: rank 0 is
    not behind anyone. Only numbers of one group are compared."""
    t = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    sigs = [Signal(Ref("Pod", "ns", f"p{i}"), "main", scan_path(fixtures / TRAINING / name), t)
            for i, name in enumerate(("nccl_dump_signal_rank0_default_pg_prime_rl_3186.txt",
                                      "nccl_watchdog_subgroup_rank13_prime_rl_3186.txt"))]
    assert _suspects([(sig, h) for sig in sigs for h in sig.scan.hangs]) == []
