"""Write one run's evidence bundle: every file redacted, hashed, listed in manifest.json.

Layout (a directory, or the same tree in a .tar.gz):

    manifest.json         run identity, claims with evidence, time range, collector version,
                          every file with its size and sha256, what is missing and why
    claims.json           the claims as `explain -o json` gives them
    objects/<Kind>/<namespace>/<name>.json   raw history of each object as observed
    events.json           the run's events, deduplicated, each with its series
    logs/<pod>/<container>[.previous].log    bounded tails; logs/scan.json what `scan` found
    series/progress.csv   progress samples; series/gpu.csv GPU samples (when an agent reports)
    xids.json             GPU XID errors found in logs and kernel logs
    artifacts/<pod>/...   profiles and dumps the run left (text redacted; pickles decoded to JSON)
    analysis/flightrec.json   hang analysis of NCCL flight-recorder dumps across ranks
    timeline.json, index.html the self-contained timeline page and its data
    REDACTIONS.md         where redaction fired and by which rule, never the value

Nothing is written before it went through the redact pass; a binary file that cannot be
redacted is left out and listed as missing.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from collector.flightrec import DumpError, FrDump, Placement, analyze, decode_dump, rank_from_name
from collector.kube import parse_time
from collector.model import CLAIM_NAMES, rfc3339
from collector.progress import scan_report, scan_text
from collector.redact import RedactionLog
from exporters.bundles.model import FORMAT, BundleInput, ClaimPoint, LogTail, Missing
from exporters.bundles.scrub import report, scrub_json, scrub_text
from exporters.bundles.timeline import render_page

MANIFEST = "manifest.json"
REDACTIONS = "REDACTIONS.md"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def collector_version() -> str:
    try:
        return metadata.version("taugrid-evidence")
    except metadata.PackageNotFoundError:
        return "unknown"


def _time(v: Any) -> datetime | None:
    if not isinstance(v, str):
        return None
    try:
        return parse_time(v)
    except ValueError:
        return None


def _safe(part: str) -> str:
    s = _SAFE.sub("_", part)[:200].lstrip(".")
    return s or "_"


def is_binary(data: bytes) -> bool:
    head = data[:8192]
    if b"\x00" in head:
        return True
    odd = sum(1 for b in head if b < 9 or 13 < b < 32)
    return bool(head) and odd / len(head) > 0.05


def json_bytes(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS) + b"\n"


class _Out:
    """Files of one bundle: size-bounded, each hashed as written."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.total = 0
        self.missing: list[Missing] = []

    def write(self, rel: str, data: bytes, what: str) -> bool:
        if self.total + len(data) > self.max_bytes:
            self.missing.append(Missing(what, f"{len(data)} bytes would pass the bundle bound of "
                                              f"{self.max_bytes} bytes; left out"))
            return False
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.total += len(data)
        return True


def file_list(root: Path) -> list[dict[str, Any]]:
    """Every regular file but the manifest, with its size and sha256 (hashed in blocks)."""
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and p != root / MANIFEST:
            h = hashlib.sha256()
            size = 0
            with p.open("rb") as fh:
                while block := fh.read(1 << 20):
                    h.update(block)
                    size += len(block)
            out.append({"path": p.relative_to(root).as_posix(), "bytes": size, "sha256": h.hexdigest()})
    return out


def _event_key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    inv = obj.get("involvedObject") or obj.get("regarding") or {}
    return (str(inv.get("kind", "")), str(inv.get("name", "")), str(obj.get("reason", "")),
            str(obj.get("message") or obj.get("note") or ""))


def _events(inp: BundleInput, log: RedactionLog) -> list[dict[str, Any]]:
    """One entry per (object, reason, message): the series (count, first, last) kept, repeats folded."""
    groups: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for ov in inp.objects:
        if ov.kind != "Event":
            continue
        for at, op, raw in ov.versions:
            if op != "upsert":
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(obj, dict):
                continue
            key = _event_key(obj)
            series = obj.get("series") or {}
            last = obj.get("lastTimestamp") or series.get("lastObservedTime") or obj.get("eventTime") \
                or (obj.get("metadata") or {}).get("creationTimestamp")
            first = obj.get("firstTimestamp") or obj.get("eventTime") or last
            count = obj.get("count") or series.get("count") or 1
            g = groups.get(key)
            if g is None:
                g = groups[key] = {"object": f"{key[0]}/{key[1]}", "reason": key[2], "message": key[3],
                                   "type": obj.get("type", ""), "first": first, "at": last, "count": 0,
                                   "series": []}
            g["first"] = min(x for x in (g["first"], first) if x) if (g["first"] or first) else None
            g["at"] = max(x for x in (g["at"], last) if x) if (g["at"] or last) else None
            g["count"] = max(int(g["count"]), int(count) if isinstance(count, int) else 1)
            point = {"observed_at": rfc3339(at), "count": count, "last": last}
            if point not in g["series"]:
                g["series"].append(point)
                del g["series"][:-32]
    out = [scrub_json(g, "events.json", log) for g in groups.values()]
    out.sort(key=lambda g: (str(g.get("at") or ""), g["object"], g["reason"]))
    return out


def _objects(out: _Out, inp: BundleInput, log: RedactionLog) -> list[datetime]:
    created: list[datetime] = []
    for ov in inp.objects:
        if ov.kind == "Event":
            continue
        rel = f"objects/{_safe(ov.kind)}/{_safe(ov.namespace or '_cluster')}/{_safe(ov.name)}.json"
        versions = []
        for at, op, raw in ov.versions:
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                obj = None
            if isinstance(obj, dict):
                (obj.get("metadata") or {}).pop("managedFields", None)
                if (t := _time((obj.get("metadata") or {}).get("creationTimestamp"))) is not None:
                    created.append(t)
            versions.append({"observed_at": rfc3339(at), "op": op, "object": scrub_json(obj, rel, log)})
        out.write(rel, json_bytes({"kind": ov.kind, "namespace": ov.namespace, "name": ov.name, "versions": versions}),
                  f"object history {ov.kind}/{ov.namespace}/{ov.name}")
    return created


def _log_name(t: LogTail) -> str:
    return f"logs/{_safe(t.pod)}/{_safe(t.container or 'default')}{'.previous' if t.previous else ''}.log"


def _logs(out: _Out, inp: BundleInput, log: RedactionLog, tail_bytes: int) -> list[dict[str, Any]]:
    scans: list[dict[str, Any]] = []
    for t in inp.logs:
        what = f"log {t.pod}/{t.container}{' (previous)' if t.previous else ''}"
        if t.data is None:
            out.missing.append(Missing(what, t.problem or "not available"))
            continue
        if not t.data:
            out.missing.append(Missing(what, "empty: the container wrote nothing"))
            continue
        data = t.data[-tail_bytes:]
        total = max(t.total_bytes or 0, len(t.data))
        if is_binary(data):
            out.missing.append(Missing(what, f"binary content ({len(data)} bytes): not kept, it cannot be redacted"))
            continue
        cut = total > len(data)
        if cut:
            nl = data.find(b"\n")
            data = data[nl + 1:] if 0 <= nl < len(data) - 1 else data
        rel = _log_name(t)
        text = scrub_text(data.decode("utf-8", "replace"), rel, log)
        if cut:
            text = f"# taugrid-evidence: last {len(data)} of {total} bytes\n" + text
            out.missing.append(Missing(f"{what}: head", f"{total - len(data)} earlier bytes past the "
                                                        f"{tail_bytes} byte tail bound"))
        out.write(rel, text.encode(), what)
        rep = scan_report(scan_text(data, source=rel))
        scans.append(scrub_json(rep, "logs/scan.json", log))
    return scans


def _progress_csv(inp: BundleInput) -> tuple[bytes, list[dict[str, Any]]]:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["ref", "source", "plane", "step", "at", "loss", "format", "skipped", "durable"])
    points = []
    for sig in inp.signals:
        for s in sig.scan.samples:
            loss = "" if s.loss is None else ("nan" if math.isnan(s.loss) else repr(s.loss))
            w.writerow([str(sig.ref), sig.source, sig.plane.value, s.step, rfc3339(s.at) or "", loss, s.format,
                        int(s.skipped), int(sig.durable)])
            if s.at is not None and not s.skipped:
                points.append({"at": rfc3339(s.at), "step": s.step,
                               "source": f"{sig.ref.name}/{sig.source}" if sig.source else sig.ref.name})
    return buf.getvalue().encode(), points


def _gpu_csv(inp: BundleInput) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["at", "node", "gpu", "utilization_percent", "power_w", "source"])
    for g in inp.gpu or ():
        w.writerow([rfc3339(g.at) or "", g.node, g.gpu, "" if g.utilization is None else g.utilization,
                    "" if g.power_w is None else g.power_w, g.source])
    return buf.getvalue().encode()


def _natural(s: str) -> list[Any]:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", s)]


def _placement(dumps: list[tuple[FrDump, str]], inp: BundleInput) -> dict[int, Placement]:
    out: dict[int, Placement] = {}
    for d, pod in dumps:
        if pod:
            out[d.rank] = Placement(pod, inp.nodes.get(pod, ""), "dump found with this pod")
    pods = sorted(inp.nodes, key=_natural)
    if pods:
        top = max(d.rank for d, _ in dumps)
        per = inp.claims.extra.get("gpus_per_worker")
        per_pod = per if isinstance(per, int) and per > 0 else max(1, math.ceil((top + 1) / len(pods)))
        for d, _ in dumps:
            if d.rank not in out and d.rank // per_pod < len(pods):
                pod = pods[d.rank // per_pod]
                out[d.rank] = Placement(pod, inp.nodes.get(pod, ""), f"inferred: rank // {per_pod} ranks per pod")
    return out


def _artifacts(out: _Out, inp: BundleInput, log: RedactionLog) -> dict[str, Any] | None:
    dumps: list[tuple[FrDump, str]] = []
    for a in inp.artifacts:
        base = f"artifacts/{_safe(a.pod or '_run')}/{_safe(a.name.rsplit('/', 1)[-1])}"
        what = f"artifact {a.pod + '/' if a.pod else ''}{a.name}"
        if rank_from_name(a.name) is not None:
            try:
                d = decode_dump(a.data, a.name)
            except DumpError as e:
                out.missing.append(Missing(what, f"flight-recorder dump not read: {e}"))
                continue
            dumps.append((d, a.pod))
            if d.format == "json":
                out.write(base, json_bytes(scrub_json(orjson.loads(a.data), base, log)), what)
            else:  # the pickle itself is never kept: what it held, as plain JSON
                plain = {"rank": d.rank, "version": d.version, "format": "decoded from pickle",
                         "pg_config": {k: {"ranks": list(v), "desc": d.pg_desc.get(k, "")}
                                       for k, v in d.pg_ranks.items()},
                         "entries": [{"record_id": e.record_id, "pg_id": e.pg_id,
                                      "process_group": [e.pg_name, e.pg_desc],
                                      "collective_seq_id": e.collective_seq_id, "p2p_seq_id": e.p2p_seq_id,
                                      "op_id": e.op_id, "profiling_name": e.profiling_name, "state": e.state,
                                      "is_p2p": e.is_p2p, "time_created_ns": e.time_created_ns,
                                      "timeout_ms": e.timeout_ms, "input_sizes": [list(s) for s in e.input_sizes],
                                      "input_dtypes": list(e.input_dtypes), "retired": e.retired}
                                     for e in d.entries]}
                out.write(base + ".decoded.json", json_bytes(scrub_json(plain, base + ".decoded.json", log)), what)
            continue
        if is_binary(a.data):
            out.missing.append(Missing(what, f"binary ({len(a.data)} bytes): not kept, it cannot be redacted"))
            continue
        if base.endswith(".json"):
            try:
                obj = orjson.loads(a.data)
            except orjson.JSONDecodeError:
                obj = None
            if obj is not None:
                out.write(base, json_bytes(scrub_json(obj, base, log)), what)
                continue
        out.write(base, scrub_text(a.data.decode("utf-8", "replace"), base, log).encode(), what)
    if not dumps:
        return None
    analysis = analyze([d for d, _ in dumps], _placement(dumps, inp)).to_json()
    scrubbed: dict[str, Any] = scrub_json(analysis, "analysis/flightrec.json", log)
    return scrubbed


def _segments(points: list[ClaimPoint], end: datetime) -> list[dict[str, Any]]:
    points = sorted(points, key=lambda p: p.at)
    segs = []
    for p, nxt in zip(points, [*points[1:], None][: len(points)], strict=True):
        segs.append({"from": rfc3339(p.at), "to": rfc3339(nxt.at if nxt else end), "observed": p.observed,
                     "verdict": p.verdict, "reason": p.reason})
    return segs


def _history(inp: BundleInput, start: datetime) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Lanes per claim from recorded transitions; without them, from each claim's `since`."""
    rc = inp.claims
    end = inp.captured_at
    lanes = []
    for name in CLAIM_NAMES:
        pts = [p for p in inp.history if p.claim == name]
        c = rc.claims[name]
        if not pts or pts[-1].observed != c.observed.value:
            at = c.since if c.since is not None and start <= c.since <= end else (pts[-1].at if pts else start)
            pts.append(ClaimPoint(at, name, c.observed.value, c.verdict.value, c.reason))
        if pts and min(p.at for p in pts) > start:
            pts.append(ClaimPoint(start, name, "", "not observed", "before the collector's first observation"))
        lanes.append({"claim": name, "segments": _segments(pts, end)})
    bpts = [p for p in inp.history if p.claim == "blocked"]
    if rc.blocked is not None and (not bpts or bpts[-1].observed != rc.blocked.stage.value):
        at = rc.blocked.since if rc.blocked.since is not None and start <= rc.blocked.since <= end else start
        bpts.append(ClaimPoint(at, "blocked", rc.blocked.stage.value, "", rc.blocked.reason))
    blocked = [{"from": s["from"], "to": s["to"], "stage": s["observed"], "reason": s["reason"]}
               for s in _segments(bpts, end) if s["observed"]]
    return lanes, blocked


def _start(inp: BundleInput, created: Iterable[datetime], events: list[dict[str, Any]],
           progress: list[dict[str, Any]]) -> datetime:
    times = list(created)
    times += [p.at for p in inp.history]
    times += [c.since for c in inp.claims.claims.values() if c.since is not None]
    for v in [e.get(k) for e in events for k in ("first", "at")] + [p.get("at") for p in progress]:
        if (t := _time(v)) is not None:
            times.append(t)
    end = inp.captured_at
    floor = end - timedelta(days=30)  # one forged timestamp cannot stretch the page to 1970
    times = [t for t in times if floor <= t <= end]
    return min(times, default=end - timedelta(minutes=10))


def write_bundle(inp: BundleInput, dest: Path, *, max_bytes: int = 256 << 20, log_tail_bytes: int = 1 << 20,
                 name: str = "") -> dict[str, Any]:
    """Write the bundle into the empty directory `dest`; returns the manifest."""
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise FileExistsError(f"{dest}: bundle directory is not empty")
    rlog = RedactionLog()
    out = _Out(dest, max_bytes)
    out.missing.extend(inp.missing)
    rc = inp.claims
    claims = scrub_json(rc.to_json(), "claims.json", rlog)
    out.write("claims.json", json_bytes(claims), "claims")
    created = _objects(out, inp, rlog)
    events = _events(inp, rlog)
    out.write("events.json", json_bytes(events), "events")
    if not any(o.kind == "Pod" for o in inp.objects):
        out.missing.append(Missing("pods", "no pod of this run was observed"))
    scans = _logs(out, inp, rlog, log_tail_bytes)
    # (`file` says who read it, an agent or the API; the signal, which pod and container)
    scans += [scrub_json({**scan_report(s.scan), "ref": str(s.ref), "container": s.source}, "logs/scan.json", rlog)
              for s in inp.signals if s.source not in ("checkpoints",) and not s.source.startswith("ray-metrics")]
    out.write("logs/scan.json", json_bytes(scans), "log scan")
    if not inp.logs:
        out.missing.append(Missing("container logs", "none captured for this run"))
    progress_csv, progress = _progress_csv(inp)
    out.write("series/progress.csv", progress_csv, "progress series")
    xids = [dict(x, source=s.get("file")) for s in scans for x in s.get("xid") or []]
    out.write("xids.json", json_bytes(xids), "XIDs")
    if inp.gpu is None:
        out.missing.append(Missing("GPU series and XIDs from NVML", "no agent: no node agent reports for this "
                                                                     "run's nodes"))
    else:
        out.write("series/gpu.csv", _gpu_csv(inp), "GPU series")
    hang = _artifacts(out, inp, rlog)
    if hang is not None:
        out.write("analysis/flightrec.json", json_bytes(hang), "flight-recorder analysis")
    start = _start(inp, created, events, progress)
    lanes, blocked = _history(inp, start)
    timeline = scrub_json({
        "run": f"{rc.ref.namespace}/{rc.ref.name}", "kind": rc.ref.kind, "captured_at": rfc3339(inp.captured_at),
        "trigger": inp.trigger, "start": rfc3339(start), "end": rfc3339(inp.captured_at),
        "claims_now": {k: {"verdict": v["verdict"], "observed": v["observed"], "reason": v["reason"]}
                       for k, v in claims["claims"].items()},
        "lanes": lanes, "blocked": blocked, "progress": progress,
        "gpu": [{"at": rfc3339(g.at), "node": g.node, "gpu": g.gpu, "utilization": g.utilization,
                 "power_w": g.power_w} for g in inp.gpu] if inp.gpu else None,
        "gpu_missing": None if inp.gpu is not None else "no agent",
        "events": [{k: e.get(k) for k in ("at", "type", "reason", "object", "message", "count")} for e in events],
        "hang": hang["summary"] if hang else None,
        "missing": [{"what": m.what, "why": m.why} for m in out.missing],
    }, "timeline.json", rlog)
    data = json_bytes(timeline)
    out.write("timeline.json", data, "timeline data")
    out.write("index.html", render_page(orjson.loads(data)).encode(), "timeline page")
    (dest / REDACTIONS).write_text(report(rlog, title=f"Redactions in {name or dest.name}",
                                          rules_note="Rules: collector/redact.py (named, linear-time patterns); "
                                                     "object fields are judged with their key in view."))
    manifest = {
        "format": FORMAT,
        "bundle": name or dest.name,
        "run": {"namespace": rc.ref.namespace, "name": rc.ref.name, "kind": rc.ref.kind, "uid": rc.ref.uid},
        "captured_at": rfc3339(inp.captured_at),
        "trigger": scrub_text(inp.trigger, MANIFEST, rlog),
        "source": scrub_text(inp.source, MANIFEST, rlog),
        "collector_version": collector_version(),
        "time_range": {"start": rfc3339(start), "end": rfc3339(inp.captured_at)},
        "claims": claims,
        "hang_analysis": hang,
        "trace_id": inp.trace_id or None,
        "missing": [{"what": scrub_text(m.what, MANIFEST, rlog), "why": scrub_text(m.why, MANIFEST, rlog)}
                    for m in out.missing],
        "redactions": [{"at": rfc3339(datetime.now(UTC)), "values": sum(rlog.entries.values())}],
        "files": file_list(dest),
    }
    (dest / MANIFEST).write_bytes(json_bytes(manifest))
    return manifest


def verify(root: Path) -> list[str]:
    """Problems with a bundle directory's hashes (empty when every listed file matches)."""
    manifest = orjson.loads((root / MANIFEST).read_bytes())
    problems = []
    for f in manifest.get("files") or []:
        p = root / f["path"]
        if not p.is_file():
            problems.append(f"{f['path']}: missing")
            continue
        data = p.read_bytes()
        if len(data) != f["bytes"] or hashlib.sha256(data).hexdigest() != f["sha256"]:
            problems.append(f"{f['path']}: size or sha256 differs from the manifest")
    return problems
