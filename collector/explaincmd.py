"""`explain`'s evaluation and output, shared by its inputs: a dump, the live cluster, the controller.

Each input gives records, when each kind was read, and log signals; one index and one claim engine
judge them (so a run explained live reads as it would from a dump of the same moment), and one
renderer writes the text or the JSON contract (docs/explain.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click
import orjson
import yaml

from collector.claims.queue_status import Workloads, attach, cluster_queue_of, pending_workload
from collector.correlate import RunEvidence, RunIndex, Signal, build_index
from collector.envcontract import EnvironmentReport, single_cluster
from collector.kube import dns1123_label, dns1123_subdomain
from collector.model import Observed, Ref, RunClaims, Stage, WorkloadFacts, verdict_for
from collector.multicluster import evaluate_multicluster
from collector.queuefacts import PendingSummary
from collector.render import render_text, safe_text, to_json
from collector.runsapi import (
    MAX_DOCUMENT_BYTES,
    BadDocument,
    decode_runs,
    render_history,
)
from collector.safeload import MAX_OBJECT_BYTES
from collector.settings import Settings
from collector.sources.dump import Dump, load_dump
from collector.sources.kube_api import KubeApi, SourceError, load_api_client, resources_for
from collector.sources.kube_client import ConfigException
from collector.sources.live import LiveLimits, Refusal, read_live
from collector.sources.visibility import read_pending
from collector.workers import WorkerDumps, load_worker_dumps

EXIT_SKIPPED = 3  # evaluated, but some input could not be read (or was refused)


def select(claims: list[RunClaims], wanted: Sequence[str]) -> list[RunClaims]:
    if not wanted:
        return claims
    out = []
    for rc in claims:
        names = {rc.ref.name, f"{rc.ref.namespace}/{rc.ref.name}", f"{rc.ref.kind}/{rc.ref.namespace}/{rc.ref.name}"}
        if names & set(wanted):
            out.append(rc)
    return out


def evidence_index(dump: Dump, synced: Mapping[str, datetime], signals: Iterable[Signal],
                   contract: Any) -> tuple[RunIndex, list[Ref]]:
    """The index the claim engine reads: the dump's records and node clocks, each kind's read time,
    log signals."""
    index = build_index(dump.records, contract)
    inferred = index.infer_missing_roots()
    index.synced.update(synced)
    dump.place_clocks(index)
    for sig in signals:
        index.set_signal(sig)
    return index, inferred


def fail_closed(claims: list[RunClaims], refused: Sequence[Refusal]) -> list[RunClaims]:
    """A claim whose evidence was refused is never true: unknown, its reason naming the refusal. (The
    engine already gives unknown for a kind that never synced; this holds it for every claim a
    refusal names. A false claim stands: other evidence showed it, as a finished run's progressing.)"""
    if not refused:
        return claims
    out = []
    for rc in claims:
        changed: dict[str, Any] = {}
        for name, claim in rc.claims.items():
            why = [r for r in refused if name in r.claims and (not r.namespace or r.namespace == rc.ref.namespace)]
            if why and claim.observed is not Observed.FALSE:
                refusal = why[0]
                changed[name] = replace(claim, observed=Observed.UNKNOWN, since=None,
                                        verdict=verdict_for(claim.asserted, Observed.UNKNOWN),
                                        reason=f"{refusal.verb} {refusal.resource} refused; {claim.reason}", cause="")
        out.append(replace(rc, **changed) if changed else rc)
    return out


def document(selected: list[RunClaims], now: datetime, *, environment: Any = None,
             missing: Mapping[str, Any] | None = None, refused: Sequence[Refusal] | None = None) -> dict[str, Any]:
    doc = to_json(selected, now)
    if environment is not None:
        doc["environment"] = environment.to_json()
    if missing is not None:
        doc["missing"] = missing
    if refused is not None:
        doc["refused"] = [r.to_json() for r in refused]
    return doc


def write_document(doc: dict[str, Any], output: str) -> None:
    if output == "yaml":
        sys.stdout.write(yaml.safe_dump(orjson.loads(orjson.dumps(doc)), sort_keys=False, allow_unicode=False))
    else:
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")


def echo_refusals(refused: Sequence[Refusal]) -> None:
    for r in refused:
        click.echo(safe_text(str(r)))


# --- from a dump ------------------------------------------------------------------------------------


class NoClock(Exception):
    """The dump holds no control-plane stamp to evaluate it at, and no --at was given."""


@dataclass(frozen=True, slots=True)
class DumpResult:
    dump: Dump
    workers: WorkerDumps
    claims: list[RunClaims]
    now: datetime
    inferred: list[Ref]


def dump_claims(dump_dir: Path, settings: Settings, *, at: datetime | None = None, captured: datetime | None = None,
                max_file_bytes: int = MAX_OBJECT_BYTES, worker_dirs: Mapping[str, Path] | None = None,
                on_problem: Callable[[str], None] = lambda _: None) -> DumpResult:
    """Every run of a dump, judged at --at or its capture time; each problem is passed to `on_problem`
    as it is known (the dump's, then its workers')."""
    dump = load_dump(dump_dir, settings.taugrid, max_object_bytes=max_file_bytes,
                     log_regex_by_profile=settings.controller.log_regex_by_profile)
    clock = dump.clock(captured)  # judged first: its warnings are passed on below
    for p in dump.problems:
        on_problem(f"{'skipped' if p.skipped else 'warning'}: {p}")
    now = at or clock.at
    if now is None:
        raise NoClock(str(dump_dir))
    # --at fixes the instant; otherwise the capture is known to lie in [clock.at, clock.at + slack].
    slack = timedelta(0) if at is not None else clock.slack
    taken = clock.taken(at) or now
    # One snapshot: every kind it holds was read at capture time.
    index, inferred = evidence_index(dump, dict.fromkeys(dump.snapshot_kinds(), taken), dump.signals(taken),
                                     settings.taugrid)
    workers = load_worker_dumps(dict(worker_dirs or {}), settings, taken, max_object_bytes=max_file_bytes)
    for problem in workers.problems:
        on_problem(problem)
    claims = [evaluate_multicluster(ev, workers.runs, now, settings.claims, slack=slack,
                                    origin=settings.controller.multikueue_origin) for ev in index.all_evidence()]
    return DumpResult(dump, workers, claims, now, inferred)


# --- live -----------------------------------------------------------------------------------------

DEFAULT_KUBECONFIG = "~/.kube/config"


def kubeconfig_path(explicit: str | None) -> str | None:
    """kubectl's choice: --kubeconfig, else $KUBECONFIG (its files merged, as kubectl merges them: the
    client's loader takes the list as it is), else ~/.kube/config; None (the in-cluster service
    account) when none of them exists."""
    if explicit:
        return explicit
    env = os.environ.get("KUBECONFIG", "")
    if any(p and Path(p).expanduser().is_file() for p in env.split(os.pathsep)):
        return env
    default = Path(DEFAULT_KUBECONFIG).expanduser()
    return str(default) if default.is_file() else None


def context_namespace(config_file: str | None, context: str | None) -> str:
    """The namespace the kubeconfig's (current or named) context sets; "" when none."""
    if config_file is None:
        return ""
    from kubernetes.config.kube_config import list_kube_config_contexts

    contexts, current = list_kube_config_contexts(config_file)  # type: ignore[no-untyped-call]
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    ns = ((chosen or {}).get("context") or {}).get("namespace")
    return ns if isinstance(ns, str) else ""


def run_namespace(runs: Sequence[str], namespace: str | None, default: str) -> str:
    """-n, else the NAMESPACE of NAMESPACE/NAME runs (one namespace at a time), else the context's."""
    named = {r.split("/")[-2] for r in runs if r.count("/") in (1, 2)}
    if namespace:
        if named - {namespace}:
            raise click.UsageError(f"run(s) in namespace {', '.join(sorted(named - {namespace}))}, but -n {namespace}")
        return namespace
    if len(named) > 1:
        raise click.UsageError(f"runs in {len(named)} namespaces ({', '.join(sorted(named))}): one at a time")
    return next(iter(named), "") or default or "default"


@dataclass(frozen=True, slots=True)
class LiveOptions:
    kubeconfig: str | None
    context: str | None
    namespace: str | None
    limits: LiveLimits
    output: str
    bundles_dir: Path


@dataclass(frozen=True, slots=True)
class LiveResult:
    namespace: str
    now: datetime  # the API server's clock
    claims: list[RunClaims]  # every run of the namespace (refusals applied)
    refused: list[Refusal]
    problems: list[str]  # "skipped: ..." / "warning: ..." / "note: ..."
    skipped: bool
    environment: EnvironmentReport


def live_claims(opts: LiveOptions, runs: Sequence[str], settings: Settings) -> LiveResult:
    """Read the cluster as the kubeconfig's user and judge every run of the namespace like a dump."""
    config_file = kubeconfig_path(opts.kubeconfig)
    try:
        api = KubeApi(load_api_client(config_file, opts.context))
        namespace = run_namespace(runs, opts.namespace, context_namespace(config_file, opts.context))
    except (ConfigException, OSError) as e:
        hint = "" if config_file else " (no kubeconfig found: --kubeconfig, $KUBECONFIG or ~/.kube/config)"
        raise click.ClickException(safe_text(f"cannot configure the Kubernetes client{hint}: {e}")) from e
    except (yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise click.ClickException(safe_text(f"kubeconfig {config_file}: malformed ({type(e).__name__})")) from e
    try:
        live = read_live(api, namespace, resources_for(settings.taugrid), settings.taugrid, runs, limits=opts.limits,
                         log_regex_by_profile=dict(settings.controller.log_regex_by_profile))
    except SourceError as e:
        raise click.ClickException(safe_text(str(e))) from e
    if not api.clock.seen:
        raise click.ClickException("the API server's answers carried no Date header: no clock to evaluate on")
    now = api.clock.now()  # the API server's clock, never this machine's
    problems = [f"{'skipped' if p.skipped else 'warning'}: {p}" for p in live.dump.problems]
    problems += [f"note: {note}" for note in live.notes]
    index, _ = evidence_index(live.dump, live.synced, live.signals, settings.taugrid)
    evidence = index.all_evidence()
    claims = [evaluate_multicluster(ev, {}, now, settings.claims, slack=timedelta(0),
                                    origin=settings.controller.multikueue_origin) for ev in evidence]
    claims = with_queues(api, claims, evidence, index)
    environment = single_cluster("manager", live.dump.version, live.dump.environment_objects,
                                 settings.controller.environment_namespaces or None)
    return LiveResult(namespace, now, fail_closed(claims, live.refused), live.refused, problems,
                      any(p.skipped for p in live.dump.problems), environment)


def with_queues(api: KubeApi, claims: list[RunClaims], evidence: list[RunEvidence], index: RunIndex
                ) -> list[RunClaims]:
    """Each run blocked in queue admission with its place in the queue (Kueue's visibility API, read
    once per queue) and an admission estimate from the Workloads this reader sees."""
    workloads = Workloads(r for k in index.keys_of_kind("Workload") if (r := index.get(*k)) is not None)
    now = api.clock.now()
    read: dict[tuple[str, str, str], tuple[PendingSummary | None, str]] = {}
    out = []
    for rc, ev in zip(claims, evidence, strict=True):
        wl = pending_workload(ev) if rc.blocked is not None and rc.blocked.stage is Stage.QUEUE_ADMISSION else None
        if wl is None or not isinstance(wl.facts, WorkloadFacts):
            out.append(rc)
            continue
        key = (cluster_queue_of(ev, wl), wl.ref.namespace, wl.facts.queue_name)
        if key not in read:
            read[key] = read_pending(api, *key)
        summary, note = read[key]
        out.append(attach(rc, ev, summary, workloads, now, note=note))
    return out


def explain_live(opts: LiveOptions, runs: Sequence[str], settings: Settings) -> int:
    """`explain` live: print what `live_claims` found; returns the exit code."""
    result = live_claims(opts, runs, settings)
    for problem in result.problems:
        click.echo(safe_text(problem), err=True)
    selected = select(result.claims, runs)
    if runs and not selected:
        click.echo(safe_text(f"error: no run matches {', '.join(runs)} in namespace {result.namespace}; runs there: "
                             f"{', '.join(c.ref.name for c in result.claims) or 'none'}"), err=True)
        for r in result.refused:
            click.echo(safe_text(str(r)), err=True)
        return 2
    now = result.now
    if opts.output in ("json", "yaml"):
        write_document(document(selected, now, environment=result.environment, refused=result.refused), opts.output)
    else:
        from collector.bundlecmd import latest_bundles

        click.echo(render_text(selected, now, bundles=latest_bundles(opts.bundles_dir, selected))
                   if selected else f"no runs found in namespace {result.namespace}")
        echo_refusals(result.refused)
        click.echo(safe_text(result.environment.summary()))
    return EXIT_SKIPPED if result.refused or result.skipped else 0


# --- from the controller -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    url: str
    token_file: Path | None
    cacert: Path | None
    namespace: str | None
    output: str
    timeout_s: float = 30.0


def _fetch(opts: ControllerOptions, path: str) -> bytes:
    import ssl
    import urllib.error
    import urllib.request

    headers = {"Accept": "application/json"}
    if opts.token_file is not None:
        headers["Authorization"] = "Bearer " + opts.token_file.read_text().strip()
    context = ssl.create_default_context(cafile=str(opts.cacert)) if opts.cacert else None
    req = urllib.request.Request(opts.url.rstrip("/") + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=opts.timeout_s, context=context) as resp:  # noqa: S310 (scheme checked)
            data: bytes = resp.read(MAX_DOCUMENT_BYTES + 1)
            return data
    except urllib.error.HTTPError as e:
        body = e.read(300).decode("utf-8", "replace").strip()
        raise click.ClickException(safe_text(f"{opts.url}{path}: HTTP {e.code}: {body}")) from e
    except (urllib.error.URLError, OSError) as e:
        raise click.ClickException(safe_text(f"{opts.url}{path}: {e}")) from e


def controller_claims(opts: ControllerOptions, runs: Sequence[str],
                      ) -> tuple[datetime, list[tuple[RunClaims, list[dict[str, Any]]]]]:
    """The controller's runs (all, or RUNS given as NAMESPACE/NAME) with their history."""
    if not opts.url.startswith(("http://", "https://")):
        raise click.UsageError(f"--controller: expected an http:// or https:// URL, got {opts.url!r}")
    qualified = [r.split("/") for r in runs if r.count("/") == 1]
    for ns, name in qualified:  # checked before they become a path (and again by the controller)
        if not dns1123_label(ns) or not dns1123_subdomain(name):
            raise click.UsageError(safe_text(f"{ns}/{name}: not a Kubernetes namespace/name (DNS-1123)"))
    if opts.namespace and not dns1123_label(opts.namespace):
        raise click.UsageError(safe_text(f"{opts.namespace}: not a Kubernetes namespace (DNS-1123)"))
    all_qualified = bool(runs) and len(qualified) == len(runs)
    whole = f"/runs/{opts.namespace}" if opts.namespace else "/runs"  # the server filters: one namespace's bytes
    paths = [f"/runs/{ns}/{name}" for ns, name in qualified] if all_qualified else [whole]
    found: list[tuple[RunClaims, list[dict[str, Any]]]] = []
    now: datetime | None = None
    for path in paths:
        try:
            at, got = decode_runs(_fetch(opts, path))
        except BadDocument as e:
            raise click.ClickException(safe_text(f"{opts.url}{path}: {e}")) from e
        now = at if now is None else max(now, at)
        found += got
    assert now is not None
    if opts.namespace:
        found = [(rc, h) for rc, h in found if rc.ref.namespace == opts.namespace]
    return now, found


def explain_controller(opts: ControllerOptions, runs: Sequence[str]) -> int:
    """What the controller holds for RUNS (its claims as the alert saw them, and their history)."""
    now, found = controller_claims(opts, runs)
    history = {rc.ref.key: h for rc, h in found}
    selected = select([rc for rc, _ in found], runs)
    if runs and not selected:
        click.echo(safe_text(f"error: the controller holds no run {', '.join(runs)}"), err=True)
        return 2
    if opts.output in ("json", "yaml"):
        doc = document(selected, now)
        for rc, entry in zip(selected, doc["runs"], strict=True):
            entry["history"] = history.get(rc.ref.key, [])
        write_document(doc, opts.output)
    else:
        click.echo(render_text(selected, now) if selected else "the controller holds no runs")
        for rc in selected:
            for line in render_history(rc, history.get(rc.ref.key, [])):
                click.echo(safe_text(line))
    return 0
