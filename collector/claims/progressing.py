"""The progressing claim: an application progress signal advanced within the run's own window.

Rate (step counters), durability (checkpoints) and validity (finite loss) come from
`collector.claims.progress`; this module turns them, with hang findings and GPU activity,
into the claim and its reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from collector.claims.asserted import Assertion
from collector.claims.common import Clock, human_age
from collector.claims.common import claim as _claim
from collector.claims.common import hm as _hm
from collector.claims.lineage import Lineage
from collector.claims.progress import (
    SKIP_RECENT_MIN,
    SKIPPED_STREAK,
    Advance,
    ProgressView,
    restarts_inside,
    source_name,
    window_of,
)
from collector.correlate import Key, RunEvidence, Signal
from collector.model import Claim, Evidence, Observed, Plane, PodFacts
from collector.progress import HangFinding, XidFinding
from collector.settings import ClaimSettings

# Hang findings that mean the job is stuck right now (not merely a noisy NCCL warning).
HANG_NOW = frozenset({"nccl-watchdog-timeout", "nccl-watchdog-exception", "nccl-desync-report",
                      "nccl-async-error", "collective-timeout", "nccl-timeout-dump"})

# GPU utilization above this during a stall points at a hung collective (NCCL spins the SMs);
# below the idle bound, the job is simply not computing (data loader, host, or waiting).
GPU_BUSY = 80.0
GPU_IDLE = 10.0


def progressing_claim(ev: RunEvidence, a: Assertion, status_ev: Evidence, running: Claim, fresh_signals: list[Signal],
                 view: ProgressView | None, clock: Clock, s: ClaimSettings,
                 durable_view: ProgressView | None = None,
                 lineage: Mapping[tuple[Key, str], Lineage] | None = None,
                 off_clock: tuple[str, ...] = ()) -> Claim:
    now = clock.now
    if running.observed is Observed.FALSE:
        cause = "run finished" if a.finished else "not running"
        return _claim(a.progressing, Observed.FALSE, running.since, f"{cause}: {running.reason}", [], status_ev,
                      "finished" if a.finished else "not-running")
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
    if off_clock and (view.last is None or not clock.within_latest(view.last.at, view.window, step=True)):
        # the only signals that could show progress are on a clock nobody can place
        return _claim(a.progressing, Observed.UNKNOWN, None, off_clock[0], evidence, status_ev)
    durability = ""
    if durable_view is not None and durable_view.advances:
        ck = durable_view.advances[-1]
        evidence.append(Evidence(Plane.EXPSTORE, ck.source, "last_checkpoint_step", ck.step, ck.at))
        durability = f"; last checkpoint step {_step(ck.step)} {human_age(now - ck.at)} ago"
    window = f"window {human_age(view.window)}: {view.window_basis}" if view.window_basis else \
        f"window {human_age(view.window)}"
    last = view.last
    after = _findings_after(fresh_signals, last, clock, lineage)
    hangs = [(sig, h) for sig, h in after if h.kind in HANG_NOW]
    suspects = _suspects(after, ev) if hangs else []
    for text, ref, at in suspects:
        evidence.append(Evidence(Plane.LOGS, ref, "hang_suspect", text, at))
    if last is None:
        if hangs:
            # A hang is positive evidence: no step in the tail (none yet, or pushed out by the NCCL
            # dump) does not make it unknown.
            since = min((h.at for _, h in hangs if h.at is not None), default=None)
            return _claim(a.progressing, Observed.FALSE, since,
                          f"HUNG: {_hang_text(hangs)}; no progress line after it{_suspect_text(suspects)}",
                          evidence, status_ev, "hung")
        restarted = _after_restart(view, clock, s, a, status_ev, evidence, None)
        if restarted is not None:
            return restarted
        if view.skipped_streak >= SKIPPED_STREAK and view.skipped_since is not None:
            return _claim(a.progressing, Observed.FALSE, view.skipped_since.at,
                          f"only skipped steps since {_hm(view.skipped_since.at)} ({view.skipped_streak} reports, "
                          "fp16 overflow): skipped steps are not progress", evidence, status_ev, "skipped-steps")
        if view.undated:
            top = max((smp.step for sig in fresh_signals for smp in sig.scan.samples if smp.step is not None),
                      default=None)
            return _claim(a.progressing, Observed.UNKNOWN, None,
                          f"progress lines carry no timestamps (last step {_step(top)}); cannot tell when it "
                          "advanced", evidence, status_ev)
        if view.blind is not None:
            b = view.blind.last
            return _claim(a.progressing, Observed.UNKNOWN, None,
                          f"no step proves progress: {b.source} last printed "
                          f"{'step ' + _step(b.step) if b.step is not None else 'activity'} at {_hm(b.at)}"
                          f" ({human_age(now - b.at)} ago), but {view.blind.restart.why} at"
                          f" {_hm(view.blind.restart.at)} and its steps before then are not in view: they may be"
                          " replays of steps it had made", evidence, status_ev)
        return _claim(a.progressing, Observed.UNKNOWN, None,
                      f"no progress signal in {len(fresh_signals)} source(s) read", evidence, status_ev)
    age = now - last.at
    if view.invalid is not None:
        bad = view.invalid.since
        return _claim(a.progressing, Observed.FALSE, bad.at,
                      f"{view.invalid.why} since step {_step(bad.step)} at {_hm(bad.at)}: steps are not progress",
                      evidence, status_ev, "invalid-steps")
    skipped = ""
    if view.skipped_since is not None:
        sk = view.skipped_since
        skipped = f"; {view.skipped_streak} skipped step report(s) since {_hm(sk.at)} (fp16 overflow)"
        if view.skipped_streak >= SKIPPED_STREAK:
            return _claim(a.progressing, Observed.FALSE, sk.at,
                          f"steps skipped since {_hm(sk.at)} ({view.skipped_streak} reports, fp16 overflow: the "
                          f"trainer drops the update); last real step {_step(last.step)} at {_hm(last.at)}: "
                          "skipped steps are not progress", evidence, status_ev, "skipped-steps")
    n_skipped, of = view.recent_skipped
    if of >= SKIP_RECENT_MIN and 2 * n_skipped > of:
        # fp16 overflow on most steps: the few real updates between skips are not training at pace
        return _claim(a.progressing, Observed.FALSE, view.recent_skipped_since,
                      f"{n_skipped} of the last {of} step reports skipped (fp16 overflow: the trainer drops the "
                      f"update); last real step {_step(last.step)} at {_hm(last.at)}: mostly skipped steps are not "
                      "progress", evidence, status_ev, "skipped-steps")
    rate = ""
    if view.median_step_s is not None:
        rate = f"; median step {view.median_step_s:.3g}s"
    what = f"step {_step(last.step)}" if last.step is not None else "activity (loss dict, no step number)"
    # A collective that timed out after the last step is a hang now, even inside the window: the
    # STALLED reason below names it.
    # The stall window closes at last.at + window. A dump's capture instant is known only to lie in
    # [now, now + slack]: inside the window at its start is not stalled; true needs it at its end too.
    in_window = clock.recent(last.at, view.window, step=True)
    if in_window and not hangs and not clock.within_latest(last.at, view.window, step=True):
        return _claim(a.progressing, Observed.UNKNOWN, None,
                      f"{what} at {_hm(last.at)}, inside its {window}; {_uncertain(clock)}: the window may"
                      " have closed by then", evidence, status_ev)
    if in_window and not hangs and running.observed is not Observed.TRUE:
        # Progress implies running; with running unknown, claim no more than it.
        return _claim(a.progressing, Observed.UNKNOWN, None,
                      f"{what} at {_hm(last.at)}, but running is unknown: {running.reason}",
                      evidence, status_ev)
    if in_window and not hangs and view.restarted is not None:
        # the last step was the process before a restart: replaying since, unknown since, or nothing yet
        replay = _after_restart(view, clock, s, a, status_ev, evidence, last)
        if replay is not None:
            return replay
        r = view.restarted
        return _claim(a.progressing, Observed.UNKNOWN, None,
                      f"{what} at {_hm(last.at)} in {last.source}, but {r.why} at {_hm(r.at)}, after it, and no step"
                      " since: whether it resumes is not known yet", evidence, status_ev)
    if in_window and not hangs:
        slow = ""
        if view.median_step_s and view.mad_step_s is not None and len(view.advances) >= 5:
            spread = max(view.mad_step_s, 0.05 * view.median_step_s)
            if age.total_seconds() > view.median_step_s + 5 * spread and age.total_seconds() > 60:
                slow = f"; slower than usual ({human_age(age)} since the last step)"
        return _claim(a.progressing, Observed.TRUE, _streak_start(view),
                      f"{what} at {_hm(last.at)} ({human_age(age)} ago){rate}{slow}; {window}{durability}",
                      evidence, status_ev)
    if not hangs:
        restarted = _after_restart(view, clock, s, a, status_ev, evidence, last)
        if restarted is not None:
            return restarted
        closed = last.at + view.window
        unread = _read_before(fresh_signals, closed)
        if unread is not None:
            # No step after `last` in what was read proves nothing for the time after the read: a
            # stall is only seen by a read after its window closed (a late or skipped read is not one).
            return _claim(a.progressing, Observed.UNKNOWN, None,
                          f"{what} at {_hm(last.at)}; its stall window closed at {_hm(closed)} "
                          f"({window}), but {unread.ref.name}/{unread.source} was last read at "
                          f"{_hm(unread.read_at)}, before then: not read since (a stall is judged on a read after "
                          "the window)", evidence, status_ev)
        unseen = next((sig for sig in fresh_signals if sig.unseen and not sig.retired and sig.scan.samples), None)
        if unseen is not None:
            return _claim(a.progressing, Observed.UNKNOWN, None,
                          f"{what} at {_hm(last.at)}; {unseen.unseen}: what {unseen.ref.name}/{unseen.source} did"
                          " since is not in view (add kubectl logs --timestamps of it)", evidence, status_ev)
        undated = _undated_after(fresh_signals)
        if undated is not None:
            sig, n = undated
            return _claim(a.progressing, Observed.UNKNOWN, None,
                          f"{what} at {_hm(last.at)} is the last stamped progress, but {sig.ref.name}/{sig.source}"
                          f" holds {n} progress line(s) after its last stamped one that carry no timestamps (a log"
                          " without kubectl logs --timestamps, as a restarted container's current one): they may"
                          " be newer; whether it stalled cannot be told", evidence, status_ev)
        behind = _behind(ev, view, clock)
        if behind is not None:
            return _claim(a.progressing, Observed.UNKNOWN, None, f"{what} at {_hm(last.at)}; {behind}",
                          evidence, status_ev)
    reason = f"STALLED {human_age(age)}: last {what} at {_hm(last.at)} ({window}){skipped}{durability}"
    if after:
        reason += f"; {_hang_text(after)}"
        if not suspects:  # not yet named above (only findings that are not hangs by themselves)
            suspects = _suspects(after, ev)
            for text, ref, at in suspects:
                evidence.append(Evidence(Plane.LOGS, ref, "hang_suspect", text, at))
        reason += _suspect_text(suspects)
    for sig, x in _xids_after(fresh_signals, last)[:2]:
        # A GPU error the run's own logs printed after its last step (the NVRM line reaches a
        # container's log when the driver's messages are forwarded): a cause worth naming.
        evidence.append(Evidence(Plane.LOGS, f"{sig.ref.name}/{sig.source}", "xid",
                                 f"Xid {x.code} on {x.pci or 'unknown PCI'}: {x.meaning}", x.at))
        reason += f"; GPU Xid {x.code} in {sig.ref.name} ({x.meaning})"
    gpu = _gpu_activity(ev, clock, s)
    if gpu is not None:
        util, power, n, at = gpu
        watts = f" at {power:.0f} W" if power is not None else ""
        evidence.append(Evidence(Plane.GPU, str(ev.root.ref), "gpu_utilization",
                                 f"{util:.0f}% over {n} GPUs{watts}", at))
        if util >= GPU_BUSY:
            reason += f"; GPUs {util:.0f}% busy{watts} → suspected collective hang"
        elif util <= GPU_IDLE:
            reason += f"; GPUs idle ({util:.0f}%{watts})"
    return _claim(a.progressing, Observed.FALSE, last.at, reason, evidence, status_ev, "stalled")


def _after_restart(view: ProgressView, clock: Clock, s: ClaimSettings, a: Assertion, status_ev: Evidence,
                   evidence: list[Evidence], last: Advance | None) -> Claim | None:
    """The claim when the newest steps inside their window came after a restart and have not passed the
    pre-restart mark: unknown where that mark is out of view (blind), replaying where it is below it.
    None: no such steps (the run is stalled, or progressing on another stream)."""
    blind, replay = view.blind, view.replaying
    if blind is not None and (last is None or blind.last.at > last.at) \
            and clock.recent(blind.last.at, window_of(view, blind.last.stream, s)):
        b = blind.last
        evidence.append(Evidence(Plane.LOGS, b.source, "unverified_step", b.step, b.at))
        return _claim(a.progressing, Observed.UNKNOWN, None,
                      f"{'step ' + _step(b.step) if b.step is not None else 'activity'} at {_hm(b.at)} in {b.source},"
                      f" but {blind.restart.why} at {_hm(blind.restart.at)} and its steps before then are not in view:"
                      " they may be replays of steps it had made; unknown until a step passes a known mark (its"
                      " previous log: kubectl logs --previous, or the replaced pod's)", evidence, status_ev)
    if replay is not None and (last is None or replay.last.at > last.at) \
            and clock.recent(replay.last.at, window_of(view, replay.last.stream, s)):
        r = replay.last
        why = (f"before {replay.restart.why} at {_hm(replay.restart.at)}" if replay.restart is not None
               else "before its step went back inside the same log (an in-process restart)")
        evidence.append(Evidence(Plane.LOGS, r.source, "replaying_below", replay.mark, r.at))
        return _claim(a.progressing, Observed.FALSE, replay.since,
                      f"REPLAYING since {_hm(replay.since)}: step {_step(r.step)} at {_hm(r.at)} in {r.source} is "
                      f"below the high-water mark {_step(replay.mark)} it reached {why}; replayed steps are not "
                      "progress", evidence, status_ev, "replaying")
    return None


def _undated_after(signals: list[Signal]) -> tuple[Signal, int] | None:
    """A signal with progress lines after its last stamped one that carry no stamp (its current log
    unstamped after a stamped previous one): progress at a time nobody can place, so no stall; with
    how many. None: every signal's last progress line is stamped."""
    for sig in signals:
        if sig.retired or sig.durable:
            continue
        dated = max((x.line for x in sig.scan.samples if x.at is not None), default=None)
        if dated is None:
            continue  # (wholly unstamped: no stamped last step of its own to call stalled)
        n = sum(1 for x in sig.scan.samples if x.at is None and not x.skipped and x.line > dated)
        if n:
            return sig, n
    return None


def _behind(ev: RunEvidence, view: ProgressView, clock: Clock) -> str | None:
    """Why a stall cannot be told where a stream's last step came from a node whose clock may run
    behind (`RunEvidence.node_behind`): that step may be as much younger than it looks, and a stall
    holds only if it holds under every offset the evidence allows. None: every stream's window has
    closed at the latest instant its step can have been made."""
    if not ev.node_behind:
        return None
    nodes = {p.ref.key: p.facts.node_name for p in ev.pods if isinstance(p.facts, PodFacts)}
    node_of = {source_name(sig): nodes.get(sig.ref.key, "") for sig in ev.signals}
    for v in view.streams:
        node = node_of.get(v.last.source, "")
        if node not in ev.node_behind:
            continue
        by = ev.node_behind[node]
        if by is None or clock.recent(v.last.at + by, v.window):
            bound = ("no stamp of its own bounds how far it runs behind" if by is None else
                     f"its newest own stamp (node Lease, heartbeat, container start or exit) is {human_age(by)} "
                     "older than the capture: it may run that far behind")
            return (f"{v.last.source} runs on node {node}, whose clock no kubelet Event measures; {bound}, so "
                    f"that step may be younger than it looks and its {human_age(v.window)} window may not have "
                    "closed")
    return None


def _read_before(signals: list[Signal], closed: datetime) -> Signal | None:
    """A progress source last read before `closed` (its read cannot have shown a later step), the
    earliest such; None when every source that prints progress was read at or after it. Sources with
    no progress line (sidecars), checkpoint listings (no pace of their own) and a deleted pod's last
    read (it prints nothing more) do not hold a stall back."""
    late = [sig for sig in signals
            if not sig.retired and not sig.durable and sig.scan.samples and sig.read_at < closed]
    return min(late, key=lambda sig: sig.read_at, default=None)


def _uncertain(clock: Clock) -> str:
    """Why the capture instant is not known precisely enough (a dump's clock)."""
    if clock.slack is None:
        return ("but no control-plane stamp bounds the dump's capture time (node heartbeats, node Leases; pass"
                " --at or add the node Leases)")
    return (f"but the dump was captured between {_hm(clock.now)} and {_hm(clock.now + clock.slack)} (known only"
            f" to within {human_age(clock.slack)})")


def _xids_after(signals: list[Signal], last: Advance) -> list[tuple[Signal, XidFinding]]:
    """XID findings in the run's logs dated after its last step (undated ones cannot be placed)."""
    return [(sig, x) for sig in signals if not sig.retired
            for x in sig.scan.xids if x.at is not None and x.at >= last.at]


def _step(step: int | None) -> str:
    return f"{step:,}" if step is not None else "unknown"


def _findings_after(signals: list[Signal], last: Advance | None, clock: Clock,
                    lineage: Mapping[tuple[Key, str], Lineage] | None = None) -> list[tuple[Signal, HangFinding]]:
    """Hang findings after the last progress (of their own log, for undated ones: by line number,
    as dumps carry no timestamps). A hang before its process started over (a restart, a replacement:
    often what caused it) is over: it does not make the new process hung."""
    out = []
    for sig in signals:
        if sig.retired:
            continue  # a deleted pod's: its process is gone
        if not sig.scan.hangs:
            continue  # (most logs: their samples not walked for a line no hang is compared with)
        lin = (lineage or {}).get((sig.ref.key, sig.source))
        over = max((r.at for r in (*(lin.restarts if lin else ()), *restarts_inside(sig))), default=None)
        last_line = max((smp.line for smp in sig.scan.samples if not smp.skipped), default=0)
        for h in sig.scan.hangs:
            if h.at is not None and over is not None and h.at <= over:
                continue
            if h.at is not None:
                # same stamp: the line order decides (a bar, then the watchdog error, on one line)
                if clock.reached(h.at) and (last is None or h.at > last.at
                                            or (h.at == last.at and h.line >= last_line)):
                    out.append((sig, h))
            elif h.line > last_line and (last_line > 0 or last is None):
                # Undated, in a log with no progress lines of its own (a Ray job log beside a metrics
                # counter): it cannot be placed against the other signals' steps, so it only counts
                # when there is no step at all.
                out.append((sig, h))
    return out


def _hang_text(hangs: list[tuple[Signal, HangFinding]]) -> str:
    h = hangs[0][1]
    what = h.kind.replace("-", " ")
    if h.collective:
        what += f": {h.collective}"
    if h.timeout_ms:
        what += f" timed out after {h.timeout_ms} ms"
    ranks = sorted({x.rank for _, x in hangs if x.rank is not None})
    if ranks:
        what += f" (rank {', '.join(map(str, ranks[:8]))}{', ...' if len(ranks) > 8 else ''})"
    return what


def _suspects(findings: list[tuple[Signal, HangFinding]],
              ev: RunEvidence | None = None) -> list[tuple[str, str, datetime | None]]:
    """The ranks furthest behind in a hang: the lowest NCCL SeqNum among the ranks that reported one
    (the others wait for them), and ranks a desync report names as never joining. (text, ref, at).

    Sequence numbers count per process group: they are compared only within one group (a line that
    names no group is compared with the others that name none). The suspect's pod and node are named."""
    nodes = {p.ref.name: p.facts.node_name for p in (ev.pods if ev is not None else ())
             if isinstance(p.facts, PodFacts) and p.facts.node_name}
    seqs: dict[str | None, dict[int, tuple[int, str, datetime | None]]] = {}  # pg -> rank -> (lowest seq, ...)
    lagging: dict[int, tuple[str, datetime | None]] = {}
    for sig, h in findings:
        ref = f"{sig.ref.name}/{sig.source}" if sig.source else sig.ref.name
        if h.rank is not None:
            if h.kind == "nccl-desync-lagging-rank":
                lagging.setdefault(h.rank, (ref, h.at))
            elif h.seq is not None:
                group = seqs.setdefault(h.pg, {})
                if h.rank not in group or h.seq < group[h.rank][0]:
                    group[h.rank] = (h.seq, ref, h.at)

    def where(ref: str) -> str:
        pod = ref.split("/")[0]
        node = nodes.get(pod)
        return f"pod {pod}" + (f" on node {node}" if node else "")

    out: list[tuple[str, str, datetime | None]] = []
    for pg, group in sorted(seqs.items(), key=lambda kv: kv[0] or ""):
        if len({v[0] for v in group.values()}) < 2:
            continue
        low = min(v[0] for v in group.values())
        high = max(v[0] for v in group.values())
        in_pg = f" of process group {pg}" if pg not in (None, "0") else ""
        for rank in sorted(r for r, v in group.items() if v[0] == low)[:8]:
            _, ref, at = group[rank]
            out.append((f"rank {rank} ({where(ref)}) at SeqNum {low}{in_pg}, others up to {high}", ref, at))
    for rank in sorted(lagging)[:8]:
        ref, at = lagging[rank]
        out.append((f"rank {rank} never joined the collective (desync report in {where(ref)})", ref, at))
    return out[:8]


def _suspect_text(suspects: list[tuple[str, str, datetime | None]]) -> str:
    return f"; suspect {'; '.join(t for t, _, _ in suspects)}" if suspects else ""


def _gpu_activity(ev: RunEvidence, clock: Clock,
                  s: ClaimSettings) -> tuple[float, float | None, int, datetime] | None:
    """Mean GPU utilization and power across the run's Ray clusters, from fresh readings only."""
    fresh = [rt for rt in ev.ray.values() if rt.gpu_utilization is not None and not rt.error
             and clock.within(rt.read_at, s.evidence_max_age)]
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
        if cur.at - prev.at > view.window and not cur.bridged:
            break
        start = prev.at
    return start


def _progress_evidence(ev: RunEvidence, signals: list[Signal], view: ProgressView,
                       read_at: datetime) -> list[Evidence]:
    out = []
    if view.last is not None:
        last = view.last
        # null when the last progress is activity without a step number (HF loss dicts)
        out.append(Evidence(Plane.LOGS, last.source, "last_step", last.step, last.at))
    if view.last_loss is not None:
        out.append(Evidence(Plane.LOGS, view.last.source if view.last else "", "last_loss",
                            view.last_loss if view.last_loss == view.last_loss and abs(view.last_loss) != float("inf")
                            else str(view.last_loss), view.last.at if view.last else None))
    if view.replayed:
        out.append(Evidence(Plane.LOGS, str(ev.root.ref), "replayed_steps", view.replayed, read_at))
    if view.skipped:
        out.append(Evidence(Plane.LOGS, str(ev.root.ref), "skipped_steps", view.skipped, read_at))
    for sig in signals:
        for h in sig.scan.hangs[:2]:
            seq = f" seq={h.seq}" if h.seq is not None else ""
            out.append(Evidence(sig.plane, f"{sig.ref.name}/{sig.source}", h.kind,
                                f"{h.collective or ''} timeout_ms={h.timeout_ms} rank={h.rank}{seq}".strip(), h.at))
    return out
