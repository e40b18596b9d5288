"""Node-local log evidence on real CRI-format files: partial lines, rotation, truncation, deletion,
binary lines, restarts of the container and of the agent (persisted offsets)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector.agent.cri import parse_cri
from collector.agent.logs import LogEvidence, split_pod_dir
from collector.agent.settings import LogSettings

T0 = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)
POD = "research_llm-worker-0_5f1c1d0e-9a0b-4c3d-8e7f-000000000001"


def ts(i: int) -> str:
    return (T0 + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.123456789Z")


def megatron(step: int, loss: float = 2.5) -> str:
    return (f" iteration {step:8d}/  250000 | consumed samples: {step * 1024:12d} | elapsed time per iteration (ms): "
            f"1000.0 | learning rate: 9.150E-06 | global batch size:  1024 | lm loss: {loss:.6E} | loss scale: 1.0 |")


class Node:
    """A /var/log/pods tree the test writes the way the kubelet and runtime do."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.t = 0

    def dir(self, pod: str = POD, container: str = "trainer") -> Path:
        d = self.root / pod / container
        d.mkdir(parents=True, exist_ok=True)
        return d

    def write(self, *records: str | bytes, name: str = "0.log", pod: str = POD, container: str = "trainer") -> None:
        with open(self.dir(pod, container) / name, "ab") as f:
            for r in records:
                f.write(r if isinstance(r, bytes) else r.encode())

    def line(self, text: str, *, tag: str = "F", stream: str = "stdout") -> str:
        self.t += 1
        return f"{ts(self.t)} {stream} {tag} {text}\n"

    def steps(self, first: int, last: int) -> list[str]:
        return [self.line(megatron(s)) for s in range(first, last + 1)]


def evidence(root: Path, state: Path | None = None, wanted: set[tuple[str, str]] | None = None,
             **kw: object) -> LogEvidence:
    settings = LogSettings(root=root, scope="gpu" if wanted is not None else "all", poll_s=0.05, **kw)  # type: ignore[arg-type]
    return LogEvidence(settings, wanted=lambda: wanted or set(), state_file=state)


def steps_of(ev: LogEvidence, container: str = "trainer") -> list[int]:
    (c,) = [c for c in ev.containers() if c.container == container]
    return [s.step for s in c.scan.samples]


def test_cri_records() -> None:
    r = parse_cri(b"2026-01-10T10:00:00.123456789Z stderr P part one")
    assert r is not None and r.partial and r.stream == b"stderr" and r.content == b"part one"
    assert parse_cri(b"2026-01-10T10:00:00.123456789Z stdout F") is not None  # an empty line
    assert parse_cri(b"garbage") is None
    assert parse_cri(b"2026-01-10T10:00:00.123456789Z stdin F x") is None
    assert split_pod_dir(POD) == ("research", "llm-worker-0", "5f1c1d0e-9a0b-4c3d-8e7f-000000000001")
    assert split_pod_dir("not-a-pod-dir") is None


def test_progress_partial_lines_and_timestamps(tmp_path: Path) -> None:
    node = Node(tmp_path)
    full = megatron(7, 2.25)
    node.write(*node.steps(1, 6), node.line(full[:30], tag="P"), node.line(full[30:70], tag="P"))
    ev = evidence(tmp_path)
    ev.poll()
    assert steps_of(ev) == [1, 2, 3, 4, 5, 6]  # step 7 still being assembled
    node.write(node.line("unrelated stderr line", stream="stderr"), node.line(full[70:]))
    ev.poll()
    (c,) = ev.containers()
    assert [s.step for s in c.scan.samples] == [1, 2, 3, 4, 5, 6, 7]
    s7 = c.scan.samples[-1]
    assert s7.loss == 2.25
    assert s7.at == T0 + timedelta(seconds=7, microseconds=123456), "the timestamp of the line's first record"
    assert (c.namespace, c.pod, c.container, c.scan.format) == ("research", "llm-worker-0", "trainer", "megatron")


def test_rotation_reads_every_line_once(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.write(*node.steps(1, 3))
    ev = evidence(tmp_path)
    ev.poll()
    d = node.dir()
    node.write(*node.steps(4, 5))  # written just before the rotation, not yet read
    os.rename(d / "0.log", d / "0.log.20260110-100005")
    node.write(*node.steps(6, 8))  # the new 0.log
    ev.poll()
    assert steps_of(ev) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert ev.problems["rotated"] == 1 and ev.lines_total == 8


def test_rotated_file_compressed_before_we_read_it(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.write(*node.steps(1, 3))
    ev = evidence(tmp_path)
    ev.poll()
    d = node.dir()
    node.write(*node.steps(4, 5))
    os.rename(d / "0.log", d / "0.log.20260110-100005")
    os.rename(d / "0.log.20260110-100005", d / "0.log.20260110-100005.gz")  # stands for compression
    node.write(*node.steps(6, 7))
    ev.poll()
    assert steps_of(ev) == [1, 2, 3, 6, 7]
    assert ev.problems["rotated-lost"] == 1


def test_truncation_and_deletion(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.write(*node.steps(1, 5))
    ev = evidence(tmp_path)
    ev.poll()
    with open(node.dir() / "0.log", "wb") as f:  # truncated in place
        f.write(node.line(megatron(6)).encode())
    ev.poll()
    assert steps_of(ev) == [1, 2, 3, 4, 5, 6] and ev.problems["truncated"] == 1
    os.unlink(node.dir() / "0.log")
    ev.poll()
    assert ev.problems["vanished"] == 1 and steps_of(ev) == [1, 2, 3, 4, 5, 6], "evidence kept"


def test_container_restart_file_is_read_from_its_start(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.write(*node.steps(1, 3))
    ev = evidence(tmp_path, first_read_bytes=1 << 20)
    ev.poll()
    node.write(*node.steps(1, 2), name="1.log")  # restarted: replays from step 1
    ev.poll()
    assert steps_of(ev) == [1, 2, 3, 1, 2]


def test_resume_after_agent_restart_neither_rereads_nor_loses(tmp_path: Path) -> None:
    logs, state = tmp_path / "pods", tmp_path / "state" / "offsets.json"
    node = Node(logs)
    node.write(*node.steps(1, 4))
    full = megatron(5)
    node.write(node.line(full[:40], tag="P"))  # a partial line pending at shutdown
    ev = evidence(logs, state)
    ev.poll()
    ev.poll()
    assert steps_of(ev) == [1, 2, 3, 4] and state.exists()
    # the agent is down while the container writes on
    node.write(node.line(full[40:]), *node.steps(6, 7))
    ev2 = evidence(logs, state)
    ev2.poll()
    assert steps_of(ev2) == [5, 6, 7], "resumed at the partial line: nothing re-read, nothing lost"
    assert ev2.lines_total == 3


def test_resume_across_a_rotation_while_down(tmp_path: Path) -> None:
    logs, state = tmp_path / "pods", tmp_path / "offsets.json"
    node = Node(logs)
    node.write(*node.steps(1, 2))
    ev = evidence(logs, state)
    ev.poll()
    node.write(*node.steps(3, 4))
    d = node.dir()
    os.rename(d / "0.log", d / "0.log.20260110-100004")
    node.write(*node.steps(5, 6))
    ev2 = evidence(logs, state)
    ev2.poll()
    assert steps_of(ev2) == [3, 4, 5, 6]


def test_corrupt_offsets_file_is_reported_and_logs_read_from_their_tails(tmp_path: Path) -> None:
    logs, state = tmp_path / "pods", tmp_path / "offsets.json"
    state.write_text("{not json")
    node = Node(logs)
    node.write(*node.steps(1, 3))
    ev = evidence(logs, state)
    ev.poll()
    assert steps_of(ev) == [1, 2, 3]


def test_binary_and_malformed_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.write(node.line(megatron(1)), f"{ts(50)} stdout F ".encode() + b"\x00\x01\xff\xfe binary\n",
               b"not a cri record at all\n", f"{ts(51)} stdout F ".encode() + b"caf\xe9 latin-1\n",
               node.line(megatron(2)))
    ev = evidence(tmp_path)
    ev.poll()
    assert steps_of(ev) == [1, 2]
    assert ev.problems["malformed"] == 1
    f = next(iter(ev._followed.values()))
    assert f.tail.binary == 1


def test_first_sight_reads_only_the_tail_from_a_line_start(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.write(*node.steps(1, 200))
    ev = evidence(tmp_path, first_read_bytes=2000)
    ev.poll()
    got = steps_of(ev)
    assert got and got[-1] == 200 and got[0] > 1 and got == list(range(got[0], 201))
    assert ev.problems["tail-only"] == 1


def test_scope_gpu_follows_only_pods_holding_gpus(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.write(*node.steps(1, 2))
    other = "kube-system_coredns-abc_5f1c1d0e-9a0b-4c3d-8e7f-000000000002"
    node.write(node.line("dns"), pod=other, container="coredns")
    ev = evidence(tmp_path, wanted={("research", "llm-worker-0")})
    ev.poll()
    assert [(c.pod, c.container) for c in ev.containers()] == [("llm-worker-0", "trainer")]


def test_hangs_and_xids_from_logs(tmp_path: Path, fixtures: Path) -> None:
    node = Node(tmp_path)
    watchdog = next(line for line in (fixtures / "training_logs" /
                    "nccl_watchdog_timeout_torch2x_format_llamafactory_7396.txt").read_text().splitlines()
                    if "Watchdog caught collective operation timeout" in line)
    xid = (fixtures / "xid_nvsmi" / "xid63_row_remapper_line_ml_engineering.txt").read_text().strip()
    node.write(*node.steps(1, 2), node.line(watchdog), node.line(xid))
    ev = evidence(tmp_path)
    ev.poll()
    (c,) = ev.containers()
    assert [h.kind for h in c.scan.hangs] == ["nccl-watchdog-timeout"]
    assert [(x.code, x.pci) for x in c.scan.xids] == [(63, "0000:10:1c")]


def test_memory_stays_bounded(tmp_path: Path) -> None:
    node = Node(tmp_path)
    ev = evidence(tmp_path, samples_kept=50)
    for k in range(5):
        node.write(*node.steps(k * 100 + 1, k * 100 + 100))
        ev.poll()
    got = steps_of(ev)
    assert len(got) <= 100 and got[-1] == 500


def test_a_pod_unwanted_for_a_while_resumes_where_it_stopped(tmp_path: Path) -> None:
    """pod-resources down long enough to drop attribution: following stops, then resumes without loss."""
    logs, state = tmp_path / "pods", tmp_path / "offsets.json"
    node = Node(logs)
    node.write(*node.steps(1, 3))
    wanted: set[tuple[str, str]] = {("research", "llm-worker-0")}
    settings = LogSettings(root=logs, scope="gpu", poll_s=0.05, first_read_bytes=100)
    ev = LogEvidence(settings, wanted=lambda: wanted, state_file=state)
    ev.poll()
    wanted.clear()
    ev.poll()
    assert ev.followed == 0
    node.write(*node.steps(4, 6))
    wanted.add(("research", "llm-worker-0"))
    ev.poll()
    assert steps_of(ev) == [4, 5, 6], "resumed at its offset, not from the tail window"
    ev2 = LogEvidence(settings, wanted=lambda: set(), state_file=state)
    ev2.poll()  # unwanted at start: its saved offsets survive this agent's saves
    assert "research_llm-worker-0_" in state.read_text()
