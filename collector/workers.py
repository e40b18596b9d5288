"""Worker-cluster evidence for `explain`: one cluster-info dump per MultiKueue worker, named explicitly.

Each worker dump is indexed on its own (collector/multicluster.py joins the manager's runs with
them); nothing is discovered, only the NAME=DIR pairs given are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from collector.correlate import RunEvidence, build_index
from collector.envcontract import ClusterInventory, inventory
from collector.settings import Settings
from collector.sources.dump import Dump, load_dump

__all__ = ["WorkerDumps", "load_worker_dumps", "parse_worker"]


@dataclass(slots=True)
class WorkerDumps:
    runs: dict[str, list[RunEvidence]] = field(default_factory=dict)
    inventories: list[ClusterInventory] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: bool = False


def parse_worker(value: str) -> tuple[str, Path]:
    """`NAME=DIR` → (NAME, DIR); ValueError naming the value otherwise."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--worker-dump {value!r}: expected NAME=DIR (the worker's MultiKueue cluster name)")
    return name, Path(path)


def _snapshot_runs(dump: Dump, settings: Settings, taken: datetime) -> list[RunEvidence]:
    index = build_index(dump.records, settings.taugrid)
    index.infer_missing_roots()
    index.synced.update(dict.fromkeys(dump.snapshot_kinds(), taken))
    dump.place_clocks(index)
    for sig in dump.signals(taken):
        index.set_signal(sig)
    return index.all_evidence()


def load_worker_dumps(workers: Mapping[str, Path], settings: Settings, taken: datetime, *,
                      max_object_bytes: int) -> WorkerDumps:
    out = WorkerDumps()
    for name, root in workers.items():
        dump = load_dump(root, settings.taugrid, max_object_bytes=max_object_bytes,
                         log_regex_by_profile=settings.controller.log_regex_by_profile)
        out.problems += [f"{name}: {'skipped' if p.skipped else 'warning'}: {p}" for p in dump.problems]
        out.skipped = out.skipped or dump.skipped
        out.runs[name] = _snapshot_runs(dump, settings, dump.clock().at or taken)
        if dump.version is not None or dump.environment_objects:
            out.inventories.append(inventory(name, dump.version, dump.environment_objects,
                                             settings.controller.environment_namespaces or None))
    return out

