"""`explain`'s evaluation and output, shared by its inputs: a dump, the live cluster, the controller.

Each input gives records, when each kind was read, and log signals; one index and one claim engine
judge them (so a run explained live reads as it would from a dump of the same moment), and one
renderer writes the text or the JSON contract (docs/explain.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click
import orjson
import yaml

from collector.correlate import RunIndex, Signal, build_index
from collector.environment import single_cluster
from collector.model import ObjectRecord, Observed, Ref, RunClaims, verdict_for
from collector.multicluster import evaluate_multicluster
from collector.render import render_text, safe_text, to_json
from collector.settings import Settings
from collector.sources.kube_api import KubeApi, SourceError, load_api_client, resources_for
from collector.sources.kube_client import ConfigException
from collector.sources.live import LiveLimits, Refusal, read_live

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


def evidence_index(records: Iterable[ObjectRecord], synced: Mapping[str, datetime], signals: Iterable[Signal],
                   node_skew: Mapping[str, timedelta], contract: Any) -> tuple[RunIndex, list[Ref]]:
    """The index the claim engine reads: records, each kind's read time, node clocks, log signals."""
    index = build_index(records, contract)
    inferred = index.infer_missing_roots()
    index.synced.update(synced)
    index.node_skew.update(node_skew)  # nodes whose clocks run ahead: their stamps read earlier
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


# --- live -----------------------------------------------------------------------------------------

DEFAULT_KUBECONFIG = "~/.kube/config"


def kubeconfig_path(explicit: str | None) -> str | None:
    """kubectl's choice: --kubeconfig, else $KUBECONFIG (its first file), else ~/.kube/config; None
    (the in-cluster service account) when none of them exists."""
    if explicit:
        return explicit
    env = os.environ.get("KUBECONFIG", "")
    for candidate in [*env.split(os.pathsep), DEFAULT_KUBECONFIG]:
        if candidate and Path(candidate).expanduser().is_file():
            return str(Path(candidate).expanduser())
    return None


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


def explain_live(opts: LiveOptions, runs: Sequence[str], settings: Settings) -> int:
    """Read the cluster as the kubeconfig's user, evaluate like a dump, print; returns the exit code."""
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
    for p in live.dump.problems:
        click.echo(safe_text(f"{'skipped' if p.skipped else 'warning'}: {p}"), err=True)
    for note in live.notes:
        click.echo(safe_text(f"note: {note}"), err=True)
    index, _ = evidence_index(live.dump.records, live.synced, live.signals, live.dump.node_skew(), settings.taugrid)
    claims = [evaluate_multicluster(ev, {}, now, settings.claims, slack=timedelta(0),
                                    origin=settings.controller.multikueue_origin) for ev in index.all_evidence()]
    claims = fail_closed(claims, live.refused)
    selected = select(claims, runs)
    if runs and not selected:
        click.echo(safe_text(f"error: no run matches {', '.join(runs)} in namespace {namespace}; runs there: "
                             f"{', '.join(c.ref.name for c in claims) or 'none'}"), err=True)
        for r in live.refused:
            click.echo(safe_text(str(r)), err=True)
        return 2
    environment = single_cluster("manager", live.dump.version, live.dump.environment_objects,
                                 settings.controller.environment_namespaces or None)
    if opts.output in ("json", "yaml"):
        write_document(document(selected, now, environment=environment, refused=live.refused), opts.output)
    else:
        from collector.bundlecmd import latest_bundles

        click.echo(render_text(selected, now, bundles=latest_bundles(opts.bundles_dir, selected))
                   if selected else f"no runs found in namespace {namespace}")
        echo_refusals(live.refused)
        click.echo(safe_text(environment.summary()))
    return EXIT_SKIPPED if live.refused or any(p.skipped for p in live.dump.problems) else 0
