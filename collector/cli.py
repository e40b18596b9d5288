"""`taugrid-evidence` command line."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import click
import orjson
from kubernetes import config as k8s_config

from collector.claims import evaluate
from collector.config import ConfigError, load_settings
from collector.controller import Controller
from collector.correlate import build_index
from collector.kube import parse_time
from collector.logfmt import setup_json_logging
from collector.model import RunClaims
from collector.progress import scan_path, scan_report
from collector.render import render_scan, render_text, to_json
from collector.settings import Settings
from collector.sources.dump import load_dump
from collector.sources.kube_api import KubeApi, SourceError, load_api_client

EXIT_SKIPPED = 3  # evaluated, but some input could not be read


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="taugrid-evidence")
def main() -> None:
    """Evidence collector for TauGrid training runs: scheduled, running and progressing, verified."""


def _parse_at(_: click.Context, __: click.Parameter, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as e:
        raise click.BadParameter(f"not an RFC3339 time: {value!r} ({e})") from e


def _select(claims: list[RunClaims], wanted: tuple[str, ...]) -> list[RunClaims]:
    if not wanted:
        return claims
    out = []
    for rc in claims:
        names = {rc.ref.name, f"{rc.ref.namespace}/{rc.ref.name}", f"{rc.ref.kind}/{rc.ref.namespace}/{rc.ref.name}"}
        if names & set(wanted):
            out.append(rc)
    return out


@main.command()
@click.option("--from-dump", "dump_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              required=True, help="Directory written by `kubectl cluster-info dump --output-directory`.")
@click.option("--at", "at", callback=_parse_at, help="Evaluation time (RFC3339). Default: newest time in the dump.")
@click.option("--captured-at", "captured", callback=_parse_at,
              help="When the dump was taken (RFC3339). Default: the newest of its file times and contents.")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.argument("runs", nargs=-1)
def explain(dump_dir: Path, at: datetime | None, captured: datetime | None, output: str,
            runs: tuple[str, ...]) -> None:
    """Explain the claims of RUNS (NAME or NAMESPACE/NAME; all runs when none) from a cluster dump.

    The dump is one snapshot: every source counts as synced when it was captured, so evaluating
    it --at a time past the freshness bound after capture gives unknown, never an old true.
    """
    settings = Settings()
    dump = load_dump(dump_dir, settings.taugrid)
    for p in dump.problems:
        click.echo(f"{'skipped' if p.skipped else 'warning'}: {p}", err=True)
    newest = dump.newest()
    now = at or newest
    if now is None:
        click.echo(f"error: {dump_dir}: no timestamps in the dump; pass --at", err=True)
        sys.exit(2)
    index = build_index(dump.records)
    taken = captured or dump.captured_at() or now
    index.synced.update(dict.fromkeys(SNAPSHOT_SOURCES, taken))
    for sig in dump.signals(taken):
        index.set_signal(sig)
    claims = [evaluate(ev, now, settings.claims) for ev in index.all_evidence()]
    selected = _select(claims, runs)
    if runs and not selected:
        click.echo(f"error: no run matches {', '.join(runs)}; runs in the dump: "
                   f"{', '.join(f'{c.ref.namespace}/{c.ref.name}' for c in claims) or 'none'}", err=True)
        sys.exit(2)
    if output == "json":
        sys.stdout.buffer.write(orjson.dumps(to_json(selected, now), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        click.echo(render_text(selected, now) if selected else "no runs found in the dump")
    if dump.skipped:
        sys.exit(EXIT_SKIPPED)


SNAPSHOT_SOURCES = (
    "Pod", "Node", "Event", "Workload", "LocalQueue", "ClusterQueue", "RayJob", "RayCluster",
    "Job", "TauRun", "TauCluster", "TauWorkspace",
)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--regex", "custom_regex", help="Progress regex with a named group `step` (optional `loss`).")
@click.option("--max-bytes", type=int, default=None, help="Read only the tail this big of each file.")
def scan(files: tuple[Path, ...], output: str, custom_regex: str | None, max_bytes: int | None) -> None:
    """Scan training, kernel or syslog FILES for progress, NCCL hangs and GPU XID errors."""
    try:
        reports = [scan_report(scan_path(f, custom_regex=custom_regex, max_bytes=max_bytes)) for f in files]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--regex") from e
    if output == "json":
        sys.stdout.buffer.write(orjson.dumps(reports if len(reports) != 1 else reports[0],
                                             option=orjson.OPT_INDENT_2) + b"\n")
        return
    for rep in reports:
        click.echo(render_scan(rep))


@main.command()
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), help="Default: in-cluster config.")
@click.option("--context", help="kubeconfig context.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML settings (claims, controller, taugrid sections).")
@click.option("--metrics-address", default="0.0.0.0:9464", show_default=True, help="HOST:PORT for /metrics.")
@click.option("--log-level", default="INFO", show_default=True)
def controller(kubeconfig: str | None, context: str | None, config_path: Path | None, metrics_address: str,
               log_level: str) -> None:
    """Watch a cluster and keep every run's claims current; serve /metrics, /healthz, /readyz."""
    setup_json_logging(log_level)
    try:
        settings = load_settings(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from e
    host, port = _address(metrics_address)
    try:
        api = KubeApi(load_api_client(kubeconfig, context))
    except (k8s_config.ConfigException, OSError) as e:
        hint = "" if kubeconfig else " (no --kubeconfig given, and not running in a cluster)"
        raise click.ClickException(f"cannot configure the Kubernetes client{hint}: {e}") from e
    if not settings.controller.lease_namespace:
        settings = replace(settings, controller=replace(settings.controller, lease_namespace=_own_namespace()))
    ctl = Controller(api, settings, lambda: datetime.now(UTC))
    bound = ctl.serve(host, port)
    logging.getLogger("taugrid").info("serving", extra={"address": f"{host}:{bound}",
                                                         "lease_namespace": settings.controller.lease_namespace})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        ctl.open()
        stop.wait()
    except KeyboardInterrupt:
        pass
    except SourceError as e:
        raise click.ClickException(str(e)) from e
    finally:
        ctl.close()


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _own_namespace() -> str:
    """The namespace the controller runs in (its Lease lives there); "default" outside a cluster."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host or "0.0.0.0", int(port)


@main.command()
@click.option("--speed", type=float, default=10.0, show_default=True, help="Scenario seconds per real second.")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds (default: Ctrl-C).")
@click.option("--scenario", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Scenario YAML (default: the shipped one).")
@click.option("--metrics-port", type=int, default=0, show_default=True, help="Port for /metrics (0: any free).")
def demo(speed: float, duration: float | None, scenario: Path | None, metrics_port: int) -> None:
    """Run the API simulator's scenario and the live controller, and show each run's claims live."""
    from collector.demo import run_demo  # rich's live display is only needed here

    logging.basicConfig(level=logging.ERROR)
    sys.exit(run_demo(speed=speed, duration=duration, scenario=scenario, metrics_port=metrics_port))


@main.command()
@click.option("--scenario", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Scenario YAML (default: the shipped one).")
@click.option("--address", default="127.0.0.1:0", show_default=True, help="HOST:PORT to serve on.")
@click.option("--speed", type=float, default=1.0, show_default=True, help="Scenario seconds per real second.")
@click.option("--kubeconfig", "kubeconfig_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write a kubeconfig pointing at the simulator.")
def simulator(scenario: Path | None, address: str, speed: float, kubeconfig_out: Path | None) -> None:
    """Serve the Kubernetes API simulator playing a scenario; point kubectl or any client at it."""
    from collector.simulator.run import run_simulator
    from collector.simulator.scenario import ScenarioError

    try:
        run_simulator(scenario, address, speed, kubeconfig_out)
    except ScenarioError as e:
        raise click.ClickException(str(e)) from e


@main.command()
@click.argument("query_name", metavar="NAME|FILE")
@click.option("--output", "-o", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.option("--store", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Embedded DuckDB store (default: $XDG_DATA_HOME/taugrid-evidence/evidence.duckdb).")
@click.option("--adx", "adx_uri", default=None, help="Query this ADX cluster URI instead of the embedded store.")
@click.option("--database", default="taugrid", show_default=True, help="ADX database.")
@click.option("--auth", type=click.Choice(["workload-identity", "azure-cli", "none"]), default="azure-cli",
              show_default=True, help="ADX authentication (none: loopback test endpoints only).")
@click.option("--now", "now", callback=_parse_at, help="Evaluate now()/ago() at this time (embedded only; RFC3339).")
def query(query_name: str, output: str, store: Path | None, adx_uri: str | None, database: str, auth: str,
          now: datetime | None) -> None:
    """Run a KQL query from queries/ (by NAME) or a FILE on the embedded store or on ADX."""
    from exporters.adx.kusto import AdxSettings
    from exporters.adx.query import QueryError, default_store, render, resolve, run_adx, run_embedded

    try:
        path = resolve(query_name)
        kql = path.read_text()
        if adx_uri:
            result = run_adx(kql, AdxSettings(query_uri=adx_uri, database=database, auth=auth))
        else:
            result = run_embedded(kql, store or default_store(), now=now)
    except (QueryError, ValueError, OSError) as e:
        raise click.ClickException(f"{query_name}: {e}") from e
    click.echo(render(result, output))
