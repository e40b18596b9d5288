"""The per-run metric families of `exporters.prometheus.ClaimsExporter`: names, help, labels, and
the text templates its prepared text is written with (docs/metrics.md documents each family; a test
keeps the two in step)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import GaugeMetricFamily

RUN_LABELS = ("namespace", "run", "kind")


def run_families() -> dict[str, GaugeMetricFamily]:
    """Every per-run family, by its short name (empty: the exporter fills them at scrape time)."""
    run = list(RUN_LABELS)
    return {
        "claim": GaugeMetricFamily(
            "taugrid_run_claim_state",
            "A claim's state, one series per claim with the value 1: what independent evidence shows for it "
            "(observed) and its verdict (the run's status against that evidence).",
            labels=[*run, "claim", "observed", "verdict"],
        ),
        "since": GaugeMetricFamily(
            "taugrid_run_claim_since_timestamp_seconds",
            "When the claim's observed value last changed, unix seconds; absent when unknown.",
            labels=[*run, "claim"],
        ),
        "progressing_cause": GaugeMetricFamily(
            "taugrid_run_progressing_cause",
            "1 while progressing is false, labelled with why: stalled, hung, replaying (below the pre-restart "
            "high-water mark), skipped-steps, invalid-steps, not-running or finished.",
            labels=[*run, "cause"],
        ),
        "blocked": GaugeMetricFamily(
            "taugrid_run_blocked",
            "1 for a run not yet scheduled, labelled with the stage that owns the wait and its owner.",
            labels=[*run, "stage", "owner"],
        ),
        "blocked_age": GaugeMetricFamily(
            "taugrid_run_blocked_age_seconds",
            "Seconds the run has waited in its blocked stage; absent when the wait's start is unknown.",
            labels=[*run, "stage", "owner"],
        ),
        "evidence_age": GaugeMetricFamily(
            "taugrid_run_evidence_age_seconds",
            "Age of the newest evidence of one plane across the run's claims, seconds.",
            labels=[*run, "plane"],
        ),
        "last_step": GaugeMetricFamily(
            "taugrid_run_progress_last_step",
            "The newest training step seen advancing (logs, Ray counter or checkpoint); absent without one.",
            labels=run,
        ),
        "last_progress": GaugeMetricFamily(
            "taugrid_run_last_progress_timestamp_seconds",
            "When that step was seen, unix seconds; time() minus this is the time since progress.",
            labels=run,
        ),
        "goodput": GaugeMetricFamily(
            "taugrid_run_goodput_ratio",
            "Productive (progressing) over allocated (scheduled) time; absent without a dated progress signal.",
            labels=run,
        ),
        "run_time": GaugeMetricFamily(
            "taugrid_run_time_seconds",
            "Seconds of the run's life by bucket: productive, or the badput cause (queued lies before allocation).",
            labels=[*run, "bucket"],
        ),
        "admission_eta": GaugeMetricFamily(
            "taugrid_run_admission_eta_seconds",
            "An estimate, never a promise, of the seconds until Kueue admits a queued run: the low, mid and high "
            "bound of a band (80% by default) from its ClusterQueue's recent admissions and the workloads ahead; "
            "absent while unknown (a short history) or when the run is not waiting in a queue.",
            labels=[*run, "bound"],
        ),
        "queue_position": GaugeMetricFamily(
            "taugrid_run_queue_position",
            "A queued run's 0-based position in its ClusterQueue (queue=cluster) and LocalQueue (queue=local), "
            "from Kueue's visibility API; absent when it was not read.",
            labels=[*run, "queue"],
        ),
        "straggler": GaugeMetricFamily(
            "taugrid_run_straggler",
            "A suspect holding the run back, valued by how much slower per step it is (0.12: 12 %): a rank or "
            "pod consistently last (basis arrival) or slower (pace), or a GPU apart from its run's others while "
            "the run is slower than its baseline (gpu-spread; the value is the run's slowdown). Only suspects "
            "are series.",
            labels=[*run, "rank", "pod", "node", "uuid", "basis"],
        ),
        "work_at_risk": GaugeMetricFamily(
            "taugrid_run_work_at_risk_gpu_hours",
            "GPU-hours a failure now would throw away: the run's GPUs times the hours since its last complete "
            "checkpoint (or since its pods started, when later); absent while unknown (no fresh checkpoint "
            "listing, or one stamped in the future).",
            labels=run,
        ),
        "drain_exposure": GaugeMetricFamily(
            "taugrid_run_drain_exposure_gpu_hours",
            "The run's GPU-hours at risk on a node with a risk signal (taugrid_node_drain_risk): checkpoint "
            "these runs before draining that node. Only risky nodes are series (at most 8 per run).",
            labels=[*run, "node"],
        ),
        # --- energy per step (issue 28) ---
        "energy_per_step": GaugeMetricFamily(
            "taugrid_run_energy_joules_per_step",
            "Joules the run's GPUs used per training step: NVML total energy counters over the run's GPUs, "
            "each over its own window divided by the steps the run advanced in it; absent while unknown (a GPU "
            "without a counter, shared or MIG, windows that do not overlap, no step advanced).",
            labels=run,
        ),
        "energy_per_token": GaugeMetricFamily(
            "taugrid_run_energy_joules_per_token",
            "Joules the run's GPUs used per token trained: their watts over the tokens/s per GPU the trainer "
            "printed (torchtitan, NeMo Automodel) times the GPUs; absent where energy per step is unknown or "
            "the trainer prints no tokens/s.",
            labels=run,
        ),
        "finished": GaugeMetricFamily(
            "taugrid_run_finished",
            "1 once the run's root reached a terminal state; its series go after the retention time.",
            labels=run,
        ),
        "evaluated": GaugeMetricFamily(
            "taugrid_run_evaluated_timestamp_seconds",
            "When the run's claims were last evaluated, unix seconds.",
            labels=run,
        ),
    }


def template(name: str, labels: Sequence[str]) -> str:
    # Labels sorted by name, as client_python's text format writes them (a test compares both).
    return name + "{" + ",".join(f'{k}="%({k})s"' for k in sorted(labels)) + "}"


TEMPLATES = {fam: template(m.name, m._labelnames) for fam, m in run_families().items()}
AGE_FAMILIES = frozenset({"blocked_age", "evidence_age"})
# The run labels as `template` writes them, for the families rendered without it (`_every_time_text`).
RUN_BODY = 'kind="%(kind)s",namespace="%(namespace)s",run="%(run)s"'
ENERGY = run_families()["energy_per_step"].name
ENERGY_TOKEN = run_families()["energy_per_token"].name
GOODPUT, RUN_TIME, FINISHED, EVALUATED = (run_families()[f].name
                                          for f in ("goodput", "run_time", "finished", "evaluated"))
assert [TEMPLATES[f] for f in ("goodput", "run_time", "finished", "evaluated")] == [
    f"{GOODPUT}{{{RUN_BODY}}}", f'{RUN_TIME}{{bucket="%(bucket)s",{RUN_BODY}}}', f"{FINISHED}{{{RUN_BODY}}}",
    f"{EVALUATED}{{{RUN_BODY}}}"], "a family's labels changed: update exporters.prometheus._every_time_text"
