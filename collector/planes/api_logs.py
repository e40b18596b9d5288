"""Container logs read through the API server (collector/sources/logs.py), for the containers no
node agent reads: one pass every `log_poll_interval` from the start of the one before (a pass that
outlasts it is followed at once; its length is in /metrics)."""

from __future__ import annotations

import time

from collector.correlate import Key, RunEvidence, Signal
from collector.model import PodFacts, RunClaims
from collector.planes.base import Change, SourceContext, SourceHealth, SourceState, Targets, profile_of
from collector.sources.logs import ApiLogPoller, ApiLogSettings, BadRegex, LogFresh, LogTarget
from exporters.prometheus import ErrorClass

__all__ = ["ApiLogSource"]


AGENTS_FIRST_WAIT_S = 15.0  # the longest the first API log pass waits for the node agents' first pass

class ApiLogSource:
    """The `logs` source: thread `log-poller`."""

    name = "logs"
    thread = "log-poller"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.settings.controller
        self.interval = self.cfg.log_poll_interval.total_seconds()
        self.targets: Targets[LogTarget] = Targets()
        self.state = SourceState(self.name, ctx.health, pass_gauge=True)

    @classmethod
    def build(cls, ctx: SourceContext) -> ApiLogSource | None:
        return cls(ctx) if ctx.settings.controller.log_poll_interval.total_seconds() > 0 else None

    def open(self) -> None:
        self.ctx.loop.spawn(self.run, self.thread, self.state)

    def close(self) -> None:
        pass  # the poller closes its readers as its thread ends

    def health(self) -> SourceHealth:
        return self.state.health()

    # --- PerRun ----------------------------------------------------------------------------------

    def track(self, key: Key, ev: RunEvidence, rc: RunClaims) -> None:
        if rc.finished:
            self.targets.set(key, ())
            return
        regex = self.cfg.log_regex_by_profile.get(profile_of(ev), "")
        self.targets.set(key, tuple(
            (pod.ref, c.name, regex, c.restart_count) for pod in ev.pods
            if isinstance(pod.facts, PodFacts) and pod.facts.phase == "Running"
            for c in pod.facts.containers if not c.init and c.state == "running"
        ))

    def forget(self, key: Key) -> None:
        self.targets.set(key, ())

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
            concurrency=self.cfg.log_poll_concurrency), ctx.now)
        poller.open()
        wait = interval
        # Agents that do not answer hold the API reads a bounded while: one interval, and never less than
        # AGENTS_FIRST_WAIT_S (a loaded node takes seconds for the first agents' pass; reading every pod
        # through the API server meanwhile is the cost the wait avoids).
        agents_by = time.monotonic() + max(interval, AGENTS_FIRST_WAIT_S)
        try:
            while not stop.wait(wait if self.targets.current else min(interval, 1.0)):
                if not loop.agents_first.is_set() and time.monotonic() < agents_by:
                    wait = min(interval, 0.1)
                    continue
                started = time.monotonic()
                for out in poller.run_pass(list(self.targets.current), agent_pods=loop.agent_log_pods,
                                           held=loop.holds_signal, stop=stop):
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
                wait = max(0.0, interval - took)
        finally:
            poller.close()
