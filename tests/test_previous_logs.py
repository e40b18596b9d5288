"""A restarted container's previous log is read with its current log as one signal (replay is seen)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector.claims.progress import analyze
from collector.settings import ClaimSettings
from collector.sources.dump import load_dump

T0 = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)


def _megatron(t: datetime, step: int) -> str:
    stamp = t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
    return (f"{stamp}  iteration {step:>8}/  250000 | consumed samples: {step * 1024:>12} | elapsed time per "
            "iteration (ms): 20000.0 | learning rate: 9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 |"
            " loss scale: 1.0 | grad norm: 0.231 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def _write(tmp: Path, previous: bool) -> Path:
    pod = tmp / "ns" / "run-0"
    pod.mkdir(parents=True)
    before = [_megatron(T0 + timedelta(seconds=20 * i), 100 + i) for i in range(30)]  # up to 129
    after = [_megatron(T0 + timedelta(minutes=15, seconds=20 * i), 110 + i) for i in range(15)]  # 110..124: replay
    (pod / "logs.txt").write_text("==== START logs for container main of pod ns/run-0 ====\n" + "\n".join(after)
                                  + "\n==== END logs for container main of pod ns/run-0 ====\n")
    if previous:
        (pod / "main-previous.txt").write_text("\n".join(before) + "\n")
    return tmp


def test_previous_log_gives_the_high_water_mark_and_replay_is_not_progress(tmp_path: Path) -> None:
    dump = load_dump(_write(tmp_path, previous=True))
    sigs = dump.signals(T0 + timedelta(minutes=20))
    assert [(s.ref.name, s.source) for s in sigs] == [("run-0", "main")]  # one signal, not two
    view = analyze(sigs, ClaimSettings(), T0 + timedelta(minutes=20))
    assert view.replayed == 15 and view.last_step == 129
    assert max(a.at for a in view.advances) < T0 + timedelta(minutes=15)  # nothing after the restart advanced


def test_without_the_previous_log_the_replay_cannot_be_seen(tmp_path: Path) -> None:
    # the control: the same current log alone reads as advancing (why the previous log is read)
    dump = load_dump(_write(tmp_path, previous=False))
    view = analyze(dump.signals(T0 + timedelta(minutes=20)), ClaimSettings(), T0 + timedelta(minutes=20))
    assert view.replayed == 0 and view.last_step == 124


def test_a_containers_current_file_stands_for_its_logs_txt_section(tmp_path: Path) -> None:
    """`kubectl cluster-info dump` writes logs.txt without kubelet timestamps; the README's procedure adds
    `kubectl logs --timestamps -c C > C-current.txt`. The stamped file is read for that container,
    joined with its previous log; the unstamped section is not read twice."""
    pod = tmp_path / "ns" / "run-0"
    pod.mkdir(parents=True)
    stamped = [_megatron(T0 + timedelta(seconds=20 * i), 100 + i) for i in range(30)]
    bare = [line.split(" ", 1)[1] for line in stamped]  # as cluster-info dump writes it: no stamps
    (pod / "logs.txt").write_text("==== START logs for container main of pod ns/run-0 ====\n" + "\n".join(bare)
                                  + "\n==== END logs for container main of pod ns/run-0 ====\n"
                                  "==== START logs for container shipper of pod ns/run-0 ====\nshipping\n"
                                  "==== END logs for container shipper of pod ns/run-0 ====\n")
    (pod / "main-current.txt").write_text("\n".join(stamped) + "\n")
    (pod / "main-previous.txt").write_text(_megatron(T0 - timedelta(minutes=5), 95) + "\n")
    dump = load_dump(tmp_path)
    sigs = dump.signals(T0 + timedelta(minutes=20))
    assert sorted((s.ref.name, s.source) for s in sigs) == [("run-0", "main"), ("run-0", "shipper")]
    main = next(s for s in sigs if s.source == "main")
    assert all(x.at is not None for x in main.scan.samples)  # the stamped file, not the bare section
    assert [x.step for x in main.scan.samples][:2] == [95, 100]  # led by its previous log
