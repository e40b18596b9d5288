"""A MultiKueue worker cluster watched read-only: its own run index, fed by its own reflectors.

The controller's manager index stays as it is; each configured worker (never discovered) gets a
`WorkerCluster`, and the controller joins a dispatched run with it at evaluation time
(collector/multicluster.py). Changes are applied in the reflector threads under one lock; `runs()`
returns a snapshot rebuilt only after a change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

from collector.correlate import RunEvidence, RunIndex
from collector.kube import MalformedObject, normalize
from collector.kube_pod import PodObject
from collector.model import ObjectRecord, Ref
from collector.settings import TauGridContract
from collector.sources.kube_api import JSON, KubeApi, Resource, SourceError, load_api_client
from collector.sources.watch import Reflector

__all__ = ["WORKER_KINDS", "WorkerCluster", "parse_worker_spec", "workers_from_specs"]

log = logging.getLogger("taugrid.worker")
# What a dispatched run leaves on a worker: MultiKueue's Workload and Job (or RayJob) copies and
# what runs them.
WORKER_KINDS = frozenset({"Pod", "Event", "Node", "Job", "Workload", "RayJob", "RayCluster", "PyTorchJob", "JobSet"})


class WorkerCluster:
    def __init__(self, name: str, api: KubeApi, now: Callable[[], datetime], resources: tuple[Resource, ...],
                 contract: TauGridContract | None = None, *, watch_timeout_s: int = 300) -> None:
        self.name = name
        self.api = api
        self.now = now
        self.contract = contract or TauGridContract()
        self.wanted = tuple(r for r in resources if r.kind in WORKER_KINDS)
        self.watch_timeout_s = watch_timeout_s
        self.index = RunIndex(self.contract)
        self.errors = 0
        self._lock = threading.Lock()
        self._version = 0
        self._snapshot: tuple[int, list[RunEvidence]] = (-1, [])
        self._reflectors: list[Reflector] = []
        # Set by the controller: called (from reflector threads) after each applied change and each
        # read error, so dispatched runs re-evaluate at once and errors are counted per worker.
        self.on_change: Callable[[str], None] | None = None
        self.on_error: Callable[[str, SourceError], None] | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        """Discover which of the wanted APIs the worker serves, then list and watch them."""
        try:
            present, notes = self.api.discover(self.wanted)
        except SourceError as e:
            # Unreachable now: watch what we asked for; the reflectors retry with backoff.
            log.warning("worker discovery failed", extra={"worker": self.name, "error": str(e)})
            present, notes = list(self.wanted), []
        for note in notes:
            log.info("optional API absent on worker", extra={"worker": self.name, "note": note})
        for r in present:
            refl = Reflector(self.api, r, self, self.now, watch_timeout_s=self.watch_timeout_s)
            self._reflectors.append(refl)
            refl.start()

    def close(self) -> None:
        for r in self._reflectors:
            r.stop()

    @property
    def synced(self) -> bool:
        return all(r.synced_once.is_set() for r in self._reflectors)

    def runs(self) -> list[RunEvidence]:
        """The worker's runs now (cached until the next change)."""
        with self._lock:
            if self._snapshot[0] != self._version:
                self._snapshot = (self._version, self.index.all_evidence())
            return self._snapshot[1]

    # --- WatchSink -----------------------------------------------------------------------------

    def _record(self, r: Resource, obj: JSON | PodObject) -> ObjectRecord | None:
        try:
            return normalize(obj, self.contract, where=f"{self.name}: {r.kind}").record
        except MalformedObject as e:
            log.warning("skipped", extra={"worker": self.name, "problem": str(e)})
            self.errors += 1
            return None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.name)

    def upsert(self, resource: Resource, obj: JSON | PodObject) -> None:
        rec = self._record(resource, obj)
        if rec is not None:
            with self._lock:
                self.index.upsert(rec)
                self._version += 1
            self._changed()

    def delete(self, resource: Resource, obj: JSON) -> None:
        rec = self._record(resource, obj)
        if rec is not None:
            with self._lock:
                self.index.delete(rec.ref)
                self._version += 1
            self._changed()

    def replace(self, resource: Resource, objs: Iterable[JSON | PodObject]) -> None:
        recs = [rec for o in objs if (rec := self._record(resource, o)) is not None]
        kind = self.contract.role_of(resource.kind, resource.api_version) or resource.kind
        with self._lock:
            gone = self.index.keys_of_kind(kind)
            for rec in recs:
                gone.discard(rec.ref.key)
                self.index.upsert(rec)
            for key in gone:
                self.index.delete(Ref(*key))
            self._version += 1
        self._changed()

    def mark_synced(self, resource: Resource, at: datetime) -> None:
        with self._lock:
            self.index.synced[self.contract.role_of(resource.kind, resource.api_version) or resource.kind] = at
            self._version += 1
        self._changed()

    def source_error(self, resource: Resource, error: SourceError) -> None:
        self.errors += 1
        log.warning("worker read failed", extra={"worker": self.name, "resource": resource.name, "error": str(error)})
        if self.on_error is not None:
            self.on_error(self.name, error)

    def flush(self, resource: Resource) -> None:
        pass  # applied as they come

    def watch_restarted(self, resource: Resource, relist: bool) -> None:
        pass


def parse_worker_spec(spec: str) -> tuple[str, str, str | None]:
    """`NAME=KUBECONFIG` or `NAME=KUBECONFIG#CONTEXT` → (name, kubeconfig path, context or None).

    NAME is the worker as MultiKueue names it (the manager Workload's `status.clusterName`)."""
    name, sep, rest = spec.partition("=")
    path, _, context = rest.partition("#")
    if not sep or not name or not path:
        raise ValueError(f"worker {spec!r}: expected NAME=KUBECONFIG or NAME=KUBECONFIG#CONTEXT")
    return name, path, context or None


def workers_from_specs(specs: Sequence[str], now: Callable[[], datetime], resources: tuple[Resource, ...],
                       contract: TauGridContract | None = None) -> tuple[WorkerCluster, ...]:
    """One `WorkerCluster` per `NAME=KUBECONFIG[#CONTEXT]`, in order; duplicate names are an error.

    For the `controller` command (a `--worker` option) or a config list: workers are only ever
    these, never discovered."""
    out: list[WorkerCluster] = []
    for spec in specs:
        name, path, context = parse_worker_spec(spec)
        if any(w.name == name for w in out):
            raise ValueError(f"worker {name!r} given twice")
        out.append(WorkerCluster(name, KubeApi(load_api_client(path, context)), now, resources, contract))
    return tuple(out)
