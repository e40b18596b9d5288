"""Hand-built RunClaims and exposition helpers for the exporter tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.model import (
    Blocked,
    Claim,
    Evidence,
    Goodput,
    Observed,
    Plane,
    Ref,
    RunClaims,
    Stage,
    verdict_for,
)
from collector.queuefacts import AdmissionEta, QueueStatus

T0 = datetime(2026, 1, 10, 12, 0, 0, tzinfo=UTC)


def claim(
    asserted: bool | None,
    observed: Observed,
    since: datetime | None = T0,
    evidence: tuple[Evidence, ...] = (),
    reason: str = 'a reason with "quotes" and a uid 1234-abcd that must not become a label',
) -> Claim:
    return Claim(asserted, observed, verdict_for(asserted, observed), since, reason, evidence)


def ev(plane: Plane, at: datetime | None, field: str = "status.phase") -> Evidence:
    return Evidence(plane, "Pod/research/p-0", field, "Running", at)


def crashlooping_run(
    name: str = "llm-pretrain",
    namespace: str = "research",
    uid: str = "uid-1",
    at: datetime = T0,
    finished: bool = False,
) -> RunClaims:
    """Scheduled verified, running contradicted (crash loop), progressing unknown."""
    return RunClaims(
        ref=Ref("TauRun", namespace, name, uid),
        scheduled=claim(
            True, Observed.TRUE, at - timedelta(minutes=30), (ev(Plane.KUEUE, at - timedelta(minutes=30)),)
        ),
        running=claim(
            True,
            Observed.FALSE,
            at - timedelta(minutes=5),
            (
                ev(Plane.KUBERNETES, at - timedelta(seconds=20)),
                ev(Plane.KUBERNETES, at - timedelta(seconds=90)),
            ),
        ),
        progressing=claim(
            True, Observed.UNKNOWN, None, (ev(Plane.RAY, at - timedelta(minutes=4)), ev(Plane.LOGS, None),
                                           Evidence(Plane.LOGS, "p-0/main", "last_step", 1200,
                                                    at - timedelta(minutes=4)))
        ),
        blocked=None,
        evaluated_at=at,
        finished=finished,
        goodput=Goodput(allocated_s=1800.0, productive_s=1200.0,
                        badput_s={"queued": 60.0, "starting": 300.0, "stalled": 0.0, "restarting": 300.0,
                                  "replaying": 0.0}, ratio=1200.0 / 1800.0),
    )


def blocked_run(name: str = "queued", namespace: str = "team-b", at: datetime = T0) -> RunClaims:
    """Waiting for Kueue admission for 10 minutes; nothing asserted beyond Pending."""
    return RunClaims(
        ref=Ref("RayJob", namespace, name, "uid-b"),
        scheduled=claim(False, Observed.FALSE, at - timedelta(minutes=10)),
        running=claim(False, Observed.FALSE, at - timedelta(minutes=10)),
        progressing=claim(None, Observed.UNKNOWN, None),
        blocked=Blocked(
            Stage.QUEUE_ADMISSION,
            "ClusterQueue gpu-cq has no quota left",
            at - timedelta(minutes=10),
            (ev(Plane.KUEUE, at - timedelta(seconds=30), "status.conditions[QuotaReserved]"),),
        ),
        evaluated_at=at,
        queue=QueueStatus("gpu-cq", "lq", f"{namespace}/job-{name}", 3, 1, 7, (), (),
                          AdmissionEta(600.0, 1800.0, 5400.0, 0.8, "an estimate"), "Kueue visibility API"),
    )


Sample = tuple[dict[str, str], float]


def scrape(registry: CollectorRegistry) -> dict[str, list[Sample]]:
    """Sample name → [(labels, value)], through the text format and client_python's parser."""
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def one(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    """The value of the single sample of `name` whose labels include `labels`."""
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples in {samples.get(name)}"
    return hits[0]
