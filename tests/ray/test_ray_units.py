"""The Ray source's pure parts, no Ray needed: counter semantics, response shapes, URL helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from collector.claims.progress import ProgressView, analyze
from collector.correlate import Signal
from collector.model import Plane, Ref
from collector.settings import ClaimSettings
from collector.sources.ray import RayJobInfo, RayProgress, RaySourceError, count_alive, parse_metrics, select_job
from collector.sources.ray_urls import dashboard_url_for, metrics_url_for

T0 = datetime(2026, 1, 1, tzinfo=UTC)
S = ClaimSettings(stall_floor=timedelta(seconds=10), scrape_interval=timedelta(seconds=1))
REF = Ref("RayCluster", "ns", "c")


def expo(values: dict[str, float], loss: float | None = None) -> str:
    lines = ["# HELP ray_train_steps_total steps", "# TYPE ray_train_steps_total counter"]
    lines += [f'ray_train_steps_total{{SessionName="s",WorkerId="{w}"}} {v}' for w, v in values.items()]
    if loss is not None:
        lines += ["# TYPE ray_train_loss gauge", f'ray_train_loss{{WorkerId="a"}} {loss}']
    return "\n".join(lines) + "\n"


def feed(p: RayProgress, scrapes: list[dict[str, float]], loss: float | None = None) -> None:
    for i, values in enumerate(scrapes):
        p.observe(parse_metrics(expo(values, loss)), T0 + timedelta(seconds=i))


def view_of(p: RayProgress) -> ProgressView:
    return analyze([Signal(REF, "ray-metrics", p.scan(), T0, Plane.RAY)], S)


def test_sums_label_sets_and_keeps_only_changes() -> None:
    p = RayProgress()
    feed(p, [{"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 2, "b": 3}, {"a": 2, "b": 3}, {"a": 4, "b": 3}])
    at = [T0 + timedelta(seconds=i) for i in range(5)]
    assert [(s.step, s.at) for s in p.samples] == [(3, at[0]), (5, at[2]), (7, at[4])]
    assert [a.step for a in view_of(p).advances] == [3, 5, 7]


def test_reset_is_replay_until_the_old_high_water_mark() -> None:
    p = RayProgress()
    feed(p, [{"a": 10}, {"a": 20}, {"a": 0}, {"a": 5}, {"a": 15}, {"a": 20}, {"a": 25}])
    view = view_of(p)
    assert [a.step for a in view.advances] == [10, 20, 25]
    assert view.replayed == 3 and p.resets == 1  # 0, 5, 15 (20 equals the mark)
    assert any("fell from 20 to 0" in d for d in p.scan().diagnostics)


def test_high_water_mark_survives_the_bounded_history() -> None:
    p = RayProgress(history=4)
    feed(p, [{"a": 100}, {"a": 0}, {"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}])
    assert p.samples[0].step == 100 and len(p.samples) == 5
    assert [a.step for a in view_of(p).advances] == [100]


def test_loss_and_nonfinite() -> None:
    p = RayProgress()
    feed(p, [{"a": 1}, {"a": 2}], loss=0.5)
    assert p.samples[-1].loss == 0.5
    p.observe(parse_metrics(expo({"a": 3}, float("nan"))), T0 + timedelta(seconds=9))
    assert view_of(p).nonfinite_since is not None


def test_absent_and_invalid_counter_are_diagnostics() -> None:
    p = RayProgress()
    sample, diag = p.observe(parse_metrics("# TYPE other gauge\nother 1\n"), T0)
    assert sample is None and "not exposed" in diag
    sample, diag = p.observe(parse_metrics(expo({"a": float("nan")})), T0)
    assert sample is None and "invalid value" in diag
    assert p.samples == ()


@pytest.mark.parametrize("text", ["<!doctype html><html></html>", 'ray_train_steps_total{a="b', "x y z\n"])
def test_garbage_is_a_permanent_error(text: str) -> None:
    with pytest.raises(RaySourceError) as e:
        parse_metrics(text)
    assert not e.value.retryable and "not Prometheus text" in str(e.value)


def test_state_api_envelope() -> None:
    # As Ray 2.60 answers GET /api/v0/nodes.
    doc = {"result": True, "msg": "", "data": {"result": {
        "total": 3, "num_after_truncation": 3, "num_filtered": 3, "partial_failure_warning": "", "warnings": None,
        "result": [{"node_id": "a", "state": "ALIVE"}, {"node_id": "b", "state": "DEAD"},
                   {"node_id": "c", "state": "ALIVE"}]}}}
    assert count_alive(doc) == 2
    truncated = {"result": True, "data": {"result": {"num_after_truncation": 1, "num_filtered": 7,
                                                     "result": [{"state": "ALIVE"}]}}}
    assert count_alive(truncated) == 7
    with pytest.raises(RaySourceError) as e:
        count_alive({"result": False, "msg": "GCS timed out", "data": {}})
    assert e.value.retryable
    with pytest.raises(RaySourceError) as e:
        count_alive({"result": True, "data": {}})
    assert not e.value.retryable


def test_job_selection() -> None:
    old = RayJobInfo.from_json({"type": "SUBMISSION", "submission_id": "raysubmit_a", "job_id": "01000000",
                                "status": "SUCCEEDED", "message": "ok", "start_time": 1_000, "end_time": 2_000})
    new = RayJobInfo.from_json({"type": "SUBMISSION", "submission_id": "raysubmit_b", "job_id": None,
                                "status": "PENDING", "message": "Job has not started yet.", "start_time": 3_000,
                                "end_time": None, "driver_exit_code": None})
    assert new.job_id == "" and new.end_time is None and old.start_time == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert select_job([old, new], None) is new
    assert select_job([old, new], "01000000") is old and select_job([old, new], "raysubmit_a") is old
    assert select_job([old, new], "nope") is None and select_job([], None) is None


def test_url_helpers() -> None:
    assert dashboard_url_for("ns", "c", rayjob_dashboard_url="c-head-svc.ns.svc.cluster.local:8265") == \
        "http://c-head-svc.ns.svc.cluster.local:8265"
    assert dashboard_url_for("ns", "c", head_service="c-head-svc", dashboard_port="8265") == \
        "http://c-head-svc.ns.svc.cluster.local:8265"
    assert dashboard_url_for("ns", "c", head_service="c-head-svc") == "http://c-head-svc.ns.svc.cluster.local:8265"
    assert dashboard_url_for("ns", "c", overrides={"ns/c": "http://127.0.0.1:8265/"},
                             head_service="c-head-svc") == "http://127.0.0.1:8265"
    assert dashboard_url_for("ns", "c") is None
    assert dashboard_url_for("ns", "c", head_service="Bad_Name") is None
    assert dashboard_url_for("ns", "c", head_service="svc", dashboard_port="http") is None
    assert metrics_url_for("ns", "c", head_service="c-head-svc", metrics_port=8080) == \
        "http://c-head-svc.ns.svc.cluster.local:8080/metrics"
    assert metrics_url_for("ns", "c", head_service="c-head-svc", cluster_domain="k8s.local") == \
        "http://c-head-svc.ns.svc.k8s.local:8080/metrics"
    assert metrics_url_for("ns", "c", overrides={"ns/c": "http://127.0.0.1:9000/metrics"}) == \
        "http://127.0.0.1:9000/metrics"
