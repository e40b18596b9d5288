"""Property tests over what tenants' and nodes' endpoints answer (issue 9): Prometheus text from a
dcgm-exporter or a Ray head, and a node agent's /evidence document.

Each is read from a peer the controller does not control. Whatever comes: no exception but the
source's own error class (which names the source and the problem), what parsed before a bad line
is kept where the reader promises it, and nothing grows past the input.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.sources.agents import AgentEndpoint, AgentReadError, parse_evidence
from collector.sources.dcgm import parse_dcgm
from collector.sources.ray import RayJobInfo, RayProgress, RaySourceError, count_alive, gpu_activity, parse_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
DCGM = (FIXTURES / "dcgm_datadog_fixture_metrics.txt").read_text()
RAY = (FIXTURES / "ray_worker_node_metrics_datadog_fixture_head16k.txt").read_text()
NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
AGENT = AgentEndpoint("gpu-0", "taugrid-agent-x", "http://10.0.0.7:9465")

# Lines that are nearly exposition: names, labels, values and comments, cut and mixed.
_NAME = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True)
_LABEL_VALUE = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_VALUE = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "0x10", "", "1,5", "--1"]))


@st.composite
def _line(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 5))
    name = draw(_NAME)
    if kind == 0:
        kind_name = draw(st.sampled_from(["gauge", "counter", "histogram", "summary", "untyped", "bogus"]))
        return f"# TYPE {name} {kind_name}"
    if kind == 1:
        return f"# HELP {name} {draw(_LABEL_VALUE)}"
    if kind == 2:
        labels = draw(st.dictionaries(_NAME, _LABEL_VALUE, max_size=3))
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return f"{name}{{{inner}}} {draw(_VALUE)}"
    if kind == 3:
        return f"{name} {draw(_VALUE)}"
    if kind == 4:  # a real line, cut anywhere
        real = draw(st.sampled_from(DCGM.splitlines() + RAY.splitlines()))
        return real[:draw(st.integers(0, len(real)))]
    return draw(st.text(max_size=40))


_TEXT = st.lists(_line(), max_size=30).map("\n".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT)
def test_dcgm_text_never_raises_and_names_where_it_stopped(text: str) -> None:
    scrape = parse_dcgm(text, source="http://10.0.0.7:9400/metrics")
    assert all(p.startswith("http://10.0.0.7:9400/metrics: ") for p in scrape.problems)
    assert len(scrape.gpus) <= text.count("\n") + 1  # at most a GPU per line


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, len(DCGM)),
       garbage=st.sampled_from(['{{{', 'x{a="', '"\\', "DCGM_FI_DEV_GPU_UTIL{ 1", "\x00"]))
def test_a_bad_line_in_dcgm_text_keeps_what_parsed_and_says_so(cut: int, garbage: str) -> None:
    """A garbled line stops the exposition parser (prometheus_client): the families it finished
    before stay, nothing is invented, and the scrape says where it stopped."""
    whole = parse_dcgm(DCGM)
    head = DCGM[:cut].rsplit("\n", 1)[0] + "\n" if "\n" in DCGM[:cut] else ""
    scrape = parse_dcgm(head + garbage + "\n" + DCGM[len(head):], source="dcgm")
    assert {g.uuid for g in scrape.gpus} <= {g.uuid for g in whole.gpus}
    assert sum(len(g.values) for g in scrape.gpus) <= sum(len(g.values) for g in whole.gpus)
    stopped = [p for p in scrape.problems if "exposition stops parsing" in p]
    assert stopped and stopped[0].startswith("dcgm: ") and f"kept {len(scrape.gpus)} GPU series" in stopped[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT)
def test_ray_metrics_parse_or_raise_one_permanent_error(text: str) -> None:
    try:
        families = parse_metrics(text)
    except RaySourceError as e:
        assert not e.retryable and str(e).startswith("metrics: not Prometheus text")
        return
    activity = gpu_activity(families)  # what the poller takes from a head's metrics
    assert activity["gpu_utilization"] is None or math.isfinite(activity["gpu_utilization"])
    progress = RayProgress()
    sample, _ = progress.observe(families, NOW)
    assert sample is None or (isinstance(sample.step, int) and sample.step >= 0)  # never a negative or NaN step


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20)
_KEYS = ["version", "node", "epoch", "poll", "nvml", "podresources", "xids", "gpus", "allocations", "logs"]


@st.composite
def _document(draw: st.DrawFn) -> Any:
    """An /evidence document with the real keys holding anything, or entries shaped almost right."""
    doc: dict[str, Any] = {k: draw(_JSON) for k in draw(st.lists(st.sampled_from(_KEYS), unique=True))}
    if draw(st.booleans()):
        doc["version"] = 1
    gpu = st.fixed_dictionaries({"uuid": _JSON | st.just("GPU-1"), "index": _JSON, "utilization": _JSON,
                                 "power_w": _JSON, "lost": _JSON, "pods": _JSON | st.lists(
                                     st.fixed_dictionaries({"pod": _JSON, "namespace": _JSON, "container": _JSON}),
                                     max_size=2)})
    log = st.fixed_dictionaries({"pod": _JSON | st.just("w0"), "namespace": _JSON, "container": _JSON | st.just("main"),
                                 "after": _JSON, "format": _JSON, "lines": _JSON,
                                 "samples": _JSON | st.lists(st.lists(_JSON | st.just(7), min_size=5, max_size=7),
                                                             max_size=3),
                                 "hangs": _JSON | st.lists(st.fixed_dictionaries({"kind": _JSON, "collective": _JSON,
                                                                                  "at": _JSON}), max_size=2),
                                 "xids": _JSON, "diagnostics": _JSON})
    if draw(st.booleans()):
        doc["gpus"] = draw(st.lists(gpu, max_size=3))
    if draw(st.booleans()):
        doc["logs"] = draw(st.lists(log, max_size=3))
    return doc


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_document() | _JSON)
def test_an_agent_document_is_a_report_or_one_clear_error(doc: Any) -> None:
    try:
        report = parse_evidence(doc, AGENT, NOW)
    except AgentReadError as e:
        assert str(e).startswith("http://10.0.0.7:9465/evidence: ")
        return
    assert report.read_at == NOW  # the reader's clock, never the agent's
    entries = doc.get("logs") if isinstance(doc.get("logs"), list) else []
    assert len(report.logs) <= len(entries)
    for c in report.logs:  # typed as the claims read them, whatever the types sent
        assert c.pod and c.container
        assert all(isinstance(s.step, int) and (s.at is None or isinstance(s.at, datetime))
                   and (s.loss is None or isinstance(s.loss, float)) for s in c.scan.samples)
        assert all(h.collective is None or isinstance(h.collective, str) for h in c.scan.hangs)
        assert len(c.scan.diagnostics) <= 10


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_JSON | st.fixed_dictionaries({"result": _JSON, "data": _JSON | st.fixed_dictionaries(
    {"result": _JSON | st.fixed_dictionaries({"result": _JSON, "num_after_truncation": _JSON,
                                             "num_filtered": _JSON})})}))
def test_a_ray_state_answer_is_a_count_or_one_error(doc: Any) -> None:
    try:
        alive = count_alive(doc)
    except RaySourceError as e:
        assert str(e).startswith("state API")
        return
    assert isinstance(alive, int) and alive >= 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.dictionaries(st.sampled_from(["submission_id", "job_id", "type", "status", "message", "entrypoint",
                                            "start_time", "end_time", "error_type", "driver_exit_code"]), _JSON))
def test_a_ray_job_entry_of_any_types_is_read_as_strings_times_and_codes(doc: dict[str, Any]) -> None:
    job = RayJobInfo.from_json(doc)
    assert all(isinstance(v, str) for v in (job.submission_id, job.job_id, job.type, job.status, job.message))
    assert job.start_time is None or job.start_time.tzinfo is not None
    assert job.driver_exit_code is None or type(job.driver_exit_code) is int
