"""Node-agent log increments: a reader that sends back the document's cursor (epoch, poll) gets only
what each container's log added since, and the controller's history built from increments is the
one whole documents give."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collector.agent.evidence import Snapshot, evidence_document
from collector.agent.logs import MARKS, LogEvidence
from collector.agent.nvml import NvmlStatus
from collector.planes.signals import adds_nothing
from collector.progress.history import extend_history
from collector.progress.model import HangFinding, XidFinding
from collector.sources.agents import AgentEndpoint, parse_evidence
from tests.agent.test_logs import Node, evidence

WATCHDOG = ("[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
            "Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")
EP = AgentEndpoint("gpu-0", "agent-x", "http://127.0.0.1:9402")
READ_AT = datetime(2026, 1, 10, 11, 0, tzinfo=UTC)


def _doc(ev: LogEvidence, since: int | None) -> dict[str, object]:
    snap = Snapshot(node="gpu-0", at=0.0, nvml=NvmlStatus("ok", "ok"), gpus=(), hang_since={}, hang_sustain_s=60.0,
                    allocations=(), podresources_up=True, podresources_last_success=0.0, podresources_error="",
                    xids=(), logs=tuple(ev.containers(since=since)), log_epoch=ev.epoch, log_poll=ev.polls)
    return evidence_document(snap)


def _trainer(doc: dict[str, object]) -> dict[str, object]:
    (c,) = [c for c in doc["logs"] if c["container"] == "trainer"]  # type: ignore[attr-defined]
    return c  # type: ignore[no-any-return]


def test_an_increment_carries_only_what_came_after_and_extends_to_the_whole(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.write(*node.steps(1, 10))
    ev = evidence(tmp_path)
    ev.poll()
    first = _doc(ev, None)
    assert first["epoch"] == ev.epoch and first["poll"] == 1 and _trainer(first)["after"] is None
    node.write(*node.steps(11, 15), node.line(WATCHDOG))
    ev.poll()
    node.write(*node.steps(16, 18))
    ev.poll()
    inc = _doc(ev, 1)
    c = _trainer(inc)
    assert c["after"] == 10  # lines the agent had read once poll 1 was done
    assert [row[0] for row in c["samples"]] == list(range(10, 19))  # led by the last one before
    assert [h["kind"] for h in c["hangs"]] == ["nccl-watchdog-timeout"]
    whole = parse_evidence(_doc(ev, None), EP, READ_AT).logs[0]
    base = parse_evidence(first, EP, READ_AT).logs[0]
    step = parse_evidence(inc, EP, READ_AT).logs[0]
    assert step.after == 10 and base.after is None
    merged = extend_history(base.scan, step.scan, 10)
    assert merged.samples == whole.scan.samples and merged.hangs == whole.scan.hangs
    again = extend_history(merged, step.scan, 10)  # the same increment twice (a retried read): no duplicate
    assert again.samples == whole.scan.samples and again.hangs == whole.scan.hangs
    assert parse_evidence(inc, EP, READ_AT).cursor == (ev.epoch, 3)


def _polled_once(root: Path) -> tuple[Node, LogEvidence]:
    """A node whose trainer printed steps 1-3, read by one poll."""
    node = Node(root)
    node.write(*node.steps(1, 3))
    ev = evidence(root)
    ev.poll()
    return node, ev


def _by_container(doc: dict[str, object]) -> dict[str, Any]:
    return {c["container"]: c for c in doc["logs"]}  # type: ignore[attr-defined]


def test_a_container_new_since_the_cursor_or_older_than_its_marks_comes_whole(tmp_path: Path) -> None:
    node, ev = _polled_once(tmp_path)
    node.write(*node.steps(1, 2), container="sidecar")
    for k in range(MARKS + 5):  # more polls with new lines than a container keeps marks of
        node.write(node.line(f"noise {k}"))
        ev.poll()
    by = _by_container(_doc(ev, 1))
    assert by["trainer"]["after"] is None and [r[0] for r in by["trainer"]["samples"]] == [1, 2, 3]
    # followed since poll 1 and quiet since: its marks still reach back, so it comes from line 0
    assert by["sidecar"]["after"] == 0 and [r[0] for r in by["sidecar"]["samples"]] == [1, 2]
    by = _by_container(_doc(ev, ev.polls - 1))
    assert by["trainer"]["after"] is not None and [r[0] for r in by["trainer"]["samples"]] == [3]
    assert by["sidecar"]["after"] is not None


def test_a_container_followed_after_the_cursor_is_sent_from_its_first_line(tmp_path: Path) -> None:
    node, ev = _polled_once(tmp_path)
    node.write(*node.steps(1, 4), container="second")
    ev.poll()
    second = _by_container(_doc(ev, 1))["second"]
    assert second["after"] == 0 and [r[0] for r in second["samples"]] == [1, 2, 3, 4]


def test_an_increment_is_never_cut_into_a_hole(tmp_path: Path) -> None:
    """More new samples than a whole document carries: the increment carries them all; more than
    the agent keeps: the container comes whole (a hole would read as a stall in goodput)."""
    node, ev = _polled_once(tmp_path)
    node.write(*node.steps(4, 20))
    ev.poll()
    snap = Snapshot(node="gpu-0", at=0.0, nvml=NvmlStatus("ok", "ok"), gpus=(), hang_since={}, hang_sustain_s=60.0,
                    allocations=(), podresources_up=True, podresources_last_success=0.0, podresources_error="",
                    xids=(), logs=tuple(ev.containers(since=1)), log_epoch=ev.epoch, log_poll=ev.polls)
    c = _by_container(evidence_document(snap, samples=5))["trainer"]
    assert c["after"] == 3 and [r[0] for r in c["samples"]] == list(range(3, 21))
    small = evidence(tmp_path / "other", samples_kept=4)
    node2 = Node(tmp_path / "other")
    node2.write(*node2.steps(1, 3))
    small.poll()
    node2.write(*node2.steps(4, 20))
    small.poll()
    c = _by_container(_doc(small, 1))["trainer"]
    assert c["after"] is None and [r[0] for r in c["samples"]][-1] == 20


def test_an_increment_with_nothing_new_only_refreshes(tmp_path: Path) -> None:
    """The controller skips extending (and re-evaluating) for an increment that adds nothing; each
    thing a poll can add makes it one that does."""
    node, ev = _polled_once(tmp_path)
    held = parse_evidence(_doc(ev, None), EP, READ_AT).logs[0].scan
    cursor = ev.polls

    def increment() -> tuple[Any, int]:
        ev.poll()
        got = parse_evidence(_doc(ev, cursor), EP, READ_AT).logs[0]
        assert got.after is not None
        return got.scan, got.after

    inc, after = increment()  # no new line
    assert [s.step for s in inc.samples] == [3]  # the lead sample only
    assert adds_nothing(held, inc, after)
    same = extend_history(held, inc, after)
    assert (same.samples, same.hangs, same.xids, same.lines, same.diagnostics) == \
        (held.samples, held.hangs, held.xids, held.lines, held.diagnostics)
    assert not adds_nothing(held, replace(inc, samples=(replace(inc.samples[0], loss=0.5),)), after)  # a redraw
    node.write(node.line("a line with no step"))
    inc, after = increment()
    assert not adds_nothing(held, inc, after) and extend_history(held, inc, after).lines != held.lines
    held = extend_history(held, inc, after)
    cursor = ev.polls
    node.write(*node.steps(4, 4))
    inc, after = increment()
    assert not adds_nothing(held, inc, after)
    held, cursor = extend_history(held, inc, after), ev.polls
    inc, after = increment()
    assert adds_nothing(held, inc, after)
    # each part on its own (a real poll that adds one also adds lines)
    later = replace(inc.samples[0], line=after + 1, step=5)
    for changed in (replace(inc, samples=(*inc.samples, later)), replace(inc, samples=(later,)),
                    replace(inc, hangs=(HangFinding("nccl-error", after + 1, None, None, 0, None),)),
                    replace(inc, xids=(XidFinding(79, "0000:18:00.0", after + 1, "", "", None),)),
                    replace(inc, diagnostics=("line 9: a note",)), replace(inc, format="deepspeed")):
        assert not adds_nothing(held, changed, after), changed
    node.write(node.line(WATCHDOG))
    inc, after = increment()
    assert not adds_nothing(held, inc, after) and extend_history(held, inc, after).hangs


RESTART = ("W0110 10:15:40.117000 738248 torch/distributed/elastic/agent/server/api.py:704] [default] Worker group "
           "FAILED. 3/3 attempts left; will restart worker group")


def test_a_restart_inside_the_container_travels_with_its_seq_and_in_increments(tmp_path: Path) -> None:
    """torchrun's worker-group restart and the trainer's resume line reach the controller (the claims
    need them to tell replayed steps from progress), once: an increment carries only later ones; a
    watchdog line keeps its sequence number."""
    node = Node(tmp_path)
    loaded = "  successfully loaded checkpoint from /ckpt [ t 0/1, p 0/1 ] at iteration 8"
    node.write(*node.steps(1, 10), node.line(RESTART), node.line(loaded))
    ev = evidence(tmp_path)
    ev.poll()
    base = parse_evidence(_doc(ev, None), EP, READ_AT).logs[0]
    assert [r.format for r in base.scan.resumes][0] == "torchelastic"
    assert base.scan.resumes[-1].step == 8, base.scan.resumes
    node.write(*node.steps(9, 12), node.line(WATCHDOG))
    ev.poll()
    inc = parse_evidence(_doc(ev, 1), EP, READ_AT).logs[0]
    assert inc.scan.resumes == () and inc.scan.hangs[0].seq == 1580
    merged = extend_history(base.scan, inc.scan, inc.after or 0)
    assert merged.resumes == base.scan.resumes
    # an increment holding only a resume is not "nothing new"
    only = replace(inc.scan, hangs=(), samples=base.scan.samples[-1:], lines=base.scan.lines,
                   diagnostics=base.scan.diagnostics, resumes=base.scan.resumes[:1])
    assert not adds_nothing(base.scan, only, base.scan.lines)
    whole = parse_evidence(_doc(ev, None), EP, READ_AT).logs[0]
    assert merged.resumes == whole.scan.resumes and merged.hangs == whole.scan.hangs
