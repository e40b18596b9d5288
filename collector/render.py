"""Human and machine renderings of `RunClaims` (the `explain` output).

This is the output boundary for tenant text (docs/security.md): every string of the JSON and
every line of the text goes through `redact` (secrets quoted in event, condition and waiting
messages), and text for a terminal has its control characters escaped, so a message cannot
set a window title, plant a hyperlink, or rewrite an earlier line with `\r` or backspaces.
Nothing here is markup: the text is printed as is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import orjson

from collector.claims.common import human_age
from collector.model import Claim, Observed, RunClaims, rfc3339
from collector.queuefacts import QueueStatus
from collector.redact import redact

# C0 and C1 controls, DEL, and the Unicode bidi overrides/isolates ("Trojan Source") and
# line/paragraph separators that reorder or break a terminal line.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    return {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(c) or (
        f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escape_control(text: str) -> str:
    """Control characters as visible escapes (`\\x1b`, `\\r`, `\\u202e`); other text unchanged."""
    return _CONTROL.sub(_escape, text)


def safe_text(text: str) -> str:
    """One line of tenant-influenced text made fit for a terminal: redacted, controls escaped."""
    return escape_control(redact(text))


def redact_json(value: Any) -> Any:
    """Every string in a JSON-able value redacted (JSON encoders escape control characters)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(v) for v in value]
    return value


def to_json(claims: Iterable[RunClaims], evaluated_at: datetime) -> dict[str, Any]:
    return {"evaluated_at": rfc3339(evaluated_at), "runs": [_run_json(c) for c in claims]}


def _run_json(rc: RunClaims) -> dict[str, Any]:
    """One run's entry; a run whose entry JSON cannot hold (a step past 64 bits in a tenant's log)
    is an error entry naming it, and the rest of the document stands."""
    try:
        doc = redact_json(rc.to_json())
        orjson.dumps(doc)
    except (TypeError, ValueError) as e:  # orjson.JSONEncodeError is a TypeError
        return {"namespace": rc.ref.namespace, "name": rc.ref.name, "kind": rc.ref.kind, "uid": rc.ref.uid,
                "error": redact(f"this run's claims could not be written as JSON: {str(e)[:200]}")}
    return doc  # type: ignore[no-any-return]


def _headline(rc: RunClaims) -> str:
    ctx = rc.extra
    bits = [rc.ref.kind]
    if "queue" in ctx:
        q = f"queue {ctx['queue']}"
        if "cluster_queue" in ctx:
            q += f" → {ctx['cluster_queue']}"
        bits.append(q)
    if "workers" in ctx:
        w = f"{ctx['workers']} workers"
        if "gpus_per_worker" in ctx:
            w += f" × {ctx['gpus_per_worker']} GPUs"
        bits.append(w)
    elif "expected_pods" in ctx:
        bits.append(f"{ctx['expected_pods']} pods expected")
    if rc.finished:
        bits.append("finished")
    return f"{rc.ref.namespace}/{rc.ref.name}   " + " · ".join(bits)


def _verdict_word(name: str, c: Claim) -> str:
    if name == "progressing" and c.observed is Observed.FALSE and c.cause == "stalled":
        return "STALLED"
    return c.verdict.value


def render_text(claims: Iterable[RunClaims], now: datetime, *, evidence: int = 2,
                bundles: Mapping[tuple[str, str, str], str] | None = None) -> str:
    out: list[str] = []
    for rc in claims:
        out.append(_headline(rc))
        for name, c in rc.claims.items():
            age = f" for {human_age(now - c.since)}" if c.since is not None and c.since <= now else ""
            observed = f"(observed {c.observed.value}{age}, status says {_asserted(c.asserted)})"
            out.append(f"  {name:<13} {_verdict_word(name, c):<13} {c.reason}")
            out.append(f"  {'':<13} {'':<13} {observed}")
            for e in c.evidence[1 : 1 + evidence]:
                at = f" @ {rfc3339(e.at)}" if e.at else ""
                where = f"[{e.cluster}] " if e.cluster else ""
                out.append(f"  {'':<13} {'':<13} · {e.plane.value}: {where}{e.ref} {e.field} = {e.value}{at}")
        if rc.goodput is not None and rc.goodput.allocated_s > 0:
            g = rc.goodput
            ratio = f"{g.ratio:.0%}" if g.ratio is not None else "unknown"
            queued = g.badput_s.get("queued", 0.0)
            parts = [f"queued {human_age(timedelta(seconds=queued))}"] if queued >= 1 else []
            parts.append(f"productive {human_age(timedelta(seconds=g.productive_s))}")
            parts += [f"{k} {human_age(timedelta(seconds=v))}" for k, v in g.badput_s.items()
                      if v >= 1 and k != "queued"]
            out.append(f"  {'goodput':<13} {ratio:<13} {' · '.join(parts)}")
        st = rc.stragglers
        if st is not None and (st.suspects or st.untrusted):
            for x in st.suspects:
                who = f"GPU {x.gpu}" if x.kind == "gpu" else f"rank {x.rank}"
                since = f" since {rfc3339(x.since)}" if x.since is not None else ""
                out.append(f"  {'straggler':<13} {who:<13} {x.lag_ratio:.0%} slower per step ({x.basis}){since}")
                out.append(f"  {'':<13} {'':<13} {x.evidence}")
            for u in st.untrusted:
                out.append(f"  {'telemetry':<13} {'untrusted':<13} {u}")
        out += work_at_risk_lines(rc)
        if rc.energy is not None:  # energy per step from the GPUs' energy counters (issue 28)
            en = rc.energy
            value = f"{en.joules_per_step:,.0f} J/step" if en.joules_per_step is not None else "unknown"
            out.append(f"  {'energy':<13} {value:<13} {en.reason}")
        if rc.blocked is not None:
            b = rc.blocked
            age = f" for {human_age(now - b.since)}" if b.since is not None and b.since <= now else ""
            out.append(f"  {'blocked':<13} {b.stage.value} (owner: {b.stage.owner}){age}")
            out.append(f"  {'':<13} {b.reason}")
            for e in b.evidence[:evidence + 1]:
                at = f" @ {rfc3339(e.at)}" if e.at else ""
                where = f"[{e.cluster}] " if e.cluster else ""
                out.append(f"  {'':<13} · {e.plane.value}: {where}{e.ref} {e.field} = {e.value}{at}")
        if rc.queue is not None:
            out += queue_lines(rc.queue)
        if bundles and rc.ref.key in bundles:
            out.append(f"  {'evidence':<13} {bundles[rc.ref.key]}")
        out.append("")
    return "\n".join(safe_text(line) for line in out)


def work_at_risk_lines(rc: RunClaims, nodes: int = 3) -> list[str]:
    """GPU-hours a failure now would lose, and the riskiest nodes under the run (those with a signal)."""
    w = rc.work_at_risk
    if w is None:
        return []
    value = f"{w.gpu_hours:.1f} GPU-h" if w.gpu_hours is not None else "unknown"
    out = [f"  {'work at risk':<13} {value:<13} {w.reason.split(': ', 1)[-1] if w.gpu_hours is not None else w.reason}"]
    risky = [n for n in w.nodes if n.score > 0]
    for n in risky[:nodes]:
        at = f", {n.gpu_hours:.1f} GPU-h at risk there" if n.gpu_hours is not None else ""
        out.append(f"  {'':<13} {'':<13} node {n.node} drain risk {n.score:.0f} ({n.gpus} GPUs{at}): "
                   + "; ".join(n.reasons))
    if len(risky) > nodes:
        out.append(f"  {'':<13} {'':<13} … {len(risky) - nodes} more risky nodes")
    return out


def queue_lines(q: QueueStatus) -> list[str]:
    """A queued run's place in its queue, for people."""
    pad = f"  {'':<13}"
    if q.position_cq is None:
        out = [f"  {'queue':<13} ClusterQueue {q.cluster_queue or '?'}: position unknown ({q.source})"]
    else:
        total = f" of {q.pending_cq}" if q.pending_cq is not None else ""
        out = [f"  {'queue':<13} position {q.position_cq + 1}{total} in ClusterQueue {q.cluster_queue}, "
               f"{q.position_lq + 1 if q.position_lq is not None else '?'} in LocalQueue {q.local_queue}"]
    for a in q.ahead:
        reqs = ", ".join(f"{k} {_amount(v)}" for k, v in a.requests if k in _SHOWN) or "requests not observed"
        out.append(f"{pad} ahead: {a.namespace}/{a.name} (priority {a.priority}): {reqs}")
    if q.position_cq is not None and q.position_cq > len(q.ahead):
        out.append(f"{pad} ahead: … {q.position_cq - len(q.ahead)} more")
    for sh in q.short:
        out.append(f"{pad} quota not free: {sh.resource} in flavor {sh.flavor}: needs {_amount(sh.needed)}, "
                   f"{_amount(sh.free)} of {_amount(sh.nominal)} free ({_amount(sh.short)} short)")
    e = q.eta
    if e.known and e.low_s is not None and e.mid_s is not None and e.high_s is not None:
        band = f"{human_age(timedelta(seconds=e.low_s))}–{human_age(timedelta(seconds=e.high_s))}"
        out.append(f"  {'admission':<13} estimated in {band} ({round(e.level * 100)}% band, median "
                   f"{human_age(timedelta(seconds=e.mid_s))})")
        out.append(f"{pad} {e.basis}")
    else:
        out.append(f"  {'admission':<13} estimate unknown: {e.basis.removeprefix('unknown: ')}")
    return out


_SHOWN = ("nvidia.com/gpu", "amd.com/gpu", "cpu", "memory", "google.com/tpu")


def _amount(v: float) -> str:
    if v >= 2 ** 30 and v % 2 ** 30 == 0:
        return f"{v / 2 ** 30:.0f}Gi"
    return f"{v:g}"


def _asserted(a: bool | None) -> str:
    return {True: "true", False: "false", None: "nothing"}[a]


def render_scan(rep: dict[str, Any]) -> str:
    """One `scan` report for humans."""
    out = [str(rep["file"])]
    prog = rep.get("progress")
    if prog:
        loss = prog.get("last_loss")
        bad = " · NON-FINITE LOSS seen" if prog.get("nonfinite_loss") else ""
        out.append(f"  progress  {prog['format']}: {prog['samples']} steps, {prog['first_step']} → {prog['last_step']}"
                   f", last loss {loss}{bad}")
    else:
        out.append("  progress  none found")
    for h in rep.get("hang") or []:
        detail = " ".join(x for x in (h.get("collective") or "", f"timeout {h['timeout_ms']} ms"
                                      if h.get("timeout_ms") else "") if x)
        out.append(f"  hang      line {h['line']}: {h['kind']} {detail}".rstrip())
    for x in rep.get("xid") or []:
        out.append(f"  xid {x['code']:<5} line {x['line']} PCI {x['pci']}: {x['meaning']} → {x['action']}")
    return "\n".join(safe_text(line) for line in out)
