"""Ray Train's own metrics as progress where a run exports no step counter: report totals grow while
the controller is RUNNING (activity, never a step); a restart makes what follows replay-or-progress
(unknown), a stamp from the future or a stale value is no activity. At the metrics-text edge, in the
label shape Ray Train v2 exports (docs: Ray Train metrics; Ray's exporter adds its own labels)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector.claims.progress import ProgressView, analyze
from collector.correlate import Signal
from collector.model import Plane, Ref
from collector.settings import ClaimSettings
from collector.sources.ray import parse_metrics
from collector.sources.ray_progress import RayProgress

T0 = datetime(2026, 1, 1, tzinfo=UTC)
S = ClaimSettings(stall_floor=timedelta(seconds=10), scrape_interval=timedelta(seconds=1))
REF = Ref("RayCluster", "ns", "c")
RUN = 'ray_train_run_name="llm",ray_train_run_id="5e1f"'
STATES = ("INITIALIZING", "SCHEDULING", "RESCHEDULING", "RUNNING", "RESTARTING", "RESIZING", "ERRORED", "FINISHED")


def expo(totals: dict[tuple[int, str], float], state: str = "RUNNING", run: str = RUN, stamp: float | None = None,
         steps: int | None = None) -> str:
    """A scrape: the controller state gauge (1 for the current state) and each worker's report time."""
    ts = f" {round(stamp * 1000)}" if stamp is not None else ""  # exposition stamps are milliseconds
    lines = ["# HELP ray_train_controller_state Current state of the Ray Train controller.",
             "# TYPE ray_train_controller_state gauge"]
    lines += [f'ray_train_controller_state{{Component="core_worker",SessionName="s",{run},'
              f'ray_train_controller_state="{s}"}} {1.0 if s == state else 0.0}' for s in STATES]
    lines += ["# HELP ray_train_report_total_blocked_time_s Cumulative time in seconds to report a checkpoint "
              "to the storage.", "# TYPE ray_train_report_total_blocked_time_s gauge"]
    lines += [f'ray_train_report_total_blocked_time_s{{Component="core_worker",SessionName="s",{run},'
              f'ray_train_worker_world_rank="{rank}",ray_train_worker_actor_id="{actor}"}} {v}{ts}'
              for (rank, actor), v in totals.items()]
    if steps is not None:
        lines += ["# TYPE ray_train_steps_total counter", f'ray_train_steps_total{{WorkerId="a"}} {steps}']
    return "\n".join(lines) + "\n"


W = {(0, "a0"): 0.0, (1, "a1"): 0.0}


def grow(k: int) -> dict[tuple[int, str], float]:
    return {(0, "a0"): 0.25 * k, (1, "a1"): 0.3 * k}


def play(p: RayProgress, scrapes: list[str], start: int = 0) -> list[str]:
    diags = []
    for i, text in enumerate(scrapes):
        _, diag = p.observe(parse_metrics(text), T0 + timedelta(seconds=start + i))
        diags.append(diag)
    return diags


def view(p: RayProgress, now: datetime) -> ProgressView:
    return analyze([Signal(REF, "ray-metrics", p.scan(), now, Plane.RAY)], S, now)


def test_report_totals_that_grow_while_running_are_activity_without_a_step() -> None:
    p = RayProgress()
    play(p, [expo(grow(k)) for k in range(1, 6)])
    # the first reading is a baseline (when its reports were made is unknown); each growth after it counts
    assert [(s.step, s.at) for s in p.samples] == [(None, T0 + timedelta(seconds=i)) for i in range(1, 5)]
    v = view(p, T0 + timedelta(seconds=5))
    assert v.last is not None and v.last.step is None and v.replaying is None and v.blind is None


def test_no_growth_or_controller_not_running_is_no_activity() -> None:
    p = RayProgress()
    diags = play(p, [expo(grow(1)), expo(grow(1)), expo(grow(2), state="SCHEDULING"), expo(grow(3), state="FINISHED"),
                     expo(grow(4), state="ERRORED")])
    assert p.samples == ()
    assert "controller SCHEDULING" in diags[2] and "controller FINISHED" in diags[3]


def test_a_restart_makes_later_reports_unknown_not_progress() -> None:
    """A worker restarts (Ray Train RESTARTING, the rank back on a new actor, its total from zero):
    the reports after it may replay ones made before; with no step number nothing shows it passed
    its old mark, so the claim reads unknown (blind), never progressing."""
    p = RayProgress()
    play(p, [expo(grow(k)) for k in range(1, 4)])  # two activity samples
    play(p, [expo(grow(3), state="RESTARTING")], start=3)
    after = [expo({(0, "b0"): 0.1 * k, (1, "b1"): 0.1 * k}) for k in range(1, 4)]
    play(p, after, start=4)
    assert p.resets == 1 and any("RESTARTING" in n for n in p.notes)
    v = view(p, T0 + timedelta(seconds=7))
    assert v.blind is not None and v.blind.last.at == T0 + timedelta(seconds=6)
    assert v.last is not None and v.last.at == T0 + timedelta(seconds=2)  # progress ends at the restart


def test_a_total_that_falls_or_a_new_actor_is_a_restart_even_without_the_controller_saying_so() -> None:
    for label, second in (("fell", {(0, "a0"): 0.1, (1, "a1"): 0.9}),
                          ("actor", {(0, "a0"): 0.9, (1, "c1"): 0.9})):
        p = RayProgress()
        play(p, [expo(grow(1)), expo(grow(2)), expo(second)])
        assert p.resets == 1, label
        assert len(p.scan().resumes) == 1, label
    p = RayProgress()
    play(p, [expo(grow(1)), expo(grow(2)), expo(grow(3), run='ray_train_run_name="llm",ray_train_run_id="77aa"')])
    assert p.resets == 1 and any("new Ray Train run id 77aa" in n for n in p.notes)


def test_a_restart_before_any_activity_withholds_what_follows() -> None:
    p = RayProgress()
    diags = play(p, [expo(grow(1)), expo(grow(1), state="RESTARTING"), expo(grow(2)), expo(grow(3))])
    assert p.samples == () and "replay or progress unknown" in diags[-1]


def test_a_stamp_from_the_future_or_a_stale_stamp_is_no_activity() -> None:
    p = RayProgress()
    future = (T0 + timedelta(hours=1)).timestamp()
    diags = play(p, [expo(grow(1)), expo(grow(2), stamp=future)])
    assert p.samples == () and "ahead of the scrape" in diags[1]
    p = RayProgress()
    old = (T0 - timedelta(minutes=5)).timestamp()
    diags = play(p, [expo(grow(1), stamp=old), expo(grow(2), stamp=old)])
    assert p.samples == () and "stale" in diags[1]
    p = RayProgress()  # a stamp that moves with the scrapes is fine
    play(p, [expo(grow(k), stamp=(T0 + timedelta(seconds=k - 1)).timestamp()) for k in range(1, 4)])
    assert len(p.samples) == 2


def test_the_runs_own_step_counter_wins_where_exposed() -> None:
    p = RayProgress()
    play(p, [expo(grow(k), steps=10 * k) for k in range(1, 4)])
    assert [s.step for s in p.samples] == [10, 20, 30]
    # once the run's counter was seen, Ray Train's totals never stand in for it
    play(p, [expo(grow(4)), expo(grow(5))], start=3)
    assert [s.step for s in p.samples] == [10, 20, 30]


def test_invalid_totals_and_ambiguous_state_are_not_progress() -> None:
    p = RayProgress()
    diags = play(p, [expo(grow(1)), expo({(0, "a0"): float("nan"), (1, "a1"): 1.0})])
    assert p.samples == () and "invalid value" in diags[1]
    # RUNNING and FINISHED both 1: which is current cannot be told
    both = expo(grow(2)).replace('"FINISHED"} 0.0', '"FINISHED"} 1.0')
    p = RayProgress()
    diags = play(p, [expo(grow(1)), both])
    assert p.samples == () and "2 states at once" in diags[1]


def test_controller_state_leaving_the_scrape_keeps_its_last_value() -> None:
    """Ray exports the state gauge around its changes only: absent, the last state seen stands."""
    def bare(k: int) -> str:
        return "\n".join(x for x in expo(grow(k)).splitlines() if "controller_state" not in x) + "\n"
    p = RayProgress()
    play(p, [expo(grow(1)), bare(2), bare(3)])
    assert len(p.samples) == 2
    p = RayProgress()
    play(p, [expo(grow(1), state="FINISHED"), bare(2), bare(3)])
    assert p.samples == ()


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "metrics" / \
    "ray_train_v2_report_totals_ray260_local_capture.txt"


def test_a_real_ray_train_run_reads_as_report_activity() -> None:
    """A local Ray 2.60 head's scrapes while a DataParallelTrainer reported each step (SOURCES.tsv):
    the controller goes SCHEDULING → RUNNING and its gauge then leaves the scrape; the worker's report
    total climbs in steps. Every climb after the first reading is activity; nothing is a restart."""
    scrapes = re.split(r"^# scrape \d+ \+(\d+) s\n", FIXTURE.read_text(), flags=re.MULTILINE)[1:]
    texts = [(int(t), body) for t, body in zip(scrapes[::2], scrapes[1::2], strict=True)]
    assert len(texts) == 14
    p = RayProgress()
    for t, body in texts:
        p.observe(parse_metrics(body), T0 + timedelta(seconds=t))
    totals = [max((s.value for f in parse_metrics(b) for s in f.samples
                   if s.name == "ray_train_report_total_blocked_time_s"), default=None) for _, b in texts]
    climbs = sum(1 for a, b in zip(totals, totals[1:], strict=False) if a is not None and b is not None and b > a)
    assert climbs >= 5 and len(p.samples) == climbs and p.resets == 0
    assert all(s.step is None and s.format == "ray-train-report" for s in p.samples)
    last = texts[-1][0]
    v = view(p, T0 + timedelta(seconds=last))
    assert v.last is not None and v.blind is None and v.replaying is None
