"""`taugrid-evidence` command line."""

from __future__ import annotations

import logging
import signal
import stat
import sys
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import click
import orjson
import yaml

from collector.config import ConfigError, load_settings
from collector.controller import Controller
from collector.endpoints import HttpOptions
from collector.envcontract import check, single_cluster
from collector.explaincmd import (
    EXIT_SKIPPED,
    ControllerOptions,
    LiveOptions,
    NoClock,
    document,
    dump_claims,
    explain_controller,
    explain_live,
    select,
    write_document,
)
from collector.kube import parse_time
from collector.logfmt import setup_json_logging
from collector.malloc import fix_mmap_threshold
from collector.progress import scan_path, scan_report
from collector.render import redact_json, render_scan, render_text, safe_text
from collector.safeload import MAX_OBJECT_BYTES
from collector.sources.kube_api import KubeApi, SourceError, load_api_client, missing_kinds, resources_for
from collector.sources.kube_client import ConfigException
from collector.sources.live import MAX_LOG_BYTES, MAX_PODS, LiveLimits
from collector.workers import parse_worker
from collector.workerwatch import workers_from_specs
from exporters.prometheus import new_registry


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="taugrid-evidence")
def main() -> None:
    """Evidence collector for TauGrid training runs: scheduled, running and progressing, verified."""


# Times outside this range are no evaluation clock (and would overflow date arithmetic).
_EARLIEST, _LATEST = datetime(1970, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC)


def _parse_at(_: click.Context, __: click.Parameter, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        t = parse_time(value)
    except (ValueError, OverflowError) as e:
        raise click.BadParameter(f"not an RFC3339 time: {value!r} ({e})") from e
    if t is None or not _EARLIEST <= t < _LATEST:
        raise click.BadParameter(f"{value!r} is outside {_EARLIEST.year}..{_LATEST.year - 1}")
    return t


@main.command()
@click.option("--from-dump", "dump_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Directory written by `kubectl cluster-info dump --output-directory` (default: the live cluster).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Live: default $KUBECONFIG, else ~/.kube/config, else the in-cluster service account.")
@click.option("--context", help="Live: the kubeconfig context (default: its current context).")
@click.option("--namespace", "-n", default=None,
              help="Live: the runs' namespace (default: NAMESPACE/NAME's, else the context's, else default).")
@click.option("--max-pods", type=click.IntRange(min=0), default=MAX_PODS, show_default=True,
              help="Live: read the logs of at most this many of the runs' pods.")
@click.option("--max-log-bytes", type=click.IntRange(min=1), default=MAX_LOG_BYTES, show_default=True,
              help="Live: the tail this big of each container's current and previous log.")
@click.option("--controller", "controller_url", metavar="URL",
              help="Show what the controller at URL holds (its /runs: claims as the alert saw them, and history).")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--controller: the bearer token its /metrics and /runs require.")
@click.option("--cacert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--controller: the CA bundle its HTTPS certificate is checked against.")
@click.option("--at", "at", callback=_parse_at,
              help="Evaluation time (RFC3339). Default: the capture time its control-plane stamps give.")
@click.option("--captured-at", "captured", callback=_parse_at,
              help="When the dump was taken (RFC3339). Default: bounded by its node Leases and heartbeats.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML settings, the controller's file (claims windows, taugrid contract, per-profile regexes).")
@click.option("--max-file-bytes", type=click.IntRange(min=1), default=MAX_OBJECT_BYTES, show_default=True,
              help="Largest JSON/YAML file read from the dump.")
@click.option("--output", "-o", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True)
@click.option("--bundles", "bundles_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bundles"),
              show_default=True, help="Where evidence bundles are; text output links each run's latest.")
@click.option("--worker-dump", "worker_dumps", multiple=True, metavar="NAME=DIR",
              help="A MultiKueue worker's dump, NAME as the manager's status.clusterName says (repeatable).")
@click.argument("runs", nargs=-1)
def explain(dump_dir: Path | None, kubeconfig: str | None, context: str | None, namespace: str | None,
            max_pods: int, max_log_bytes: int, controller_url: str | None, token_file: Path | None,
            cacert: Path | None, at: datetime | None, captured: datetime | None,
            config_path: Path | None, max_file_bytes: int, output: str, bundles_dir: Path,
            worker_dumps: tuple[str, ...], runs: tuple[str, ...]) -> None:
    """Explain the claims of RUNS (NAME or NAMESPACE/NAME; all runs when none), live or from a dump.

    Live (no --from-dump): the runs' namespace is read once with your kubeconfig's credentials, and
    judged on the API server's clock; what RBAC refuses is named, and the claims it would have
    supported are unknown. The dump is one snapshot: every source counts as synced when it was
    captured, so evaluating it --at a time past the freshness bound after capture gives unknown.
    """
    try:
        settings = load_settings(config_path)
    except ConfigError as e:
        raise click.ClickException(safe_text(str(e))) from e
    if controller_url is not None:
        other = [o for o, v in (("--from-dump", dump_dir), ("--kubeconfig", kubeconfig), ("--context", context),
                                ("--at", at), ("--captured-at", captured), ("--worker-dump", worker_dumps)) if v]
        if other:
            raise click.UsageError(f"--controller: not with {', '.join(other)}")
        sys.exit(explain_controller(ControllerOptions(controller_url, token_file, cacert, namespace, output), runs))
    if token_file is not None or cacert is not None:
        raise click.UsageError("--token-file, --cacert: only with --controller")
    if dump_dir is None:
        dump_only = [o for o, v in (("--at", at), ("--captured-at", captured), ("--worker-dump", worker_dumps)) if v]
        if dump_only:
            raise click.UsageError(f"{', '.join(dump_only)}: only with --from-dump")
        opts = LiveOptions(kubeconfig, context, namespace, LiveLimits(max_pods=max_pods, max_log_bytes=max_log_bytes),
                           output, bundles_dir)
        sys.exit(explain_live(opts, runs, settings))
    live_only = [o for o, v in (("--kubeconfig", kubeconfig), ("--context", context), ("--namespace", namespace)) if v]
    if live_only:
        raise click.UsageError(f"{', '.join(live_only)}: only live (without --from-dump)")
    try:
        worker_dirs = dict(parse_worker(w) for w in worker_dumps)
    except ValueError as e:
        raise click.ClickException(safe_text(str(e))) from e
    try:
        result = dump_claims(dump_dir, settings, at=at, captured=captured, max_file_bytes=max_file_bytes,
                             worker_dirs=worker_dirs, on_problem=lambda p: click.echo(safe_text(p), err=True))
    except NoClock:
        click.echo(safe_text(f"error: {dump_dir}: no control-plane timestamps in the dump (node heartbeats, "
                             "node Leases, Events, pod status); pass --at"), err=True)
        sys.exit(2)
    dump, workers, claims, now, inferred = result.dump, result.workers, result.claims, result.now, result.inferred
    selected = select(claims, runs)
    if runs and not selected:
        click.echo(safe_text(f"error: no run matches {', '.join(runs)}; runs in the dump: "
                             f"{', '.join(f'{c.ref.namespace}/{c.ref.name}' for c in claims) or 'none'}"), err=True)
        sys.exit(2)
    missing = missing_kinds({r.ref.kind for r in dump.records}, str(dump_dir)) if inferred or not claims else None
    environment = single_cluster("manager", dump.version, dump.environment_objects,
                                 settings.controller.environment_namespaces or None)
    if workers.inventories:
        environment = check([*environment.clusters, *workers.inventories])
    if output in ("json", "yaml"):
        write_document(document(selected, now, environment=environment, missing=missing), output)
    else:
        from collector.bundlecmd import latest_bundles

        click.echo(render_text(selected, now, bundles=latest_bundles(bundles_dir, selected))
                   if selected else "no runs found in the dump")
        if missing is not None:
            click.echo(safe_text(f"missing from the dump: {', '.join(missing['kinds'])}; runs were inferred from"
                                 " pods. Add them with:"))
            click.echo("  " + safe_text(str(missing["command"])))
        click.echo(safe_text(environment.summary()))
    if dump.skipped or workers.skipped:
        sys.exit(EXIT_SKIPPED)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--regex", "custom_regex", help="Progress regex with a named group `step` (optional `loss`).")
@click.option("--max-bytes", type=int, default=None, help="Read only the tail this big of each file.")
def scan(files: tuple[Path, ...], output: str, custom_regex: str | None, max_bytes: int | None) -> None:
    """Scan training, kernel or syslog FILES for progress, NCCL hangs and GPU XID errors."""
    regular = []
    for f in files:
        try:
            mode = f.stat().st_mode
        except OSError as e:
            click.echo(safe_text(f"skipped: {f}: unreadable: {e.strerror}"), err=True)
            continue
        if stat.S_ISREG(mode):
            regular.append(f)
        else:  # a FIFO would block the scan forever; a device reads without end
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
                else "not a regular file"
            click.echo(safe_text(f"skipped: {f}: {kind}; only regular files are scanned"), err=True)
    try:
        reports = [redact_json(scan_report(scan_path(f, custom_regex=custom_regex, max_bytes=max_bytes)))
                   for f in regular]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--regex") from e
    if output == "json":
        sys.stdout.buffer.write(orjson.dumps(reports if len(reports) != 1 else reports[0],
                                             option=orjson.OPT_INDENT_2) + b"\n")
    else:
        for rep in reports:
            click.echo(render_scan(rep))
    if len(regular) != len(files):
        sys.exit(EXIT_SKIPPED)


@main.command()
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), help="Default: in-cluster config.")
@click.option("--context", help="kubeconfig context.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML settings (claims, controller, taugrid sections).")
@click.option("--metrics-address", default="127.0.0.1:9464", show_default=True,
              help="HOST:PORT for /metrics, /healthz, /readyz (in a pod: its own address, or 0.0.0.0).")
@click.option("--tls-cert-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Serve HTTPS with this certificate (PEM; with --tls-private-key-file).")
@click.option("--tls-private-key-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The certificate's private key (PEM).")
@click.option("--metrics-token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="/metrics requires `Authorization: Bearer <the token in this file>` (re-read on change).")
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--worker", "worker_specs", multiple=True, metavar="NAME=KUBECONFIG[#CONTEXT]",
              help="A MultiKueue worker cluster to read (repeatable; NAME as the manager's Workloads name it).")
@click.option("--export-store", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the ADX tables to this embedded DuckDB file (spool beside it) for `query`.")
@click.option("--adx-uri", default=None, help="Export to this ADX cluster (queued ingestion, workload identity).")
@click.option("--adx-database", default="taugrid", show_default=True)
@click.option("--spool-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Durable spool in front of ADX (default: beside --export-store, or ./spool).")
@click.option("--cluster-name", default="", help="This cluster's name in the fleet's ADX rows.")
def controller(kubeconfig: str | None, context: str | None, config_path: Path | None, metrics_address: str,
               tls_cert_file: Path | None, tls_private_key_file: Path | None, metrics_token_file: Path | None,
               log_level: str, worker_specs: tuple[str, ...], export_store: Path | None, adx_uri: str | None,
               adx_database: str, spool_dir: Path | None, cluster_name: str) -> None:
    """Watch a cluster and keep every run's claims current; serve /metrics, /healthz, /readyz."""
    setup_json_logging(log_level)
    fix_mmap_threshold()  # before any thread starts
    try:
        settings = load_settings(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from e
    host, port = _address(metrics_address)
    http_options = HttpOptions(tls_cert_file=tls_cert_file, tls_key_file=tls_private_key_file,
                               token_file=metrics_token_file)
    try:
        api = KubeApi(load_api_client(kubeconfig, context))
    except (ConfigException, OSError) as e:
        hint = "" if kubeconfig else " (no --kubeconfig given, and not running in a cluster)"
        raise click.ClickException(f"cannot configure the Kubernetes client{hint}: {e}") from e
    except (yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError) as e:
        # The client's loader assumes a well-formed file: a broken one surfaces as any of these.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise click.ClickException(f"kubeconfig {kubeconfig}: malformed ({type(e).__name__}: {first})") from e
    if not settings.controller.lease_namespace:
        settings = replace(settings, controller=replace(settings.controller, lease_namespace=_own_namespace()))
    try:
        workers = workers_from_specs(worker_specs, api.clock.now, resources_for(settings.taugrid), settings.taugrid)
    except (ValueError, ConfigException, OSError, yaml.YAMLError) as e:
        raise click.ClickException(f"--worker: {e}") from e
    registry = new_registry()
    sink = None
    if adx_uri or export_store:
        from exporters.adx import AdxSettings, ExportSettings, build_sink

        store = export_store or Path("evidence.duckdb")
        spool = spool_dir or (store.with_name(store.stem + ".spool") if export_store else Path("spool"))
        sink = build_sink(AdxSettings(query_uri=adx_uri or "", database=adx_database),
                          ExportSettings(cluster=cluster_name, spool_dir=spool), store, registry)
        sink.open()
    # Timestamps in API objects are the API server's: evaluate them on its clock (its Date header).
    ctl = Controller(api, settings, api.clock.now, registry=registry, sink=sink, workers=workers)
    try:
        bound = ctl.serve(host, port, http_options)
    except (OSError, ValueError) as e:  # busy port, bad certificate or key, empty token file
        raise click.ClickException(f"cannot serve on {host}:{port}: {e}") from e
    logging.getLogger("taugrid").info("serving", extra={"address": f"{host}:{bound}",
                                                         "lease_namespace": settings.controller.lease_namespace})
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        # Also ends a startup still waiting for an API server that does not answer.
        stop.set()
        ctl.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        ctl.open()
        stop.wait()
    except KeyboardInterrupt:
        pass
    except SourceError as e:
        raise click.ClickException(str(e)) from e
    finally:
        ctl.close()
        if sink is not None:
            sink.close()
        # Everything is closed and flushed; what follows is the interpreter's own teardown.
        logging.getLogger("taugrid").info("stopped")


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
    return (host or "127.0.0.1").strip("[]"), int(port)


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
@click.option("--fault", "fault_specs", multiple=True, metavar="SPEC",
              help="A fault on the scenario clock (repeatable): at=30s,for=1m,action=status,status=503,"
                   "verbs=list+watch,resources=pods, or the same as JSON (kubesim/README.md).")
@click.option("--event-ttl", default=None, metavar="DURATION",
              help="Delete Events this long after their last write (kube-apiserver --event-ttl), e.g. 1h.")
def simulator(scenario: Path | None, address: str, speed: float, kubeconfig_out: Path | None,
              fault_specs: tuple[str, ...], event_ttl: str | None) -> None:
    """Serve the Kubernetes API simulator playing a scenario; point kubectl or any client at it."""
    from kubesim.faults import parse_fault_spec
    from kubesim.run import run_simulator
    from kubesim.scenario import ScenarioError, parse_duration

    try:
        faults = [parse_fault_spec(spec) for spec in fault_specs]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--fault") from e
    try:
        ttl = parse_duration(event_ttl, "--event-ttl") if event_ttl is not None else None
    except ScenarioError as e:
        raise click.BadParameter(str(e), param_hint="--event-ttl") from e
    if ttl is not None and ttl <= 0:
        raise click.BadParameter(f"must be a positive duration, got {event_ttl!r}", param_hint="--event-ttl")
    try:
        run_simulator(scenario, address, speed, kubeconfig_out, faults=faults, event_ttl_s=ttl)
    except ScenarioError as e:
        raise click.ClickException(str(e)) from e


# --- evidence bundles ------------------------------------------------------------------------------


class _BundleGroup(click.Group):
    """`bundle RUN ...` writes a bundle; `bundle redact PATH` is the one subcommand."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["create", *args]
        return super().parse_args(ctx, args)


@main.group(cls=_BundleGroup)
def bundle() -> None:
    """Evidence bundles: `bundle RUN [--from-dump DIR] [--out PATH]`, `bundle redact PATH`.

    A bundle holds the manifest (claims, time range, every file's sha256), raw object histories,
    events, container logs, progress series, profiles and flight-recorder dumps with their hang
    analysis, a self-contained timeline page and REDACTIONS.md.
    """


@bundle.command("create", hidden=True)
@click.argument("run")
@click.option("--from-dump", "dump_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Directory written by `kubectl cluster-info dump` (default: the live cluster).")
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="Directory to put the bundle in (default ./bundles), or a FILE.tar.gz.")
@click.option("--at", "at", callback=_parse_at, help="Evaluation time for a dump (RFC3339).")
@click.option("--artifacts", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Where the run left profiles and NCCL flight-recorder dumps (per-pod subdirectories or files).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), help="Live: default in-cluster config.")
@click.option("--context", help="kubeconfig context.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML settings (a bundles: section sets bounds and storage).")
def bundle_create(run: str, dump_dir: Path | None, out: Path | None, at: datetime | None, artifacts: Path | None,
                  kubeconfig: str | None, context: str | None, config_path: Path | None) -> None:
    """Write RUN's evidence bundle (NAME or NAMESPACE/NAME) and print where it is."""
    from collector.bundlecmd import bundle_from_dump_cmd, bundle_live_cmd
    from collector.capture import CaptureError

    try:
        settings = load_settings(config_path)
        if dump_dir is not None:
            where, manifest = bundle_from_dump_cmd(dump_dir, run, out, settings, at=at, artifacts=artifacts)
        else:
            api = KubeApi(load_api_client(kubeconfig, context))
            where, manifest = bundle_live_cmd(api, run, out, settings)
    except (ConfigError, CaptureError, SourceError, OSError, ConfigException) as e:
        raise click.ClickException(str(e)) from e
    click.echo(where)
    for m in manifest.get("missing") or []:
        click.echo(f"  missing: {m['what']}: {m['why']}", err=True)


@bundle.command("redact")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML settings (a redaction: section adds patterns and secret names).")
def bundle_redact(path: Path, config_path: Path | None) -> None:
    """Re-apply the current redaction rules to the bundle at PATH (directory or .tar.gz), updating hashes."""
    from collector.bundlecmd import redact_cmd
    from collector.capture import CaptureError

    try:
        load_settings(config_path)  # installs the settings' redaction rules
        changed = redact_cmd(path)
    except (ConfigError, CaptureError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"{path}: {changed} more value(s) redacted; manifest and REDACTIONS.md updated")

# `taugrid-evidence agent` (collector/agent/command.py). The console script (collector/entry.py)
# runs it without importing this module: the DaemonSet's process stays free of the controller's
# imports (kubernetes client, claims), which would add ~25 MiB to every node.
from collector.agent.command import agent as _agent_command  # noqa: E402

main.add_command(_agent_command)


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
