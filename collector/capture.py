"""Evidence capture at the edge: assemble a run's bundle from a dump directory or from the live controller.

`bundle_from_dump` reads a `kubectl cluster-info dump` directory (read-only, regular files only,
bounded sizes). `EvidenceCapture` is the controller's hook: it keeps the raw object history
(bounded), notices when a run needs its evidence kept — a claim turns contradicted, progress
stalls, the run fails, its pods are being deleted or its node is cordoned — and writes a bundle
in its own thread, rate-limited, bounded in size and once per incident.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import shutil
import stat
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import yaml

from collector.claims import evaluate
from collector.correlate import RunEvidence, build_index
from collector.kube import MalformedObject, normalize
from collector.model import (
    JobFacts,
    NodeFacts,
    Observed,
    PodFacts,
    RayJobFacts,
    Ref,
    RunClaims,
    TauRunFacts,
    Verdict,
)
from collector.safeload import MAX_OBJECT_BYTES, UnsafeInput, check_size, documents
from collector.settings import BundleSettings, Settings
from collector.sources.dump import load_dump
from collector.sources.kube_api import LogApi, SourceError, pod_log_path
from exporters.bundles.history import Key, ObjectHistory
from exporters.bundles.model import (
    Artifact,
    BundleInput,
    ClaimPoint,
    GpuSample,
    LogTail,
    Missing,
    ObjectVersions,
    bundle_name,
)
from exporters.bundles.storage import BlobStore, BundleStore, LocalStore, StoreError, apply_retention
from exporters.bundles.writer import write_bundle

log = logging.getLogger("taugrid.capture")

ARTIFACT_NAMES = re.compile(r"^(nccl_trace_rank_\d+(\.json|\.pkl)?|.*\.pt\.trace\.json|.*py-?spy.*\.(txt|json)|"
                            r".*\.(json|txt|log))$")
MAX_ARTIFACT_BYTES = 32 << 20
MAX_ARTIFACTS = 256


class CaptureError(RuntimeError):
    pass


def _regular(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def _tail(p: Path, limit: int) -> tuple[bytes, int]:
    size = p.stat().st_size
    with p.open("rb") as fh:
        if size > limit:
            fh.seek(size - limit)
        return fh.read(limit), size


def member_keys(ev: RunEvidence) -> set[Key]:
    recs = [ev.root, *ev.pods, *ev.workloads, *ev.jobs, *ev.rayjobs, *ev.rayclusters, *ev.events]
    recs += [r for r in (ev.taurun, ev.local_queue, ev.cluster_queue, ev.workspace) if r is not None]
    recs += list(ev.nodes.values())
    return {r.ref.key for r in recs}


def _pod_nodes(ev: RunEvidence) -> dict[str, str]:
    return {p.ref.name: p.facts.node_name for p in ev.pods if isinstance(p.facts, PodFacts)}


def _dump_object_files(root: Path) -> Iterator[Path]:
    """The object files of a dump that `load_dump` reads: regular files, walked without following a
    symbolic link; a linked file is read only when it resolves inside the dump."""
    real_root = os.path.realpath(root)
    for top, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            p = Path(top, name)
            if p.suffix not in (".json", ".yaml", ".yml"):
                continue
            if p.is_symlink():
                target = os.path.realpath(p)
                if os.path.commonpath([real_root, target]) != real_root:
                    continue
            if p.is_file():
                yield p


def _read_object_file(path: Path) -> bytes:
    """A dump file, still regular when opened (never a FIFO swapped in), within the one size cap."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeInput("not a regular file")
        check_size(st.st_size, MAX_OBJECT_BYTES, "one dump file")
        return fh.read(MAX_OBJECT_BYTES + 1)


def _raw_objects(root: Path, keys: set[Key], settings: Settings) -> Iterator[tuple[Key, dict[str, Any]]]:
    """The raw objects of a dump whose keys are wanted, parsed by the same safe loader as `load_dump`
    (no YAML aliases, the same size cap): a file it refused is refused here too."""
    for path in _dump_object_files(root):
        docs: list[Any] = []
        try:
            for doc in documents(_read_object_file(path), path.suffix):
                docs.append(doc)
        except (OSError, ValueError, UnsafeInput, yaml.YAMLError, RecursionError):
            pass  # load_dump already named the bad file; the documents before the problem are kept
        for doc in docs:
            items: list[Any] = doc["items"] if isinstance(doc, dict) and isinstance(doc.get("items"), list) else (
                doc if isinstance(doc, list) else [doc])
            item_kind = str(doc.get("kind", ""))[:-4] if isinstance(doc, dict) and str(doc.get("kind", "")).endswith(
                "List") and doc.get("kind") != "List" else ""
            for obj in items:
                if not isinstance(obj, dict):
                    continue
                if item_kind and "kind" not in obj:
                    obj = {**obj, "kind": item_kind, "apiVersion": doc.get("apiVersion", "v1")}
                try:
                    rec = normalize(obj, settings.taugrid, where=path.name).record
                except MalformedObject:
                    continue
                if rec is not None and rec.ref.key in keys:
                    yield rec.ref.key, obj


def _pod_dir(dump_dir: Path, namespace: str, pod: str) -> Path | None:
    """`<dump>/<namespace>/<pod>` when reaching it follows no symbolic link and stays in the dump, else None."""
    d = dump_dir / namespace / pod
    real = os.path.realpath(d)
    if Path(namespace).name != namespace or Path(pod).name != pod or pod in ("", ".", "..") or \
            real != os.path.join(os.path.realpath(dump_dir), namespace, pod):
        return None
    return d


def _select(claims: list[RunClaims], run: str) -> RunClaims:
    found = [rc for rc in claims if run in (rc.ref.name, f"{rc.ref.namespace}/{rc.ref.name}",
                                            f"{rc.ref.kind}/{rc.ref.namespace}/{rc.ref.name}")]
    if not found:
        names = ", ".join(f"{c.ref.namespace}/{c.ref.name}" for c in claims) or "none"
        raise CaptureError(f"no run matches {run}; runs: {names}")
    if len(found) > 1:
        raise CaptureError(f"{run} is ambiguous: {', '.join(f'{c.ref.namespace}/{c.ref.name}' for c in found)}")
    return found[0]


def _artifacts_in(d: Path, pod: str, out: list[Artifact], missing: list[Missing]) -> None:
    if not d.is_dir():
        return
    for p in sorted(d.rglob("*")):
        if not _regular(p) or p.name in ("logs.txt",) or p.name.endswith("-previous.txt"):
            continue
        if not ARTIFACT_NAMES.match(p.name):
            continue
        if len(out) >= MAX_ARTIFACTS:
            missing.append(Missing(f"artifacts under {d.name}", f"more than {MAX_ARTIFACTS} files; the rest left out"))
            return
        size = p.stat().st_size
        if size > MAX_ARTIFACT_BYTES:
            missing.append(Missing(f"artifact {p.name}", f"{size} bytes, over the {MAX_ARTIFACT_BYTES} byte bound"))
            continue
        out.append(Artifact(p.relative_to(d).as_posix(), p.read_bytes(), pod))


def bundle_from_dump(dump_dir: Path, run: str, settings: Settings, *, at: datetime | None = None,
                     artifacts_dir: Path | None = None) -> BundleInput:
    """Everything a dump holds about one run, as a BundleInput; raises CaptureError for a bad run name."""
    cfg = settings.bundles
    dump = load_dump(dump_dir, settings.taugrid)
    clock = dump.clock()
    now = at or clock.at
    if now is None:
        raise CaptureError(f"{dump_dir}: no control-plane timestamps in the dump; pass --at")
    index = build_index(dump.records)
    taken = clock.taken(at) or now
    index.synced.update(dict.fromkeys(dump.snapshot_kinds(), taken))
    dump.place_clocks(index)
    for sig in dump.signals(taken):
        index.set_signal(sig)
    evidence = {ev.root.ref.key: ev for ev in index.all_evidence()}
    slack = timedelta(0) if at is not None else clock.slack
    rc = _select([evaluate(ev, now, settings.claims, slack=slack) for ev in evidence.values()], run)
    ev = evidence[rc.ref.key]
    keys = member_keys(ev)
    raw: dict[Key, list[tuple[datetime | None, str, bytes]]] = {}
    for key, obj in _raw_objects(dump_dir, keys, settings):
        raw.setdefault(key, []).append((taken, "upsert", orjson.dumps(obj)))
    objects = tuple(ObjectVersions(k[0], k[1], k[2], tuple(v)) for k, v in sorted(raw.items()))
    missing = [Missing(f"dump file {p.path}", p.message) for p in dump.problems if p.skipped]
    logs: list[LogTail] = []
    artifacts: list[Artifact] = []
    ns = rc.ref.namespace
    for pod in ev.pods:
        d = _pod_dir(dump_dir, ns, pod.ref.name)
        if d is None:
            logs.append(LogTail(pod.ref.name, "all containers", False, None,
                                problem="its directory in the dump is a symbolic link or lies outside the dump; "
                                        "not read"))
            continue
        cur = d / "logs.txt"
        if _regular(cur):
            data, size = _tail(cur, cfg.log_tail_bytes)
            logs.append(LogTail(pod.ref.name, "all containers", False, data, size))
        else:
            logs.append(LogTail(pod.ref.name, "all containers", False, None, problem="no logs.txt in the dump"))
        if d.is_dir():
            for prev in sorted(d.glob("*-previous.txt")):
                if _regular(prev):
                    data, size = _tail(prev, cfg.log_tail_bytes)
                    logs.append(LogTail(pod.ref.name, prev.name[: -len("-previous.txt")], True, data, size))
        _artifacts_in(d, pod.ref.name, artifacts, missing)
    if artifacts_dir is not None:
        pods = {p.ref.name for p in ev.pods}
        for sub in sorted(artifacts_dir.iterdir()) if artifacts_dir.is_dir() else []:
            if sub.is_dir() and not sub.is_symlink() and sub.name in pods:
                _artifacts_in(sub, sub.name, artifacts, missing)
        before = len(artifacts)
        _artifacts_in_top(artifacts_dir, artifacts, missing)
        if len(artifacts) == before and not any(a.pod for a in artifacts):
            missing.append(Missing("profiles and dumps", f"none found in {artifacts_dir}"))
    pod_keys = {p.ref.key for p in ev.pods}
    signals = tuple(s for s in ev.signals if s.ref.key in pod_keys or s.ref.key == rc.ref.key)
    return BundleInput(claims=rc, captured_at=now, trigger="on demand", source=f"dump {dump_dir.name}",
                       objects=objects, logs=tuple(logs), signals=signals, gpu=None, artifacts=tuple(artifacts),
                       nodes=_pod_nodes(ev), missing=tuple(missing))


def _artifacts_in_top(d: Path, out: list[Artifact], missing: list[Missing]) -> None:
    for p in sorted(d.iterdir()):
        if _regular(p) and ARTIFACT_NAMES.match(p.name):
            size = p.stat().st_size
            if size > MAX_ARTIFACT_BYTES:
                missing.append(Missing(f"artifact {p.name}", f"{size} bytes, over the {MAX_ARTIFACT_BYTES} byte bound"))
            elif len(out) < MAX_ARTIFACTS:
                out.append(Artifact(p.name, p.read_bytes(), ""))


def store_for(cfg: BundleSettings, credential: Any = None) -> BundleStore:
    if cfg.blob_account_url:
        return BlobStore(cfg.blob_account_url, cfg.blob_container, prefix=cfg.blob_prefix, credential=credential,
                         tarball=cfg.tarball)
    return LocalStore(Path(cfg.directory or "bundles"), tarball=cfg.tarball)


def save(inp: BundleInput, cfg: BundleSettings, store: BundleStore | None, staging: Path, *,
         now: datetime | None = None, name: str = "") -> tuple[str, dict[str, Any]]:
    """Write the bundle under staging, put it in the store (local copy kept when the store fails)."""
    name = name or bundle_name(inp.claims.ref.namespace, inp.claims.ref.name, inp.captured_at)
    local = staging / name
    if local.exists():
        shutil.rmtree(local)
    manifest = write_bundle(inp, local, max_bytes=cfg.max_bundle_bytes, log_tail_bytes=cfg.log_tail_bytes, name=name)
    if store is None:
        return str(local), manifest
    try:
        where = store.put(local, name)
    except (StoreError, OSError) as e:
        # The bundle stays where it was written; the manifest says why it is not in the store.
        fallback = LocalStore(Path(cfg.directory or "bundles"), tarball=False)
        extra = replace(inp, missing=(*inp.missing, Missing("upload to the bundle store",
                                                            f"{e}; kept locally instead")))
        shutil.rmtree(local)
        manifest = write_bundle(extra, local, max_bytes=cfg.max_bundle_bytes, log_tail_bytes=cfg.log_tail_bytes,
                                name=name)
        where = fallback.put(local, name)
        log.warning("bundle store failed; kept locally", extra={"bundle": name, "error": str(e)})
        return where, manifest
    if local.exists() and Path(where).resolve() != local.resolve():
        shutil.rmtree(local)
    if now is not None:
        try:
            apply_retention(store, now, max_age=cfg.max_age, max_total_bytes=cfg.max_total_bytes)
        except (StoreError, OSError) as e:
            log.warning("retention failed", extra={"error": str(e)})
    return where, manifest


# --- the live hook ------------------------------------------------------------------------------


@dataclass(slots=True)
class _RunState:
    verdicts: dict[str, str] = field(default_factory=dict)
    observed: dict[str, str] = field(default_factory=dict)
    blocked: str = ""
    pods: set[str] = field(default_factory=set)
    deleting: set[str] = field(default_factory=set)
    cordoned: set[str] = field(default_factory=set)
    finished: bool = False
    points: deque[ClaimPoint] = field(default_factory=lambda: deque(maxlen=256))


@dataclass(frozen=True, slots=True)
class _Job:
    rc: RunClaims
    ev: RunEvidence
    trigger: str
    history: tuple[ClaimPoint, ...]
    gone_pods: frozenset[str]
    done: threading.Event | None = None


def _failed(ev: RunEvidence, rc: RunClaims) -> bool:
    if not rc.finished:
        return False
    t = ev.taurun.facts if ev.taurun is not None else None
    if isinstance(t, TauRunFacts) and t.phase == "Failed":
        return True
    for rj in ev.rayjobs:
        if isinstance(rj.facts, RayJobFacts) and (rj.facts.job_status == "FAILED"
                                                  or rj.facts.deployment_status == "Failed"):
            return True
    return any(isinstance(j.facts, JobFacts) and (j.facts.failed or 0) > 0 and not j.facts.succeeded for j in ev.jobs)


class EvidenceCapture:
    """The controller's evidence hook: raw history in, bundles out when evidence is about to matter or vanish."""

    def __init__(self, cfg: BundleSettings, api: LogApi | None, now: Callable[[], datetime], *,
                 store: BundleStore | None = None, tracer: Any = None) -> None:
        self.cfg = cfg
        self.api = api
        self.now = now
        self.history = ObjectHistory(max_bytes=cfg.history_max_bytes, versions=cfg.history_versions)
        self.store = store if store is not None else store_for(cfg)
        self.staging = Path(cfg.directory or "bundles") / ".staging"
        self.tracer = tracer
        self.runs: dict[Key, _RunState] = {}
        self.incidents: OrderedDict[tuple[Key, str], None] = OrderedDict()
        self.last_capture: dict[Key, datetime] = {}
        self.recent: deque[datetime] = deque()
        self.written: list[str] = []  # locations, newest last (bounded)
        self.skipped = 0
        self.requested: dict[Key, threading.Event] = {}
        self.auto = True  # capture on triggers (False: traces only)
        self._names: dict[str, int] = {}
        self._jobs: queue.Queue[_Job] = queue.Queue(maxsize=4)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        self._thread = threading.Thread(target=self._work, name="evidence-capture", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self.tracer is not None:
            self.tracer.close()

    # reflector threads
    def observe(self, ref: Ref, obj: Any) -> None:
        self.history.record(ref.key, obj, self.now())

    def observe_deleted(self, ref: Ref, obj: Any) -> None:
        self.history.deleted(ref.key, obj, self.now())

    # the controller loop
    def request(self, ref: Ref) -> threading.Event:
        """Capture this run at its next evaluation (on demand); the event is set when written."""
        done = threading.Event()
        self.requested[ref.key] = done
        return done

    def evaluated(self, ev: RunEvidence, rc: RunClaims, now: datetime) -> None:
        if self.tracer is not None:
            try:
                self.tracer.update(rc, now)
            except Exception:  # traces are best effort; claims and bundles go on
                log.exception("trace update failed")
        key = rc.ref.key
        st = self.runs.get(key)
        first = st is None
        if st is None:
            st = self.runs[key] = _RunState()
        triggers = []
        for name, c in rc.claims.items():
            v, o = c.verdict.value, c.observed.value
            if st.observed.get(name) != o or st.verdicts.get(name) != v:
                st.points.append(ClaimPoint(now if not first or c.since is None else c.since, name, o, v, c.reason))
            if c.verdict is Verdict.CONTRADICTED and st.verdicts.get(name) != v:
                triggers.append((f"{name} contradicted", c.since))
            elif name == "progressing" and c.observed is Observed.FALSE and st.observed.get(name) != o:
                triggers.append(("progressing stalled", c.since))
            st.verdicts[name], st.observed[name] = v, o
        stage = rc.blocked.stage.value if rc.blocked is not None else ""
        if stage != st.blocked:
            st.points.append(ClaimPoint(now, "blocked", stage, "", rc.blocked.reason if rc.blocked else ""))
            st.blocked = stage
        # A run already finished when first seen (a controller restart) is history, not an incident.
        if _failed(ev, rc) and not st.finished and not first:
            triggers.append(("run failed", None))
        st.finished = rc.finished
        pods = {p.ref.name for p in ev.pods}
        deleting = {p.ref.name for p in ev.pods if isinstance(p.facts, PodFacts) and p.facts.deleting}
        cordoned = {n for n, rec in ev.nodes.items() if isinstance(rec.facts, NodeFacts) and rec.facts.unschedulable}
        gone = st.pods - pods
        if not rc.finished:
            if deleting - st.deleting:
                triggers.append((f"pods being deleted: {', '.join(sorted(deleting - st.deleting)[:5])}", None))
            if gone:
                triggers.append((f"pods deleted: {', '.join(sorted(gone)[:5])}", None))
            if cordoned - st.cordoned:
                triggers.append((f"node cordoned: {', '.join(sorted(cordoned - st.cordoned)[:5])}", None))
        st.pods |= pods
        del_keep = sorted(st.pods)[-512:]
        st.pods = set(del_keep)
        st.deleting, st.cordoned = deleting, cordoned
        done = self.requested.pop(key, None)
        if done is not None:
            self._enqueue(_Job(rc, ev, "on demand", tuple(st.points), frozenset(gone), done))
            return
        fresh = []
        for trigger, since in triggers if self.auto else ():
            incident = (key, f"{trigger.split(':')[0]}@{since.isoformat() if since else ''}")
            if incident in self.incidents:
                continue
            self.incidents[incident] = None
            fresh.append(trigger)
        while len(self.incidents) > 10_000:
            self.incidents.popitem(last=False)
        if not fresh:
            return
        if not self._allowed(key, now):
            self.skipped += 1
            log.info("capture rate-limited", extra={"run": str(rc.ref), "trigger": "; ".join(fresh)})
            return
        # One bundle covers every incident that fired with this evaluation.
        self._enqueue(_Job(rc, ev, "; ".join(fresh), tuple(st.points), frozenset(gone)))

    def forget(self, key: Key, now: datetime) -> None:
        """The run is gone from the cluster: its trace ends; its raw history ages out of the recorder."""
        self.runs.pop(key, None)
        self.last_capture.pop(key, None)
        if self.tracer is not None:
            self.tracer.forget(key, now)

    def _allowed(self, key: Key, now: datetime) -> bool:
        last = self.last_capture.get(key)
        if last is not None and now - last < self.cfg.min_interval_per_run:
            return False
        while self.recent and now - self.recent[0] > timedelta(hours=1):
            self.recent.popleft()
        if len(self.recent) >= self.cfg.max_per_hour:
            return False
        self.last_capture[key] = now
        self.recent.append(now)
        return True

    def _enqueue(self, job: _Job) -> None:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self.skipped += 1
            log.warning("capture queue full; bundle skipped", extra={"run": str(job.rc.ref)})

    # the capture thread
    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                inp = self.build(job)
                name = bundle_name(inp.claims.ref.namespace, inp.claims.ref.name, inp.captured_at)
                n = self._names.get(name, 0)
                self._names[name] = n + 1
                if len(self._names) > 10_000:
                    self._names.clear()
                if n:  # a second capture of the same run within one second
                    name = f"{name}-{n + 1}"
                where, _ = save(inp, self.cfg, self.store, self.staging, now=self.now(), name=name)
                self.written.append(where)
                del self.written[:-100]
                log.info("bundle written", extra={"run": str(job.rc.ref), "trigger": job.trigger, "where": where})
            except Exception:  # one bad capture never stops the next
                log.exception("bundle capture failed", extra={"run": str(job.rc.ref)})
            finally:
                if job.done is not None:
                    job.done.set()

    def _log(self, pod: str, ns: str, container: str, previous: bool) -> LogTail:
        if self.api is None:
            return LogTail(pod, container, previous, None, problem="no API to read logs from")
        query: list[tuple[str, Any]] = [("container", container), ("limitBytes", self.cfg.log_tail_bytes + 1),
                                        ("timestamps", "true")]
        if previous:
            query.append(("previous", "true"))
        path = pod_log_path(ns, pod)
        try:
            data = self.api.get_text(path, query)
        except SourceError as e:
            return LogTail(pod, container, previous, None, problem=f"not readable: {str(e)[:300]}")
        if len(data) > self.cfg.log_tail_bytes:
            # limitBytes keeps the head; the tail is what explains the end, so ask for lines from the end.
            try:
                tail = [*query[:1], ("tailLines", 20_000), *query[2:]]
                data = self.api.get_text(path, tail)[-self.cfg.log_tail_bytes:]
            except SourceError:
                data = data[: self.cfg.log_tail_bytes]
            return LogTail(pod, container, previous, data, total_bytes=self.cfg.log_tail_bytes + 1)
        return LogTail(pod, container, previous, data)

    def build(self, job: _Job) -> BundleInput:
        ev, rc = job.ev, job.rc
        ns = rc.ref.namespace
        keys = member_keys(ev) | {("Pod", ns, p) for p in job.gone_pods}
        keys |= self.history.keys_where(ns, {k[2] for k in keys})
        objects = self.history.get(keys)
        logs: list[LogTail] = []
        for pod in ev.pods:
            pf = pod.facts
            if not isinstance(pf, PodFacts) or not pf.node_name:
                continue
            for c in pf.containers:
                if c.state in ("running", "terminated"):
                    logs.append(self._log(pod.ref.name, ns, c.name, False))
                if c.restart_count > 0:
                    logs.append(self._log(pod.ref.name, ns, c.name, True))
        for p in sorted(job.gone_pods):
            logs.append(LogTail(p, "*", False, None, problem="pod deleted before capture; its logs went with it"))
        gpu: tuple[GpuSample, ...] | None = None
        readings = [(name, r) for name, r in sorted(ev.ray.items()) if r.gpus and r.gpu_utilization is not None]
        if readings:
            gpu = tuple(GpuSample(r.read_at, f"raycluster/{name}", f"mean of {r.gpus}", r.gpu_utilization,
                                  r.gpu_power_w, "ray-metrics (NVML via Ray)") for name, r in readings)
        missing: list[Missing] = []
        if not objects:
            missing.append(Missing("raw objects", "none recorded yet for this run"))
        artifacts: list[Artifact] = []
        t = ev.taurun.facts if ev.taurun is not None else None
        template = self.cfg.artifacts_by_profile.get(t.profile if isinstance(t, TauRunFacts) else "",
                                                     self.cfg.artifacts)
        if template:
            try:
                where: Path | None = Path(template.format(namespace=ns, run=rc.ref.name))
            except (KeyError, IndexError, ValueError) as e:
                where = None
                missing.append(Missing("profiles and dumps", f"artifacts template {template!r} is unusable: {e}"))
            if where is not None and where.is_dir():
                for sub in sorted(where.iterdir()):
                    if sub.is_dir() and not sub.is_symlink() and sub.name in {p.ref.name for p in ev.pods}:
                        _artifacts_in(sub, sub.name, artifacts, missing)
                _artifacts_in_top(where, artifacts, missing)
            elif where is not None:
                missing.append(Missing("profiles and dumps", f"{where}: no such directory"))
        trace_id = self.tracer.trace_id(rc.ref) if self.tracer is not None else ""
        return BundleInput(claims=rc, captured_at=self.now(), trigger=job.trigger, source="live", objects=objects,
                           logs=tuple(logs), signals=tuple(ev.signals), gpu=gpu, artifacts=tuple(artifacts),
                           history=job.history, nodes=_pod_nodes(ev), missing=tuple(missing), trace_id=trace_id)


def capture_for(settings: Settings, api: LogApi | None, now: Callable[[], datetime]) -> EvidenceCapture | None:
    """The controller's capture hook when bundles are configured (a directory or a blob account), else None."""
    cfg = settings.bundles
    if not (cfg.directory or cfg.blob_account_url or cfg.otlp_endpoint):
        return None
    tracer = None
    if cfg.otlp_endpoint:
        from exporters.otel import RunTracer

        tracer = RunTracer.otlp(cfg.otlp_endpoint)
    store = store_for(cfg) if (cfg.directory or cfg.blob_account_url) else None
    cap = EvidenceCapture(cfg, api, now, store=store, tracer=tracer)
    if store is None:
        cap.auto = False
    return cap
