"""The notebook API (see the package docstring): the CLI's inputs and engine, DataFrames out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click

try:
    import pandas as pd
except ImportError as e:  # an extra: the controller's and agent's images leave it out
    raise ImportError("the notebook API needs pandas: pip install 'taugrid-evidence[notebook]'") from e

from collector.config import ConfigError, load_settings
from collector.explaincmd import (
    ControllerOptions,
    LiveOptions,
    NoClock,
    controller_claims,
    dump_claims,
    live_claims,
    select,
)
from collector.model import RunClaims
from collector.sources.live import MAX_LOG_BYTES, MAX_PODS, LiveLimits, Refusal

RUN_COLUMNS = ["namespace", "name", "kind", "uid", "finished", "scheduled", "running", "progressing",
               "blocked_stage", "blocked_owner", "blocked_reason", "blocked_since", "goodput_ratio",
               "allocated_s", "productive_s", "badput_s", "context", "queue_position", "admission_eta_low_s",
               "admission_eta_mid_s", "admission_eta_high_s", "admission_eta_basis"]
CLAIM_COLUMNS = ["namespace", "name", "claim", "asserted", "observed", "verdict", "since", "reason", "cause"]
EVIDENCE_COLUMNS = ["namespace", "name", "claim", "plane", "ref", "field", "value", "at"]
TRANSITION_COLUMNS = ["namespace", "name", "at", "claim", "from_observed", "from_verdict", "to_observed",
                      "to_verdict", "reason"]
REFUSED_COLUMNS = ["verb", "resource", "namespace", "message", "would_show", "claims"]


class ExplainError(RuntimeError):
    """The runs could not be explained (no cluster, a refused token, no such run, a bad dump)."""


@dataclass(frozen=True)
class Explanation:
    """What `explain` found, as DataFrames (times are UTC Timestamps; an empty frame keeps its columns)."""

    evaluated_at: datetime  # the API server's clock (live), the dump's capture time, the controller's evaluation
    runs: pd.DataFrame  # one row per run: each claim's verdict, the blocked stage, goodput so far
    claims: pd.DataFrame  # one row per run and claim
    evidence: pd.DataFrame  # the evidence behind each claim and blocked stage
    transitions: pd.DataFrame  # the controller's history of each run (explain(controller=...) only)
    refused: pd.DataFrame  # reads RBAC refused (live only): their claims are unknown
    source: str  # "live:NAMESPACE", "dump:DIR", "controller:URL"


def _ts(t: datetime | str | None) -> Any:
    return pd.Timestamp(t).tz_convert("UTC") if t is not None else pd.NaT


def _frames(claims: list[RunClaims], history: dict[tuple[str, str, str], list[dict[str, Any]]],
            refused: Sequence[Refusal]) -> dict[str, pd.DataFrame]:
    runs, rows, evidence, transitions = [], [], [], []
    for rc in claims:
        ns, name = rc.ref.namespace, rc.ref.name
        g = rc.goodput
        runs.append({
            "namespace": ns, "name": name, "kind": rc.ref.kind, "uid": rc.ref.uid, "finished": rc.finished,
            **{k: c.verdict.value for k, c in rc.claims.items()},
            "blocked_stage": rc.blocked.stage.value if rc.blocked else None,
            "blocked_owner": rc.blocked.stage.owner if rc.blocked else None,
            "blocked_reason": rc.blocked.reason if rc.blocked else None,
            "blocked_since": _ts(rc.blocked.since if rc.blocked else None),
            "goodput_ratio": g.ratio if g is not None else None,
            "allocated_s": g.allocated_s if g is not None else None,
            "productive_s": g.productive_s if g is not None else None,
            "badput_s": dict(g.badput_s) if g is not None else {},
            "context": dict(rc.extra),
            # a run waiting for quota: its place in its ClusterQueue and the estimate (never a promise)
            "queue_position": rc.queue.position_cq if rc.queue is not None else None,
            "admission_eta_low_s": rc.queue.eta.low_s if rc.queue is not None else None,
            "admission_eta_mid_s": rc.queue.eta.mid_s if rc.queue is not None else None,
            "admission_eta_high_s": rc.queue.eta.high_s if rc.queue is not None else None,
            "admission_eta_basis": rc.queue.eta.basis if rc.queue is not None else None})
        for claim_name, c in rc.claims.items():
            rows.append({"namespace": ns, "name": name, "claim": claim_name, "asserted": c.asserted,
                         "observed": c.observed.value, "verdict": c.verdict.value, "since": _ts(c.since),
                         "reason": c.reason, "cause": c.cause})
            evidence += [{"namespace": ns, "name": name, "claim": claim_name, "plane": e.plane.value, "ref": e.ref,
                          "field": e.field, "value": e.value, "at": _ts(e.at)} for e in c.evidence]
        if rc.blocked is not None:
            evidence += [{"namespace": ns, "name": name, "claim": "blocked", "plane": e.plane.value, "ref": e.ref,
                          "field": e.field, "value": e.value, "at": _ts(e.at)} for e in rc.blocked.evidence]
        for h in history.get(rc.ref.key, []):
            before, to = h.get("from"), h.get("to")
            transitions.append({
                "namespace": ns, "name": name, "at": _ts(h.get("at")), "claim": h.get("claim"),
                "from_observed": before.get("observed") if isinstance(before, dict) else before,
                "from_verdict": before.get("verdict") if isinstance(before, dict) else None,
                "to_observed": to.get("observed") if isinstance(to, dict) else to,
                "to_verdict": to.get("verdict") if isinstance(to, dict) else None,
                "reason": h.get("reason")})
    return {
        "runs": pd.DataFrame(runs, columns=RUN_COLUMNS),
        "claims": pd.DataFrame(rows, columns=CLAIM_COLUMNS),
        "evidence": pd.DataFrame(evidence, columns=EVIDENCE_COLUMNS),
        "transitions": pd.DataFrame(transitions, columns=TRANSITION_COLUMNS),
        "refused": pd.DataFrame([{**r.to_json(), "claims": list(r.claims)} for r in refused],
                                columns=REFUSED_COLUMNS),
    }


def explain(*runs: str, namespace: str | None = None, context: str | None = None, kubeconfig: str | None = None,
            from_dump: str | Path | None = None, at: datetime | None = None, controller: str | None = None,
            token_file: str | Path | None = None, cacert: str | Path | None = None,
            config: str | Path | None = None, max_pods: int = MAX_PODS,
            max_log_bytes: int = MAX_LOG_BYTES) -> Explanation:
    """Explain RUNS (NAME or NAMESPACE/NAME; every run when none): live with your kubeconfig (RBAC
    decides what is read; refusals are in `.refused`), `from_dump=` a `kubectl cluster-info dump`
    directory (`at=` its evaluation time), or `controller=` the controller's URL (`token_file=`,
    `cacert=`: its /runs token and CA; history in `.transitions`)."""
    try:
        settings = load_settings(Path(config) if config is not None else None)
        history: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        refused: list[Refusal] = []
        if controller is not None:
            now, found = controller_claims(ControllerOptions(
                controller, Path(token_file) if token_file else None, Path(cacert) if cacert else None,
                namespace, "json"), runs)
            claims, history = [rc for rc, _ in found], {rc.ref.key: h for rc, h in found}
            source = f"controller:{controller}"
        elif from_dump is not None:
            result = dump_claims(Path(from_dump), settings, at=at)
            now, claims, source = result.now, result.claims, f"dump:{from_dump}"
        else:
            live = live_claims(LiveOptions(kubeconfig, context, namespace, LiveLimits(max_pods, max_log_bytes), "json",
                                           Path("bundles")), runs, settings)
            now, claims, refused, source = live.now, live.claims, live.refused, f"live:{live.namespace}"
    except (click.ClickException, ConfigError, NoClock, OSError) as e:
        message = e.format_message() if isinstance(e, click.ClickException) else str(e)
        if isinstance(e, NoClock):
            message = f"{e}: no control-plane timestamps in the dump; pass at="
        raise ExplainError(message) from e
    selected = select(claims, runs)
    if runs and not selected:
        raise ExplainError(f"no run matches {', '.join(runs)} ({source}); runs: "
                           f"{', '.join(f'{c.ref.namespace}/{c.ref.name}' for c in claims) or 'none'}")
    frames = _frames(selected, history, refused)
    return Explanation(now, frames["runs"], frames["claims"], frames["evidence"], frames["transitions"],
                       frames["refused"], source)


def _for_people(df: pd.DataFrame) -> pd.DataFrame:
    """Floats rounded as people read them: ratios (columns named *Ratio*, *Goodput*, or every value in
    [0, 1]) to 4 places, the rest (seconds, rates) to 1."""
    out = df.copy()
    for col in out.columns:
        if not pd.api.types.is_float_dtype(out[col]):
            continue
        values = out[col].dropna()
        ratio = any(w in str(col).lower() for w in ("ratio", "goodput", "fraction")) or (
            len(values) > 0 and bool(((values >= 0) & (values <= 1)).all()))
        out[col] = out[col].round(4 if ratio else 1)
    return out


def query(name_or_file: str, *, store: str | Path | None = None, adx: str | None = None,
          database: str = "taugrid", auth: str = "azure-cli", now: datetime | None = None,
          raw: bool = False) -> pd.DataFrame:
    """A KQL query of queries/ (by name) or a file, on the embedded store (default
    $XDG_DATA_HOME/taugrid-evidence/evidence.duckdb) or on ADX (`adx=` its URI), as a DataFrame;
    floats rounded for people unless `raw`."""
    from exporters.adx.kusto import AdxSettings
    from exporters.adx.query import QueryError, default_store, resolve, run_adx, run_embedded

    try:
        kql = resolve(name_or_file).read_text()
        if adx:
            result = run_adx(kql, AdxSettings(query_uri=adx, database=database, auth=auth))
        else:
            result = run_embedded(kql, Path(store) if store is not None else default_store(), now=now)
    except (QueryError, ValueError, OSError) as e:
        raise ExplainError(f"{name_or_file}: {e}") from e
    df = pd.DataFrame.from_records(result.rows, columns=result.columns)
    return df if raw else _for_people(df)
