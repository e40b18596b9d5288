"""Offline source: a directory laid out as `kubectl cluster-info dump --output-directory` writes it.

Reads `nodes.json`, `<ns>/*.json`, `<ns>/<pod>/logs.txt` (split at kubectl's per-container
banners), and any other `*.json`/`*.yaml`/`*.yml` holding objects or Lists (multi-document YAML
too). Every problem names the file; a bad file or object is skipped, nothing else is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml

from collector.correlate import Signal
from collector.kube import MalformedObject, normalize
from collector.model import ObjectRecord, Ref
from collector.progress import LogScan, scan_text
from collector.settings import TauGridContract

OBJECT_SUFFIXES = (".json", ".yaml", ".yml")
LOG_NAMES = ("logs.txt",)
_BANNER = re.compile(r"^==== (START|END) logs for container (\S+) of pod (\S+)/(\S+) ====$")
MAX_LOG_BYTES = 64 << 20  # read at most the tail this big of one log file


@dataclass(slots=True)
class Problem:
    path: str
    message: str
    skipped: bool  # True: something was not read; False: read, but odd

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if not self.message.startswith(self.path) else self.message


@dataclass(slots=True)
class Dump:
    root: Path
    records: list[ObjectRecord] = field(default_factory=list)
    logs: list[tuple[Ref, str, LogScan]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    files: int = 0
    written: datetime | None = None  # newest file modification time: when kubectl wrote the dump

    def captured_at(self) -> datetime | None:
        """When the snapshot was taken: files cannot be older than what they hold."""
        return max((t for t in (self.written, self.newest()) if t is not None), default=None)

    @property
    def skipped(self) -> bool:
        return any(p.skipped for p in self.problems)

    def newest(self) -> datetime | None:
        """The newest timestamp in the dump: the default evaluation clock."""
        times = [r.newest for r in self.records if r.newest is not None]
        times.extend(s.at for _, _, scan in self.logs for s in scan.samples if s.at is not None)
        times.extend(h.at for _, _, scan in self.logs for h in scan.hangs if h.at is not None)
        return max(times, default=None)

    def signals(self, read_at: datetime) -> list[Signal]:
        return [Signal(ref=ref, source=c, scan=scan, read_at=read_at) for ref, c, scan in self.logs]


def load_dump(root: Path, contract: TauGridContract | None = None) -> Dump:
    contract = contract or TauGridContract()
    dump = Dump(root=root)
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: not a directory")
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if path.name in LOG_NAMES or path.suffix in OBJECT_SUFFIXES:
            mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            dump.written = mtime if dump.written is None else max(dump.written, mtime)
        if path.name in LOG_NAMES or path.name.endswith("-previous.txt"):
            dump.files += 1
            _read_log(dump, path, rel)
        elif path.suffix in OBJECT_SUFFIXES:
            dump.files += 1
            _read_objects(dump, path, rel, contract)
    return dump


def _read_objects(dump: Dump, path: Path, rel: str, contract: TauGridContract) -> None:
    try:
        data = path.read_bytes()
    except OSError as e:
        dump.problems.append(Problem(rel, f"unreadable: {e.strerror}", True))
        return
    for where, doc in _documents(dump, data, rel, path.suffix):
        for item_where, obj in _items(dump, doc, where):
            try:
                n = normalize(obj, contract, where=item_where)
            except MalformedObject as e:
                dump.problems.append(Problem(rel, str(e), True))
                continue
            dump.problems.extend(Problem(rel, p, False) for p in n.problems)
            if n.record is not None:
                dump.records.append(n.record)


def _documents(dump: Dump, data: bytes, rel: str, suffix: str) -> Iterator[tuple[str, Any]]:
    if suffix == ".json":
        try:
            yield rel, orjson.loads(data)
            return
        except orjson.JSONDecodeError as e:
            dump.problems.append(Problem(rel, f"not valid JSON: {e}", True))
            return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        dump.problems.append(Problem(rel, f"not UTF-8 at byte {e.start}", True))
        return
    loader = yaml.CSafeLoader if hasattr(yaml, "CSafeLoader") else yaml.SafeLoader
    docs = yaml.load_all(text, Loader=loader)
    i = 0
    while True:
        try:
            doc = next(docs)
        except StopIteration:
            return
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            dump.problems.append(
                Problem(rel, f"YAML error{where} ({getattr(e, 'problem', None) or e}); "
                             f"kept the {i} document(s) before it", True)
            )
            return
        i += 1
        if doc is not None:
            yield (f"{rel}#{i}" if i > 1 else rel), doc


def _items(dump: Dump, doc: Any, where: str) -> Iterator[tuple[str, Any]]:
    """Objects of one document: the object itself, a `*List`'s items, or a bare array's."""
    if isinstance(doc, list):
        for j, item in enumerate(doc):
            yield f"{where}[{j}]", item
        return
    if not isinstance(doc, dict):
        dump.problems.append(Problem(where, f"expected an object or a List, got {type(doc).__name__}", True))
        return
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        item_kind = kind[: -len("List")] if kind != "List" else None
        api_version = doc.get("apiVersion")
        for j, item in enumerate(doc["items"]):
            # The API omits kind/apiVersion on list items; kubectl's dump keeps them omitted.
            if isinstance(item, dict) and item_kind and "kind" not in item:
                item = {**item, "kind": item_kind}
                if api_version and "apiVersion" not in item:
                    item["apiVersion"] = api_version
            yield f"{where} items[{j}]", item
        return
    yield where, doc


def _read_log(dump: Dump, path: Path, rel: str) -> None:
    parts = Path(rel).parts
    if len(parts) < 3:
        dump.problems.append(Problem(rel, "log file outside <namespace>/<pod>/, skipped", True))
        return
    ns, pod = parts[-3], parts[-2]
    previous = path.name.endswith("-previous.txt")
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            if size > MAX_LOG_BYTES:
                fh.seek(size - MAX_LOG_BYTES)
                dump.problems.append(Problem(rel, f"{size} bytes; read the last {MAX_LOG_BYTES}", False))
            data = fh.read()
    except OSError as e:
        dump.problems.append(Problem(rel, f"unreadable: {e.strerror}", True))
        return
    ref = Ref("Pod", ns, pod)
    default_container = path.name[: -len("-previous.txt")] if previous else ""
    for container, chunk in _split_containers(data, default_container):
        scan = scan_text(chunk, source=f"{rel}:{container}" if container else rel)
        dump.problems.extend(Problem(rel, d, False) for d in scan.diagnostics)
        dump.logs.append((ref, container, scan))


def _split_containers(data: bytes, default: str) -> Iterator[tuple[str, bytes]]:
    """kubectl writes all containers of a pod into one logs.txt between START/END banners."""
    if b"==== START logs for container " not in data:
        yield default, data
        return
    current: str | None = None
    buf: list[bytes] = []
    for line in data.splitlines(keepends=True):
        m = _BANNER.match(line.decode("utf-8", "replace").rstrip("\r\n")) if line.startswith(b"==== ") else None
        if m is None:
            if current is not None:
                buf.append(line)
            continue
        if m.group(1) == "START":
            current, buf = m.group(2), []
        elif current is not None:
            yield current, b"".join(buf)
            current = None
    if current is not None:
        yield current, b"".join(buf)
