"""Container logs read through the API server (collector/sources/logs.py), for the containers no
node agent reads: one pass every `log_poll_interval` from the start of the one before (a pass that
outlasts it is followed at once; its length is in /metrics)."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from collector.correlate import Key, RunEvidence, Signal
from collector.logrotation import slot_of
from collector.model import PodFacts, RunClaims
from collector.planes.base import Change, PolledSource, SourceContext, SourceState, Targets, profile_of
from collector.sources.logs import (
    ApiLogPoller,
    ApiLogSettings,
    BadRegex,
    LogFresh,
    LogTarget,
    PassReport,
    quiet_until,
)
from exporters.prometheus_health import ErrorClass
from exporters.prometheus_logs import LogPassMetrics

__all__ = ["ApiLogSource"]


log = logging.getLogger("taugrid.controller")

AGENTS_FIRST_WAIT_S = 15.0  # the longest the first API log pass waits for the node agents' first pass
LOG_CEILING_LOG_S = 600.0  # a log pass ceiling that keeps biting is logged this often


class ApiLogSource(PolledSource):
    """The `logs` source: thread `log-poller`."""

    name = "logs"
    thread = "log-poller"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.settings.controller
        self.interval = self.cfg.log_poll_interval.total_seconds()
        self.targets: Targets[LogTarget] = Targets()
        self.state = SourceState(self.name, ctx.health, pass_gauge=True)
        # Runs whose claims need no API log read before a deadline (`quiet_until`), with their targets:
        # written by the loop's evaluations, read by the poller thread (whole values swapped, never changed).
        self.quiet: dict[Key, tuple[datetime, tuple[LogTarget, ...]]] = {}
        # Per run, its running containers a node agent reads (`loop.agent_log_pods`, no profile regex
        # asking for the API read): not targets, only counted (skipped{reason="agent"}). At 50k pods
        # with agents on every node their targets, keys and rotation state were ≈ 27 MiB (issue 30).
        self._left: dict[Key, int] = {}
        self.left_to_agents = 0
        self.metrics = LogPassMetrics(ctx.registry, max_gets=self.cfg.log_pass_max_gets,
                                      max_bytes=self.cfg.log_pass_max_bytes)

    @classmethod
    def build(cls, ctx: SourceContext) -> ApiLogSource | None:
        return cls(ctx) if ctx.settings.controller.log_poll_interval.total_seconds() > 0 else None

    # --- PerRun ----------------------------------------------------------------------------------

    def track(self, key: Key, ev: RunEvidence, rc: RunClaims) -> None:
        if rc.finished:
            self.forget(key)
            return
        regex = self.cfg.log_regex_by_profile.get(profile_of(ev), "")
        slot = slot_of("\x1f".join(key))
        agents = frozenset() if regex else self.ctx.loop.agent_log_pods
        found: list[LogTarget] = []
        left = 0
        for pod in ev.pods:
            f = pod.facts
            if not isinstance(f, PodFacts) or f.phase != "Running":
                continue
            running = [c for c in f.containers if not c.init and c.state == "running"]
            if agents and (pod.ref.namespace, pod.ref.name) in agents:
                left += len(running)  # (a pod no agent reads any more marks its run: `ChangeApplier`)
            else:
                found += [(pod.ref, c.name, regex, c.restart_count, slot) for c in running]
        targets = tuple(found)
        self.targets.set(key, targets)
        self._set_left(key, left)
        # A true run's reads wait until its window nears (`quiet_until`): a read that comes late makes
        # the claim unknown at the window's close, never STALLED (a stall needs a read after it).
        until = quiet_until(rc) if targets and self.cfg.log_skip_settled else None
        if until is None:
            self.quiet.pop(key, None)
        else:
            self.quiet[key] = (until, targets)

    def forget(self, key: Key) -> None:
        self.targets.set(key, ())
        self.quiet.pop(key, None)
        self._set_left(key, 0)

    def _set_left(self, key: Key, n: int) -> None:
        self.left_to_agents += n - self._left.pop(key, 0)
        if n:
            self._left[key] = n

    def publish(self) -> None:
        self.targets.publish()

    # --- the poller thread -----------------------------------------------------------------------

    def run(self) -> None:
        ctx, loop, stop, interval = self.ctx, self.ctx.loop, self.ctx.stop, self.interval
        # Quiet containers are read every few passes, and always well inside the evidence's max age.
        fresh_passes = int(ctx.settings.claims.evidence_max_age.total_seconds() / 2 // interval)
        poller = ApiLogPoller(ctx.api, ApiLogSettings(
            tail_lines=self.cfg.log_tail_lines, limit_bytes=self.cfg.log_limit_bytes,
            quiet_every=max(1, min(self.cfg.log_quiet_every, fresh_passes)),
            concurrency=self.cfg.log_poll_concurrency, interval_s=interval,
            max_gets=self.cfg.log_pass_max_gets, max_bytes=self.cfg.log_pass_max_bytes), ctx.now)
        bitten = 0.0  # when the ceiling was last logged (monotonic; 0: it is not biting)
        poller.open()
        wait = interval
        # Agents that do not answer hold the API reads a bounded while: one interval, and never less than
        # AGENTS_FIRST_WAIT_S (a loaded node takes seconds for the first agents' pass; reading every pod
        # through the API server meanwhile is the cost the wait avoids).
        agents_by = time.monotonic() + max(interval, AGENTS_FIRST_WAIT_S)
        try:
            while not stop.wait(wait if self.targets.current or self.left_to_agents else min(interval, 1.0)):
                if not loop.agents_first.is_set() and time.monotonic() < agents_by:
                    wait = min(interval, 0.1)
                    continue
                started = time.monotonic()
                quiet = {(ref.namespace, ref.name): until for until, targets in list(self.quiet.values())
                         for ref, *_ in targets}
                for out in poller.run_pass(list(self.targets.current), agent_pods=loop.agent_log_pods,
                                           held=loop.holds_signal, stop=stop, quiet=quiet,
                                           left_to_agents=self.left_to_agents):
                    if isinstance(out, Signal):
                        loop.put_log(Change("log", None, out), out.scan)
                    elif isinstance(out, LogFresh):
                        loop.put(Change("log-fresh", None, (out.ref, out.container, out.at)))
                    elif isinstance(out, BadRegex):
                        loop.skip(out.message)
                    else:  # a read that failed: counted here (the loop has nothing to apply)
                        self.state.error(ErrorClass.RETRYABLE if out.retryable else ErrorClass.PERMANENT, str(out))
                took = time.monotonic() - started
                self.state.passed(took)
                bitten = self.pass_done(poller.last_pass, bitten)
                wait = max(0.0, interval - took)
        finally:
            poller.close()

    def pass_done(self, p: PassReport, bitten: float) -> float:
        """A pass's cost into /metrics; a ceiling that bites is logged when it starts and every
        LOG_CEILING_LOG_S while it goes on, and when passes fit again. Returns when it was last logged."""
        self.metrics.update(gets=p.gets, read_bytes=p.bytes, due=p.due, deferred=p.deferred, skipped=p.skipped)
        now_m = time.monotonic()
        if p.deferred and (not bitten or now_m - bitten >= LOG_CEILING_LOG_S):
            log.warning("API log pass ceiling reached: containers left for the next pass", extra={
                "ceiling": p.ceiling, "gets": p.gets, "bytes": p.bytes, "due": p.due, "deferred": p.deferred,
                "tenants_deferred": p.tenants_deferred, "urgent_deferred": p.urgent_deferred,
                "max_gets": self.cfg.log_pass_max_gets, "max_bytes": self.cfg.log_pass_max_bytes})
            return now_m
        if not p.deferred and bitten:
            log.info("API log passes fit their ceiling again", extra={"gets": p.gets, "bytes": p.bytes})
            return 0.0
        return bitten
