"""ClaimsExporter and HealthMetrics on hand-built claims: families, labels, values, retention."""

from __future__ import annotations

import sys
import threading
import urllib.request
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from exporter_samples import T0, blocked_run, crashlooping_run, one, scrape
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.model import Observed, Plane, Ref, RunClaims, Stage
from exporters.prometheus import ClaimsExporter, new_registry, render, serve, shutdown
from exporters.prometheus_health import ErrorClass, HealthMetrics


@pytest.fixture
def registry() -> CollectorRegistry:
    return new_registry()


def test_claims_one_series_per_run_and_claim_with_the_value_in_a_label(registry: CollectorRegistry) -> None:
    exp = ClaimsExporter(registry)
    exp.update([crashlooping_run(), blocked_run()], T0)
    s = scrape(registry)

    run = {"namespace": "research", "run": "llm-pretrain", "kind": "TauRun"}
    verdicts = {
        lab["claim"]: lab["verdict"]
        for lab, v in s["taugrid_run_claim_state"]
        if lab["run"] == "llm-pretrain"
    }
    assert verdicts == {"scheduled": "verified", "running": "contradicted", "progressing": "unconfirmed"}
    observed = {
        lab["claim"]: lab["observed"]
        for lab, v in s["taugrid_run_claim_state"]
        if lab["run"] == "llm-pretrain"
    }
    assert observed == {"scheduled": "true", "running": "false", "progressing": "unknown"}
    assert all(v == 1.0 for _, v in s["taugrid_run_claim_state"])
    assert len(s["taugrid_run_claim_state"]) == 6  # 2 runs × 3 claims, no state-set fan-out

    since = "taugrid_run_claim_since_timestamp_seconds"
    assert one(s, since, claim="running", **run) == (T0 - timedelta(minutes=5)).timestamp()
    assert not [lab for lab, _ in s[since] if lab["run"] == "llm-pretrain" and lab["claim"] == "progressing"]

    assert one(s, "taugrid_run_finished", **run) == 0.0
    assert one(s, "taugrid_run_evaluated_timestamp_seconds", **run) == T0.timestamp()


def test_blocked_stage_owner_and_age(registry: CollectorRegistry) -> None:
    exp = ClaimsExporter(registry)
    exp.update([crashlooping_run(), blocked_run()], T0 + timedelta(seconds=30))
    s = scrape(registry)
    assert s["taugrid_run_blocked"] == [
        (
            {
                "namespace": "team-b",
                "run": "queued",
                "kind": "RayJob",
                "stage": "queue-admission",
                "owner": "Kueue",
            },
            1.0,
        )
    ]
    # Age counts against the exporter's latest `now`, not the run's evaluation time.
    assert one(s, "taugrid_run_blocked_age_seconds", run="queued", owner="Kueue") == 630.0

    waiting = blocked_run()
    assert waiting.blocked is not None
    unknown_start = replace(waiting, blocked=replace(waiting.blocked, since=None))
    exp.update([unknown_start], T0 + timedelta(seconds=30))
    s = scrape(registry)
    assert one(s, "taugrid_run_blocked", run="queued", stage=Stage.QUEUE_ADMISSION.value) == 1.0
    assert "taugrid_run_blocked_age_seconds" not in s


def test_evidence_age_is_the_newest_per_plane_across_claims_and_grows_with_now(
    registry: CollectorRegistry,
) -> None:
    exp = ClaimsExporter(registry)
    exp.update([crashlooping_run()], T0)
    s = scrape(registry)
    ages = {lab["plane"]: v for lab, v in s["taugrid_run_evidence_age_seconds"]}
    # kubernetes: newest of 20 s and 90 s; logs: only the timed last_step counts, the untimed item adds nothing.
    assert ages == {"kueue": 1800.0, "kubernetes": 20.0, "ray": 240.0, "logs": 240.0}

    exp.update([], T0 + timedelta(seconds=100))  # no re-evaluation: ages keep growing
    ages = {lab["plane"]: v for lab, v in scrape(registry)["taugrid_run_evidence_age_seconds"]}
    assert ages["kubernetes"] == 120.0

    exp.update([], T0 - timedelta(hours=1))  # an older `now` never winds the clock back
    assert one(scrape(registry), "taugrid_run_evidence_age_seconds", plane=Plane.KUBERNETES.value) == 120.0


def test_evidence_from_the_future_is_clamped_to_zero(registry: CollectorRegistry) -> None:
    exp = ClaimsExporter(registry)
    exp.update([crashlooping_run(at=T0 + timedelta(minutes=1))], T0)
    s = scrape(registry)
    assert one(s, "taugrid_run_evidence_age_seconds", plane="kubernetes") == 0.0


def test_no_reason_uid_or_message_reaches_the_exposition(registry: CollectorRegistry) -> None:
    exp = ClaimsExporter(registry)
    exp.update([crashlooping_run(), blocked_run()], T0)
    text = render(registry).decode()
    for forbidden in ("uid-1", "uid-b", "reason", "quota", "1234-abcd", "Pod/research"):
        assert forbidden not in text


def test_update_replaces_a_runs_series_and_replace_true_drops_absent_runs(
    registry: CollectorRegistry,
) -> None:
    exp = ClaimsExporter(registry)
    exp.update([crashlooping_run(), blocked_run()], T0)
    fixed = crashlooping_run()
    fixed = replace(
        fixed, running=replace(fixed.running, observed=Observed.TRUE, verdict=fixed.scheduled.verdict)
    )
    exp.update([fixed], T0 + timedelta(seconds=1))
    s = scrape(registry)
    assert one(s, "taugrid_run_claim_state", run="llm-pretrain", claim="running", verdict="verified") == 1.0
    assert len(s["taugrid_run_claim_state"]) == 6  # the old verdict series is gone, the other run stays

    exp.update([fixed], T0 + timedelta(seconds=2), replace=True)
    assert [r.name for r in exp.runs()] == ["llm-pretrain"]
    assert exp.forget(fixed.ref) is True
    assert exp.forget(fixed.ref) is False
    assert "taugrid_run_claim_state" not in scrape(registry)


def test_finished_runs_go_after_retention_and_stay_gone(registry: CollectorRegistry) -> None:
    exp = ClaimsExporter(registry, retention=timedelta(minutes=10))
    live = blocked_run()
    done = crashlooping_run(finished=True, at=T0)
    exp.update([live, done], T0)
    assert one(scrape(registry), "taugrid_run_finished", run="llm-pretrain") == 1.0

    # Re-evaluations keep the first time the run was seen finished.
    exp.update(
        [live, crashlooping_run(finished=True, at=T0 + timedelta(minutes=9))], T0 + timedelta(minutes=9)
    )
    assert {r.name for r in exp.runs()} == {"queued", "llm-pretrain"}

    exp.update(
        [live, crashlooping_run(finished=True, at=T0 + timedelta(minutes=10))], T0 + timedelta(minutes=10)
    )
    assert {r.name for r in exp.runs()} == {"queued"}
    assert not [
        lab for lab, _ in scrape(registry)["taugrid_run_claim_state"] if lab["run"] == "llm-pretrain"
    ]

    # The controller keeps sending the same finished run: it stays gone.
    exp.update([crashlooping_run(finished=True, at=T0 + timedelta(minutes=11))], T0 + timedelta(minutes=11))
    assert {r.name for r in exp.runs()} == {"queued"}

    # A new run under the same name (new uid) is exported again, with its own retention.
    again = crashlooping_run(uid="uid-2", finished=True, at=T0 + timedelta(minutes=12))
    exp.update([again], T0 + timedelta(minutes=12))
    assert {r.name for r in exp.runs()} == {"queued", "llm-pretrain"}
    exp.update([], T0 + timedelta(minutes=22))
    assert {r.name for r in exp.runs()} == {"queued"}


def test_a_retired_run_that_is_not_finished_any_more_comes_back(registry: CollectorRegistry) -> None:
    exp = ClaimsExporter(registry, retention=timedelta(0))
    exp.update([crashlooping_run(finished=True)], T0)
    assert exp.runs() == []
    exp.update([crashlooping_run(finished=False)], T0 + timedelta(seconds=1))
    assert [r.name for r in exp.runs()] == ["llm-pretrain"]


def test_forget_clears_a_retired_run(registry: CollectorRegistry) -> None:
    exp = ClaimsExporter(registry, retention=timedelta(0))
    exp.update([crashlooping_run(finished=True)], T0)
    exp.forget(Ref("TauRun", "research", "llm-pretrain"))
    exp.update([crashlooping_run(finished=True, at=T0 + timedelta(seconds=1))], T0)
    assert [r.name for r in exp.runs()] == ["llm-pretrain"]  # seen afresh; expires at the next pass
    exp.update([], T0 + timedelta(seconds=1))
    assert exp.runs() == []


def test_negative_retention_is_refused() -> None:
    with pytest.raises(ValueError):
        ClaimsExporter(retention=timedelta(seconds=-1))


def test_dedicated_registry_only_and_no_duplicate_families(registry: CollectorRegistry) -> None:
    ClaimsExporter(registry).update([crashlooping_run()], T0)
    HealthMetrics(registry)
    assert REGISTRY.get_sample_value("taugrid_run_finished", {"run": "llm-pretrain"}) is None
    assert REGISTRY.get_sample_value("taugrid_collector_runs_tracked") is None
    with pytest.raises(ValueError):
        ClaimsExporter(registry)
    with pytest.raises(ValueError):
        HealthMetrics(registry)


def test_health_metrics(registry: CollectorRegistry) -> None:
    health = HealthMetrics(registry, resources=["pods", "events"], sources=["kubernetes"], version="1.2.3")
    s = scrape(registry)
    # Pre-declared names start at zero, so rate() has a baseline before the first event.
    assert one(s, "taugrid_collector_relists_total", resource="events") == 0.0
    assert one(s, "taugrid_collector_errors_total", source="kubernetes", **{"class": "permanent"}) == 0.0

    health.watch_restarted("pods")
    health.relisted("pods")
    health.events_processed("pods", 41)
    health.events_processed("pods")
    health.error("kubernetes", ErrorClass.RETRYABLE)
    health.error("ray", "permanent")
    health.synced("pods", T0)
    health.set_runs_tracked(7)
    health.observe_evaluation(0.003)
    with health.time_evaluation():
        pass
    with pytest.raises(ValueError):
        health.error("ray", "transient")

    s = scrape(registry)
    assert one(s, "taugrid_collector_watch_restarts_total", resource="pods") == 1.0
    assert one(s, "taugrid_collector_relists_total", resource="pods") == 1.0
    assert one(s, "taugrid_collector_events_processed_total", resource="pods") == 42.0
    assert one(s, "taugrid_collector_errors_total", source="kubernetes", **{"class": "retryable"}) == 1.0
    assert one(s, "taugrid_collector_errors_total", source="ray", **{"class": "permanent"}) == 1.0
    assert one(s, "taugrid_collector_last_sync_timestamp_seconds", resource="pods") == T0.timestamp()
    assert one(s, "taugrid_collector_runs_tracked") == 7.0
    assert one(s, "taugrid_collector_evaluation_duration_seconds_count") == 2.0
    assert one(s, "taugrid_collector_evaluation_duration_seconds_bucket", le="0.005") >= 1.0
    assert one(s, "taugrid_collector_build_info", version="1.2.3") == 1.0
    assert not [name for name in s if name.endswith("_created")]


def test_concurrent_updates_and_scrapes_stay_consistent(registry: CollectorRegistry) -> None:
    """Smoke: writers upsert and forget while readers render; every exposition parses and is whole."""
    exp = ClaimsExporter(registry, retention=timedelta(seconds=5))
    stop = threading.Event()
    errors: list[BaseException] = []
    renders = [0]

    def writer(w: int) -> None:
        try:
            for i in range(150):
                now = T0 + timedelta(seconds=i)
                rc = crashlooping_run(name=f"r{w}-{i % 25}", uid=f"u{w}-{i}", at=now, finished=i % 3 == 0)
                exp.update([rc, blocked_run(name=f"b{w}", at=now)], now)
                if i % 7 == 0:
                    exp.forget(rc.ref)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def reader() -> None:
        try:
            while not stop.is_set():
                per_run: dict[str, int] = {}
                for fam in text_string_to_metric_families(render(registry).decode()):
                    if fam.name == "taugrid_run_claim_state":
                        for smp in fam.samples:
                            per_run[smp.labels["run"]] = per_run.get(smp.labels["run"], 0) + 1
                assert all(n == 3 for n in per_run.values()), per_run
                renders[0] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    # Switch threads often: more interleavings, and writers are not starved for 5 ms at a time.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in readers + writers:
            t.start()
        for t in writers:
            t.join(30)
        stop.set()
        for t in readers:
            t.join(30)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
    assert renders[0] > 0
    assert {r.name for r in exp.runs()} >= {"b0", "b1", "b2", "b3"}


def test_serve_exposes_metrics_over_http(registry: CollectorRegistry) -> None:
    ClaimsExporter(registry).update([crashlooping_run()], T0)
    server, thread = serve(registry, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert "taugrid_run_claim_state{" in body and 'verdict="contradicted"' in body
    finally:
        shutdown(server, thread)
    assert not thread.is_alive()


def test_goodput_is_exported_per_bucket() -> None:
    registry = new_registry()
    ClaimsExporter(registry).update([crashlooping_run()], T0)
    samples = scrape(registry)
    assert one(samples, "taugrid_run_goodput_ratio", run="llm-pretrain") == pytest.approx(2 / 3)
    assert one(samples, "taugrid_run_time_seconds", run="llm-pretrain", bucket="productive") == 1200.0
    assert one(samples, "taugrid_run_time_seconds", run="llm-pretrain", bucket="restarting") == 300.0
    buckets = {labels["bucket"] for labels, _ in samples["taugrid_run_time_seconds"]}
    # stalled and replaying hold 0 s: no series until they hold time (a zero adds nothing to a sum)
    assert buckets == {"productive", "queued", "starting", "restarting"}


def test_productive_is_exported_even_at_zero() -> None:
    registry = new_registry()
    rc = crashlooping_run()
    assert rc.goodput is not None
    idle = replace(rc, goodput=replace(rc.goodput, productive_s=0.0, ratio=0.0))
    ClaimsExporter(registry).update([idle], T0)
    samples = scrape(registry)
    assert one(samples, "taugrid_run_time_seconds", run="llm-pretrain", bucket="productive") == 0.0
    assert render(registry) == generate_latest(registry)


def test_last_progress_is_exported_from_the_progressing_evidence() -> None:
    registry = new_registry()
    ClaimsExporter(registry).update([crashlooping_run(), blocked_run()], T0)
    samples = scrape(registry)
    assert one(samples, "taugrid_run_progress_last_step", run="llm-pretrain") == 1200
    assert one(samples, "taugrid_run_last_progress_timestamp_seconds", run="llm-pretrain") == \
        (T0 - timedelta(minutes=4)).timestamp()
    assert [lab["run"] for lab, _ in samples["taugrid_run_progress_last_step"]] == ["llm-pretrain"]


def test_a_carried_last_step_is_what_update_writes_for_the_same_claims() -> None:
    """`ClaimsExporter.carry` (a deferred run's last step moved between evaluations) keeps the entry's
    other lines and writes the last step's and the evidence ages anew: the exposition, the client's
    `collect` and the ages equal an exporter `update`d with the same claims, each time. A run exported
    from another evaluation, one not exported and a finished one go through `update`."""
    rc = crashlooping_run()

    def moved(c: RunClaims, step: int, at: datetime) -> RunClaims:
        evidence = tuple(replace(e, value=step, at=at) if e.field == "last_step" else e for e in c.progressing.evidence)
        return replace(c, progressing=replace(c.progressing, evidence=evidence))

    def same(a: ClaimsExporter, b: ClaimsExporter) -> None:
        assert a.exposition() == b.exposition()
        reg_a, reg_b = new_registry(), new_registry()
        reg_a.register(a)
        reg_b.register(b)
        assert generate_latest(reg_a) == generate_latest(reg_b)

    ex = ClaimsExporter()
    ex.update([rc, blocked_run()], T0)
    before = ex.exposition()
    for k, dt in enumerate((30, 60, 95)):
        now = T0 + timedelta(seconds=dt)
        carried = moved(rc, 1200 + 30 * (k + 1), now - timedelta(seconds=1))
        ex.carry(carried, now)
        ref = ClaimsExporter()
        ref.update([carried, blocked_run()], now)
        same(ex, ref)
        samples = scrape_one(ex)
        assert one(samples, "taugrid_run_progress_last_step", run="llm-pretrain") == 1200 + 30 * (k + 1)
        assert one(samples, "taugrid_run_evidence_age_seconds", run="llm-pretrain", plane="logs") == 1.0
    assert ex.exposition() != before
    # another evaluation's claims, a run not exported, a finished run: `update`'s entry all the same
    for other in (replace(moved(rc, 2000, T0), evaluated_at=T0 + timedelta(seconds=1)),
                  replace(moved(rc, 2000, T0), ref=Ref("TauRun", "research", "new-run", "uid-9")),
                  replace(moved(rc, 2000, T0), finished=True)):
        ex2, ref = ClaimsExporter(), ClaimsExporter()
        ex2.update([rc], T0)
        ex2.carry(other, T0 + timedelta(seconds=5))
        ref.update([rc], T0)
        ref.update([other], T0 + timedelta(seconds=5))
        same(ex2, ref)


def scrape_one(ex: ClaimsExporter) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = new_registry()
    registry.register(ex)
    return scrape(registry)


def test_queued_run_exports_its_position_and_admission_estimate(registry: CollectorRegistry) -> None:
    exp = ClaimsExporter(registry)
    queued = blocked_run()
    exp.update([crashlooping_run(), queued], T0)
    s = scrape(registry)
    run = {"namespace": "team-b", "run": "queued", "kind": "RayJob"}
    eta = "taugrid_run_admission_eta_seconds"
    assert {lab["bound"]: v for lab, v in s[eta]} == {"low": 600.0, "mid": 1800.0, "high": 5400.0}
    assert one(s, "taugrid_run_queue_position", queue="cluster", **run) == 3.0
    assert one(s, "taugrid_run_queue_position", queue="local", **run) == 1.0
    fast = {(f.name, tuple(sorted(x.labels.items())), x.value) for f in
            text_string_to_metric_families(exp.exposition().decode()) for x in f.samples
            if f.name in (eta, "taugrid_run_queue_position")}
    assert fast == {(name, tuple(sorted(lab.items())), v) for name in (eta, "taugrid_run_queue_position")
                    for lab, v in s[name]}  # the prepared text says what collect() says
    # unknown: the bounds go, the position stays; admitted: both go
    assert queued.queue is not None
    unknown = replace(queued.queue, eta=replace(queued.queue.eta, low_s=None, mid_s=None, high_s=None))
    exp.update([replace(queued, queue=unknown)], T0 + timedelta(seconds=1))
    s = scrape(registry)
    assert eta not in s and one(s, "taugrid_run_queue_position", queue="cluster", **run) == 3.0
    exp.update([replace(queued, queue=None, blocked=None)], T0 + timedelta(seconds=2))
    s = scrape(registry)
    assert eta not in s and "taugrid_run_queue_position" not in s


def test_stragglers_are_exported_as_suspects_only_and_follow_updates() -> None:
    from collector.model import Straggler, Stragglers

    registry = new_registry()
    exp = ClaimsExporter(registry)
    slow = Straggler("rank", "5", "llm-worker-5", "gpu-node-3", 0.15, T0, "arrival", "rank 5 printed last", lag_s=1.5)
    rc = replace(crashlooping_run(), stragglers=Stragglers((slow,), 8, 40, "rank 5 printed last"))
    exp.update([rc, blocked_run()], T0)
    s = scrape(registry)
    assert s["taugrid_run_straggler"] == [({"namespace": "research", "run": "llm-pretrain", "kind": "TauRun",
                                             "rank": "5", "pod": "llm-worker-5", "node": "gpu-node-3", "uuid": "",
                                             "basis": "arrival"}, 0.15)]
    # the same run with no suspect any more: its series goes (the text path reuses nothing stale)
    exp.update([replace(rc, stragglers=Stragglers((), 8, 40, "no rank apart")), blocked_run()], T0)
    assert "taugrid_run_straggler" not in scrape(registry) or not scrape(registry)["taugrid_run_straggler"]
    assert b"taugrid_run_straggler{" not in render(registry)
