"""The progressing claim: an application progress signal advanced within the run's own window.

Rate (step counters), durability (checkpoints) and validity (finite loss) come from
`collector.claims.progress`; this module turns them, with hang findings and GPU activity,
into the claim and its reason.
"""

from __future__ import annotations

from datetime import datetime

from collector.claims.asserted import Assertion
from collector.claims.common import claim as _claim
from collector.claims.common import hm as _hm
from collector.claims.common import human_age
from collector.claims.progress import ProgressView
from collector.correlate import RunEvidence, Signal
from collector.model import Claim, Evidence, Observed, Plane
from collector.settings import ClaimSettings

# Hang findings that mean the job is stuck right now (not merely a noisy NCCL warning).
HANG_NOW = frozenset({"nccl-watchdog-timeout", "nccl-watchdog-exception", "nccl-desync-report",
                      "nccl-async-error", "collective-timeout"})

# GPU utilization above this during a stall points at a hung collective (NCCL spins the SMs);
# below the idle bound, the job is simply not computing (data loader, host, or waiting).
GPU_BUSY = 80.0
GPU_IDLE = 10.0


def progressing_claim(ev: RunEvidence, a: Assertion, status_ev: Evidence, running: Claim, fresh_signals: list[Signal],
                 view: ProgressView | None, now: datetime, s: ClaimSettings,
                 durable_view: ProgressView | None = None) -> Claim:
    if running.observed is Observed.FALSE:
        cause = "run finished" if a.finished else "not running"
        return _claim(a.progressing, Observed.FALSE, running.since, f"{cause}: {running.reason}", [], status_ev)
    if view is None:
        if ev.signals:
            read_at = max(sig.read_at for sig in ev.signals)
            return _claim(a.progressing, Observed.UNKNOWN, None,
                          f"data stale: progress sources last read {human_age(now - read_at)} ago", [], status_ev)
        why = "no progress signal: no container logs read" if running.observed is Observed.TRUE else \
            "no progress signal and running is unknown"
        return _claim(a.progressing, Observed.UNKNOWN, None, why, [], status_ev)
    read_at = max(sig.read_at for sig in fresh_signals)
    evidence = _progress_evidence(ev, fresh_signals, view, read_at)
    durability = ""
    if durable_view is not None and durable_view.advances:
        ck = durable_view.advances[-1]
        evidence.append(Evidence(Plane.EXPSTORE, ck.source, "last_checkpoint_step", ck.step, ck.at))
        durability = f"; last checkpoint step {ck.step:,} {human_age(now - ck.at)} ago"
    if not view.advances:
        if view.undated:
            top = max((smp.step for sig in fresh_signals for smp in sig.scan.samples), default=None)
            return _claim(a.progressing, Observed.UNKNOWN, None,
                          f"progress lines carry no timestamps (last step {top}); cannot tell when it advanced",
                          evidence, status_ev)
        return _claim(a.progressing, Observed.UNKNOWN, None,
                      f"no progress signal in {len(fresh_signals)} source(s) read", evidence, status_ev)
    last = view.advances[-1]
    age = now - last.at
    if view.nonfinite_since is not None:
        bad = view.nonfinite_since
        return _claim(a.progressing, Observed.FALSE, bad.at,
                      f"loss is {view.last_loss} since step {bad.step} at {_hm(bad.at)}: steps are not progress",
                      evidence, status_ev)
    rate = ""
    if view.median_step_s is not None:
        rate = f"; median step {view.median_step_s:.3g}s"
    # A collective that timed out after the last step is a hang now, even inside the window.
    hung = any(h.at is not None and last.at < h.at <= now and h.kind in HANG_NOW for sig in fresh_signals
               for h in sig.scan.hangs)
    if age <= view.window and not hung and running.observed is not Observed.TRUE:
        # Progress implies running; with running unknown, claim no more than it.
        return _claim(a.progressing, Observed.UNKNOWN, None,
                      f"step {last.step:,} at {_hm(last.at)}, but running is unknown: {running.reason}",
                      evidence, status_ev)
    if age <= view.window and not hung:
        slow = ""
        if view.median_step_s and view.mad_step_s is not None and len(view.advances) >= 5:
            spread = max(view.mad_step_s, 0.05 * view.median_step_s)
            if age.total_seconds() > view.median_step_s + 5 * spread and age.total_seconds() > 60:
                slow = f"; slower than usual ({human_age(age)} since the last step)"
        return _claim(a.progressing, Observed.TRUE, _streak_start(view),
                      f"step {last.step:,} at {_hm(last.at)} ({human_age(age)} ago){rate}{slow}{durability}",
                      evidence, status_ev)
    reason = (f"STALLED {human_age(age)}: last step {last.step:,} at {_hm(last.at)} (window {human_age(view.window)})"
              f"{durability}")
    hangs = [h for sig in fresh_signals for h in sig.scan.hangs if h.at is None or last.at <= h.at <= now]
    if hangs:
        h = hangs[0]
        what = h.kind.replace("-", " ")
        if h.collective:
            what += f": {h.collective}"
        if h.timeout_ms:
            what += f" timed out after {h.timeout_ms} ms"
        ranks = sorted({x.rank for x in hangs if x.rank is not None})
        if ranks:
            what += f" (rank {', '.join(map(str, ranks[:8]))})"
        reason += f"; {what}"
    gpu = _gpu_activity(ev, now, s)
    if gpu is not None:
        util, power, n, at = gpu
        watts = f" at {power:.0f} W" if power is not None else ""
        evidence.append(Evidence(Plane.GPU, str(ev.root.ref), "gpu_utilization",
                                 f"{util:.0f}% over {n} GPUs{watts}", at))
        if util >= GPU_BUSY:
            reason += f"; GPUs {util:.0f}% busy{watts} → suspected collective hang"
        elif util <= GPU_IDLE:
            reason += f"; GPUs idle ({util:.0f}%{watts})"
    return _claim(a.progressing, Observed.FALSE, last.at, reason, evidence, status_ev)


def _gpu_activity(ev: RunEvidence, now: datetime,
                  s: ClaimSettings) -> tuple[float, float | None, int, datetime] | None:
    """Mean GPU utilization and power across the run's Ray clusters, from fresh readings only."""
    fresh = [rt for rt in ev.ray.values() if rt.gpu_utilization is not None and not rt.error
             and now - rt.read_at <= s.evidence_max_age]
    if not fresh:
        return None
    n = sum(rt.gpus for rt in fresh) or len(fresh)
    util = sum((rt.gpu_utilization or 0.0) * max(rt.gpus, 1) for rt in fresh) / n
    powers = [(rt.gpu_power_w, max(rt.gpus, 1)) for rt in fresh if rt.gpu_power_w is not None]
    power = sum(p * k for p, k in powers) / sum(k for _, k in powers) if powers else None
    return util, power, n, max(rt.read_at for rt in fresh)


def _streak_start(view: ProgressView) -> datetime:
    """Start of the current run of advances with no gap longer than the stall window."""
    start = view.advances[-1].at
    for prev, cur in zip(reversed(view.advances[:-1]), reversed(view.advances), strict=False):
        if cur.at - prev.at > view.window:
            break
        start = prev.at
    return start


def _progress_evidence(ev: RunEvidence, signals: list[Signal], view: ProgressView,
                       read_at: datetime) -> list[Evidence]:
    out = []
    if view.advances:
        last = view.advances[-1]
        out.append(Evidence(Plane.LOGS, last.source, "last_step", last.step, last.at))
    if view.last_loss is not None:
        out.append(Evidence(Plane.LOGS, view.advances[-1].source if view.advances else "", "last_loss",
                            view.last_loss if view.last_loss == view.last_loss and abs(view.last_loss) != float("inf")
                            else str(view.last_loss), view.advances[-1].at if view.advances else None))
    if view.replayed:
        out.append(Evidence(Plane.LOGS, str(ev.root.ref), "replayed_steps", view.replayed, read_at))
    if view.skipped:
        out.append(Evidence(Plane.LOGS, str(ev.root.ref), "skipped_steps", view.skipped, read_at))
    for sig in signals:
        for h in sig.scan.hangs[:2]:
            out.append(Evidence(sig.plane, f"{sig.ref.name}/{sig.source}", h.kind,
                                f"{h.collective or ''} timeout_ms={h.timeout_ms} rank={h.rank}".strip(), h.at))
    return out
