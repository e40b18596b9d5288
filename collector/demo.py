"""`taugrid-evidence demo`: the simulator's default scenario, the live controller, a live table.

Everything runs in this process on loopback: the API simulator plays the scenario (accelerated),
the controller watches it through the official client, serves /metrics, and the table shows
each run's three claims as they change.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from collector.claims.common import human_age
from collector.controller import Controller
from collector.model import RunClaims, Verdict
from collector.render import safe_text
from collector.settings import Settings
from collector.sources.kube_api import KubeApi, api_client_for
from exporters.adx.embedded import embedded_exporter
from exporters.adx.query import available, default_store
from exporters.prometheus import new_registry
from kubesim.run import SimulationSession, start_simulation

_STYLE = {
    Verdict.VERIFIED: "green",
    Verdict.CONTRADICTED: "bold red",
    Verdict.UNCONFIRMED: "yellow",
    Verdict.AHEAD: "cyan",
    Verdict.PENDING: "dim",
    Verdict.UNASSERTED: "dim",
}


def _cell(rc: RunClaims, name: str) -> Text:
    c = rc.claims[name]
    word = "STALLED" if name == "progressing" and c.cause == "stalled" else c.verdict.value
    return Text(word, style=_STYLE[c.verdict])


def _why(rc: RunClaims) -> str:
    if rc.blocked is not None:
        return f"blocked in {rc.blocked.stage.value} ({rc.blocked.stage.owner}): {rc.blocked.reason}"
    for name in ("progressing", "running", "scheduled"):
        c = rc.claims[name]
        if c.verdict in (Verdict.CONTRADICTED, Verdict.UNCONFIRMED):
            return f"{name}: {c.reason}"
    return rc.progressing.reason


def table(claims: list[RunClaims], clock_note: str) -> Table:
    t = Table(title=f"TauGrid runs — claims verified from evidence ({clock_note})", expand=True)
    for col in ("run", "kind", "scheduled", "running", "progressing", "goodput"):
        t.add_column(col, no_wrap=True)
    t.add_column("why", ratio=1, overflow="fold")
    for rc in sorted(claims, key=lambda r: (r.ref.namespace, r.ref.name)):
        g = rc.goodput
        good = f"{g.ratio:.0%}" if g is not None and g.ratio is not None else "–"
        # Text, not str: rich would read markup ("[link=…]") in tenant-written reasons.
        t.add_row(Text(safe_text(f"{rc.ref.namespace}/{rc.ref.name}")), rc.ref.kind, _cell(rc, "scheduled"),
                  _cell(rc, "running"), _cell(rc, "progressing"), good, Text(safe_text(_why(rc)[:240])))
    return t


def run_demo(*, speed: float, duration: float | None, scenario: Path | None, metrics_port: int,
             console: Console | None = None, store: Path | None = None) -> int:
    # A pipe or CI log gets a wide table instead of 80 squeezed columns.
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    session: SimulationSession = start_simulation(scenario, "127.0.0.1:0", speed)
    clock = session.engine.clock
    base = Settings()
    # Controller intervals are wall-clock; the scenario clock runs `speed` times faster.
    settings = replace(base, controller=replace(base.controller, leader_election=False, tick=timedelta(seconds=1),
                                                log_poll_interval=timedelta(seconds=max(0.5, 10 / speed))))
    store = store or default_store()
    sink = embedded_exporter(store, registry := new_registry())  # the embedded ADX tables, for `query`
    sink.open()
    ctl = Controller(KubeApi(api_client_for(session.base_url)), settings, clock.now, sink=sink, registry=registry)
    try:
        port = ctl.serve("127.0.0.1", metrics_port)
        ctl.open()
        started = time.monotonic()
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            while duration is None or time.monotonic() - started < duration:
                elapsed = timedelta(seconds=(clock.now() - session.engine.origin).total_seconds())
                live.update(Group(table(list(ctl.claims.values()), f"scenario time {human_age(elapsed)}, "
                                                                     f"{speed:g}× real time")))
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        claims = list(ctl.claims.values())
        ctl.close()
        session.close()
        sink.close()
    _summary(console, claims, session, port, store, clock.now())
    return 0


def _summary(console: Console, claims: list[RunClaims], session: SimulationSession, port: int,
             store: Path, ended: datetime) -> None:
    bad = [rc for rc in claims if any(c.verdict is Verdict.CONTRADICTED for c in rc.claims.values())]
    blocked = [rc for rc in claims if rc.blocked is not None]
    console.print()
    console.print(f"[bold]{len(claims)} runs[/]: {len(bad)} with a contradicted claim, {len(blocked)} blocked.")
    for rc in bad + blocked:
        console.print(Text(safe_text(f"  • {rc.ref.namespace}/{rc.ref.name}: {_why(rc)}")))
    console.print()
    console.print("[bold]Where to look next[/]")
    console.print(f"  • Prometheus families (while running): http://127.0.0.1:{port}/metrics — see docs/metrics.md")
    console.print("  • The same claims offline: `taugrid-evidence simulator` in one terminal, then")
    console.print("      kubectl --kubeconfig <printed path> cluster-info dump -A --output-directory DIR")
    console.print("      kubectl --kubeconfig <printed path> get tauruns,rayjobs,workloads,jobs -A -o json"
                  " > DIR/crds.json")
    console.print("      taugrid-evidence explain --from-dump DIR")
    console.print("  • Against a real cluster: `taugrid-evidence controller --kubeconfig ~/.kube/config`")
    console.print(f"  (this run's simulator kubeconfig was {session.kubeconfig})")
    console.print(f"  • Fleet questions in KQL on the embedded store ({store}):")
    # The scenario clock ran ahead of the wall clock: evaluate now() at the scenario's end.
    console.print(f"      taugrid-evidence query NAME --now {ended.strftime('%Y-%m-%dT%H:%M:%SZ')}"
                  f"   (NAME: {', '.join(available())})")
