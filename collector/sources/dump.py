"""Offline source: a directory laid out as `kubectl cluster-info dump --output-directory` writes it.

Reads `nodes.json`, `<ns>/*.json`, `<ns>/<pod>/logs.txt` (split at kubectl's per-container
banners), and any other `*.json`/`*.yaml`/`*.yml` holding objects or Lists (multi-document YAML
too). Every problem names the file; a bad file or object is skipped, nothing else is.

Hostile input (docs/security.md): only regular files inside the dump are read (symlinks that
leave it, FIFOs, devices and sockets are named and skipped), object files are capped in size,
YAML aliases are refused, duplicate keys are warned about, and the default clock ignores
timestamps past the capture time and a single newest outlier.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from collector.correlate import Signal, build_index
from collector.kube import MalformedObject, node_lease, normalize
from collector.model import ObjectRecord, PodFacts, Ref, TauRunFacts
from collector.progress import LogScan, scan_text
from collector.safeload import MAX_OBJECT_BYTES, UnsafeInput, check_size, json_loads, yaml_documents
from collector.settings import TauGridContract
from collector.sources.dumpclock import CaptureClock, DumpClocks

OBJECT_SUFFIXES = (".json", ".yaml", ".yml")
LOG_NAMES = ("logs.txt",)
# One container's log beside kubectl's logs.txt: `kubectl logs --timestamps -c C > C-current.txt`
# (it stands for that container's logs.txt section, which kubectl writes without timestamps) and
# `kubectl logs --previous --timestamps -c C > C-previous.txt` (the log before its restart).
CURRENT, PREVIOUS = "-current.txt", "-previous.txt"
ENVIRONMENT_KINDS = ("CustomResourceDefinition", "Deployment")
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
class Dump(DumpClocks):
    root: Path
    records: list[ObjectRecord] = field(default_factory=list)
    logs: list[tuple[Ref, str, LogScan]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    files: int = 0
    written: datetime | None = None  # newest file modification time: when kubectl wrote the dump
    log_paths: list[str] = field(default_factory=list)  # the file of each entry of `logs`
    unseen: dict[int, str] = field(default_factory=dict)  # entry of `logs` → what of it is not in view
    # For the supported-environment check: `kubectl version -o json` (or /version) and the raw
    # CustomResourceDefinitions and Deployments the dump holds.
    version: dict[str, Any] | None = None
    environment_objects: list[dict[str, Any]] = field(default_factory=list)
    leases: list[tuple[str, datetime, timedelta]] = field(default_factory=list)  # node Leases: holder, renew, period
    listed: set[str] = field(default_factory=set)  # kinds read as a typed List (NodeList, PodList): even if empty
    _clock: CaptureClock | None = None
    _clock_for: datetime | None = None

    @property
    def skipped(self) -> bool:
        return any(p.skipped for p in self.problems)

    def _clock_problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, False))

    def snapshot_kinds(self) -> set[str]:
        """The kinds this snapshot holds: those read as a typed List (an empty NodeList says "no
        nodes"), and any kind it has an object of. A kind not in it was not captured: its source is
        not synced, and claims that need it are unknown (a dump without Nodes has no node health)."""
        return self.listed | {r.ref.kind for r in self.records}

    def signals(self, read_at: datetime) -> list[Signal]:
        return [Signal(ref=ref, source=c, scan=scan, read_at=read_at, unseen=self.unseen.get(i, ""))
                for i, (ref, c, scan) in enumerate(self.logs)]



def load_dump(root: Path, contract: TauGridContract | None = None, *,
              max_object_bytes: int = MAX_OBJECT_BYTES,
              log_regex_by_profile: Mapping[str, str] | None = None) -> Dump:
    """Read a dump. Logs are read after the objects, so that a pod's run profile can choose its
    progress regex (`log_regex_by_profile`, as the controller's settings do)."""
    contract = contract or TauGridContract()
    dump = Dump(root=root)
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: not a directory")
    real_root = os.path.realpath(root)
    logs: list[tuple[Path, str]] = []
    for path, st in _regular_files(dump, root, real_root):
        rel = path.relative_to(root).as_posix()
        if path.name in LOG_NAMES or path.suffix in OBJECT_SUFFIXES:
            mtime = datetime.fromtimestamp(st.st_mtime, UTC)
            dump.written = mtime if dump.written is None else max(dump.written, mtime)
        if path.name in LOG_NAMES or path.name.endswith((PREVIOUS, CURRENT)):
            dump.files += 1
            logs.append((path, rel))
        elif path.suffix in OBJECT_SUFFIXES:
            dump.files += 1
            _read_objects(dump, path, rel, contract, max_object_bytes)
    regex_of = regex_by_pod(dump.records, log_regex_by_profile) if log_regex_by_profile else {}
    _read_logs(dump, logs, regex_of)
    return dump


def unsafe_name(ref: Ref) -> str:
    """Why this object's namespace or name cannot be one path component, or "".

    Both become paths (`<dump>/<namespace>/<pod>/logs.txt`, a bundle's `<namespace>.<run>.<time>`);
    the API server never accepts `/`, `..` or an empty name, so a dump that holds one is forged.
    """
    for what, value in (("namespace", ref.namespace), ("name", ref.name)):
        if (not value and what == "name") or len(value) > 253 or value in (".", "..") or ".." in value \
                or any(c in value for c in "/\\\x00"):
            return f"{ref.kind} {what} {value[:100]!r} holds '/' or '..' or is not a name Kubernetes allows"
    return ""


def regex_by_pod(records: list[ObjectRecord], by_profile: Mapping[str, str]) -> dict[tuple[str, str], str]:
    """(namespace, pod) → the progress regex of its run's profile."""
    index = build_index(records)
    out: dict[tuple[str, str], str] = {}
    for root in index.roots():
        ev = index.evidence(root)
        facts = ev.taurun.facts if ev.taurun is not None else None
        regex = by_profile.get(facts.profile, "") if isinstance(facts, TauRunFacts) else ""
        if regex:
            for p in ev.pods:
                out[(p.ref.namespace, p.ref.name)] = regex
    return out


def _regular_files(dump: Dump, root: Path, real_root: str) -> Iterator[tuple[Path, os.stat_result]]:
    """Regular files under root, sorted; a symlink is followed only when it stays inside the dump.

    Directories are walked without following links; FIFOs, devices and sockets are named and
    skipped (reading one would block or read a device).
    """
    found: list[tuple[Path, os.stat_result]] = []
    for top, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            path = Path(top, name)
            rel = path.relative_to(root).as_posix()
            try:
                st = path.lstat()
                if stat.S_ISLNK(st.st_mode):
                    target = os.path.realpath(path)
                    if os.path.commonpath([real_root, target]) != real_root:
                        dump.problems.append(Problem(rel, "symbolic link leading out of the dump; not followed", True))
                        continue
                    st = os.stat(target)
                    if stat.S_ISDIR(st.st_mode):
                        continue  # its files are reached through their real place inside the dump
            except (OSError, ValueError) as e:
                dump.problems.append(Problem(rel, f"unreadable: {getattr(e, 'strerror', None) or e}", True))
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((path, st))
            elif not stat.S_ISDIR(st.st_mode):
                dump.problems.append(Problem(rel, f"not a regular file ({_file_type(st.st_mode)}); not read", True))
    found.sort(key=lambda x: x[0])
    return iter(found)


def _file_type(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def _read_regular(path: Path, limit: int | None = None, tail: bool = False) -> tuple[bytes, int]:
    """Read a file that must still be regular when opened (no FIFO swapped in meanwhile)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeInput(f"not a regular file ({_file_type(st.st_mode)}); not read")
        if limit is not None and st.st_size > limit:
            if not tail:
                check_size(st.st_size, limit, "one dump file")
            fh.seek(st.st_size - limit)
        return fh.read(), st.st_size


def _read_objects(dump: Dump, path: Path, rel: str, contract: TauGridContract, limit: int) -> None:
    try:
        data, _ = _read_regular(path, limit)
    except UnsafeInput as e:
        dump.problems.append(Problem(rel, str(e), True))
        return
    except OSError as e:
        dump.problems.append(Problem(rel, f"unreadable: {e.strerror}", True))
        return
    for where, doc in _documents(dump, data, rel, path.suffix):
        if isinstance(doc, dict) and "kind" not in doc and ("serverVersion" in doc or "gitVersion" in doc):
            dump.version = doc
            continue
        for item_where, obj in _items(dump, doc, where):
            add_object(dump, obj, rel, item_where, contract)


def add_object(dump: Dump, obj: Any, rel: str, where: str, contract: TauGridContract) -> None:
    """One object as read (from a file of the dump, or a live list): kept as a record, a node Lease
    or an environment object; a malformed or unsafely named one is a problem naming `rel`."""
    if isinstance(obj, dict) and obj.get("kind") in ENVIRONMENT_KINDS:
        dump.environment_objects.append(obj)
        return
    if isinstance(obj, dict) and obj.get("kind") == "Lease":
        _node_lease(dump, obj, where)
        return
    try:
        n = normalize(obj, contract, where=where)
    except MalformedObject as e:
        dump.problems.append(Problem(rel, str(e), True))
        return
    if n.record is not None and (unsafe := unsafe_name(n.record.ref)):
        dump.problems.append(Problem(rel, f"{where}: {unsafe}; refused, the object is not read", True))
        return
    dump.problems.extend(Problem(rel, p, False) for p in n.problems)
    if n.record is not None:
        dump.records.append(n.record)


def _node_lease(dump: Dump, obj: dict[str, Any], where: str) -> None:
    """A kubelet's node Lease (kube-node-lease): its renewals bound the capture time. Other Leases
    (leader election, a tenant's own) say nothing about it."""
    try:
        lease = node_lease(obj)
    except MalformedObject as e:
        dump.problems.append(Problem(where, str(e), False))
        return
    if lease is not None:
        dump.leases.append((lease.node, lease.renewed, lease.period))


def _documents(dump: Dump, data: bytes, rel: str, suffix: str) -> Iterator[tuple[str, Any]]:
    duplicates: list[str] = []
    if suffix == ".json":
        try:
            doc = json_loads(data, duplicates)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            dump.problems.append(Problem(rel, f"not valid JSON: {e}", True))
            return
        except RecursionError:
            dump.problems.append(Problem(rel, "not read: JSON nested too deeply", True))
            return
        dump.problems.extend(Problem(rel, d, False) for d in duplicates)
        yield rel, doc
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        dump.problems.append(Problem(rel, f"not UTF-8 at byte {e.start}", True))
        return
    docs = yaml_documents(text, duplicates)
    i = 0
    while True:
        try:
            doc = next(docs)
        except StopIteration:
            break
        except UnsafeInput as e:
            dump.problems.append(Problem(rel, f"{e}; kept the {i} document(s) before it", True))
            break
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            dump.problems.append(
                Problem(rel, f"YAML error{where} ({getattr(e, 'problem', None) or e}); "
                             f"kept the {i} document(s) before it", True)
            )
            break
        except RecursionError:
            dump.problems.append(Problem(rel, f"YAML nested too deeply; kept the {i} document(s) before it", True))
            break
        i += 1
        dump.problems.extend(Problem(rel, d, False) for d in duplicates)
        duplicates.clear()
        if doc is not None:
            yield (f"{rel}#{i}" if i > 1 else rel), doc
    dump.problems.extend(Problem(rel, d, False) for d in duplicates)


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
        if item_kind:
            dump.listed.add(item_kind)
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


def _read_log(dump: Dump, path: Path, rel: str, regex_of: Mapping[tuple[str, str], str],
              previous_of: Mapping[tuple[str, str, str], bytes] | None = None,
              containers_of: Mapping[tuple[str, str], list[str]] | None = None,
              own_files: Collection[tuple[str, str, str]] = ()) -> set[tuple[str, str, str]]:
    """One pod's log file; a container's previous log (`<container>-previous.txt`, from `kubectl logs
    --previous`), when the dump has one, is read before its current log as one signal, so steps that
    go back below the pre-restart high-water mark are replay, not progress.

    A log without kubectl's banners (a single container's `kubectl logs`, saved as logs.txt) is that
    container's: the pod's only app container, or, with no status to say, the one container whose
    previous log the dump holds."""
    used: set[tuple[str, str, str]] = set()
    parts = Path(rel).parts
    if len(parts) < 3:
        dump.problems.append(Problem(rel, "log file outside <namespace>/<pod>/, skipped", True))
        return used
    ns, pod = parts[-3], parts[-2]
    data = _log_bytes(dump, path, rel)
    if data is None:
        return used
    names = (containers_of or {}).get((ns, pod), [])
    previous = sorted(c for (n, q, c) in (previous_of or {}) if (n, q) == (ns, pod))
    default = names[0] if len(names) == 1 else previous[0] if not names and len(previous) == 1 else ""
    if not default and previous and not data.startswith(b"==== START logs for container "):
        dump.problems.append(Problem(rel, f"no kubectl banners say whose log this is and pod {ns}/{pod} has "
                                          f"{len(names) or 'no known'} container(s): "
                                          f"{', '.join(c + '-previous.txt' for c in previous)} not joined with it",
                                     False))
    for container, chunk in _split_containers(data, default):
        if (ns, pod, container) in own_files:
            continue  # its C-current.txt stands for it (kubelet-stamped; kubectl's section is not)
        prev = (previous_of or {}).get((ns, pod, container), b"")
        if prev:
            used.add((ns, pod, container))
            chunk = prev + (b"" if prev.endswith(b"\n") else b"\n") + chunk
        scan_log(dump, rel, Ref("Pod", ns, pod), container, chunk, regex_of.get((ns, pod)))
    return used


def scan_log(dump: Dump, rel: str, ref: Ref, container: str, chunk: bytes, regex: str | None) -> None:
    source = f"{rel}:{container}" if container else rel
    try:
        scan = scan_text(chunk, source=source, custom_regex=regex)
    except ValueError as e:  # a bad profile regex: say so, read with the built-in parsers
        dump.problems.append(Problem(rel, f"log regex {regex!r}: {e}; read with the built-in parsers", False))
        scan = scan_text(chunk, source=source)
    dump.problems.extend(Problem(rel, d, False) for d in scan.diagnostics)
    dump.logs.append((ref, container, scan))
    dump.log_paths.append(rel)


def _log_bytes(dump: Dump, path: Path, rel: str) -> bytes | None:
    try:
        data, size = _read_regular(path, MAX_LOG_BYTES, tail=True)
    except UnsafeInput as e:
        dump.problems.append(Problem(rel, str(e), True))
        return None
    except OSError as e:
        dump.problems.append(Problem(rel, f"unreadable: {e.strerror}", True))
        return None
    if size > MAX_LOG_BYTES:
        dump.problems.append(Problem(rel, f"{size} bytes; read the last {MAX_LOG_BYTES}", False))
    return data


def _read_logs(dump: Dump, logs: list[tuple[Path, str]], regex_of: Mapping[tuple[str, str], str]) -> None:
    """Each container's log: its `C-current.txt` where the dump has one, else its section of logs.txt,
    led by its previous log (`C-previous.txt`) as one signal."""
    previous_of: dict[tuple[str, str, str], bytes] = {}
    current_of: dict[tuple[str, str, str], tuple[bytes, str]] = {}
    combined: list[tuple[Path, str]] = []
    for path, rel in logs:
        parts = Path(rel).parts
        if not path.name.endswith((PREVIOUS, CURRENT)):
            combined.append((path, rel))
            continue
        if len(parts) < 3:
            dump.problems.append(Problem(rel, "log file outside <namespace>/<pod>/, skipped", True))
            continue
        data = _log_bytes(dump, path, rel)
        if data is None:
            continue
        suffix = PREVIOUS if path.name.endswith(PREVIOUS) else CURRENT
        for container, chunk in _split_containers(data, path.name[: -len(suffix)]):
            if suffix == PREVIOUS:
                previous_of[(parts[-3], parts[-2], container)] = chunk
            else:
                current_of[(parts[-3], parts[-2], container)] = (chunk, rel)
    containers_of: dict[tuple[str, str], list[str]] = {}
    for r in dump.records:
        if isinstance(r.facts, PodFacts):
            containers_of[(r.ref.namespace, r.ref.name)] = [c.name for c in r.facts.containers if not c.init]
    used: set[tuple[str, str, str]] = set()
    for path, rel in combined:
        used |= _read_log(dump, path, rel, regex_of, previous_of, containers_of, set(current_of))
    for (ns, pod, container), (chunk, rel) in sorted(current_of.items()):
        prev = previous_of.get((ns, pod, container), b"")
        if prev:
            used.add((ns, pod, container))
            chunk = prev + (b"" if prev.endswith(b"\n") else b"\n") + chunk
        scan_log(dump, rel, Ref("Pod", ns, pod), container, chunk, regex_of.get((ns, pod)))
    # A previous log whose container has no current log (it is waiting to restart): on its own. One
    # running again has a current log the dump does not hold: what it printed since is not in view.
    running = {(r.ref.namespace, r.ref.name, c.name) for r in dump.records if isinstance(r.facts, PodFacts)
               for c in r.facts.containers if c.state == "running" and c.restart_count > 0}
    for (ns, pod, container), chunk in sorted(previous_of.items()):
        if (ns, pod, container) not in used:
            rel = f"{ns}/{pod}/{container}{PREVIOUS}"
            scan_log(dump, rel, Ref("Pod", ns, pod), container, chunk, regex_of.get((ns, pod)))
            if (ns, pod, container) in running:
                dump.unseen[len(dump.logs) - 1] = (f"container {container} of pod {pod} restarted and runs again, but"
                                                   f" the dump holds only its log before the restart ({rel}), not "
                                                   "its current log")


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
