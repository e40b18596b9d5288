"""What a bundle is made of: records the capture edge assembles and the writer turns into files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from collector.correlate import Signal
from collector.model import RunClaims

FORMAT = "taugrid-evidence-bundle/1"


@dataclass(frozen=True, slots=True)
class ObjectVersions:
    """One object's raw history as observed: (observed at, "upsert" | "delete", raw JSON bytes)."""

    kind: str
    namespace: str
    name: str
    versions: tuple[tuple[datetime | None, str, bytes], ...]


@dataclass(frozen=True, slots=True)
class LogTail:
    """A bounded tail of one container's log; data None when it could not be read (problem says why)."""

    pod: str
    container: str
    previous: bool
    data: bytes | None
    total_bytes: int | None = None  # size before the tail was cut, when known
    problem: str = ""


@dataclass(frozen=True, slots=True)
class Artifact:
    """A file the run left (profiler trace, flight-recorder dump, py-spy dump), by where it was found."""

    name: str  # file name as found
    data: bytes
    pod: str = ""  # the pod it belongs to, when its location says so


@dataclass(frozen=True, slots=True)
class GpuSample:
    at: datetime | None
    node: str
    gpu: str
    utilization: float | None
    power_w: float | None
    source: str


@dataclass(frozen=True, slots=True)
class Missing:
    what: str
    why: str


@dataclass(frozen=True, slots=True)
class ClaimPoint:
    """A claim's state from `at` on (the live controller records transitions; a dump gives `since`)."""

    at: datetime
    claim: str  # scheduled | running | progressing | blocked
    observed: str  # true | false | unknown; for blocked: the stage, or "" when not blocked
    verdict: str
    reason: str


@dataclass(frozen=True, slots=True)
class BundleInput:
    claims: RunClaims
    captured_at: datetime
    trigger: str  # "on demand", "progressing stalled", "pod deleted", ...
    source: str  # "live" | "dump <dir>"
    objects: tuple[ObjectVersions, ...] = ()
    logs: tuple[LogTail, ...] = ()
    signals: tuple[Signal, ...] = ()
    gpu: tuple[GpuSample, ...] | None = None  # None: no node agent reports for this run
    artifacts: tuple[Artifact, ...] = ()
    history: tuple[ClaimPoint, ...] = ()
    nodes: Mapping[str, str] = field(default_factory=dict)  # pod → node
    missing: tuple[Missing, ...] = ()
    trace_id: str = ""  # the run's lifecycle trace (OpenTelemetry), when traces are exported


def path_component(name: str, what: str = "bundle name") -> str:
    """`name` when it is one plain path component (no separator, not `.`/`..`); ValueError otherwise.

    Names come from objects (a dump is from anyone): a bundle is written, and replaced, only inside
    its store's directory."""
    if not name or name in (".", "..") or ".." in name or any(c in name for c in "/\\\x00") or len(name) > 255:
        raise ValueError(f"{what} {name[:100]!r} is not one plain path component; refused")
    return name


def bundle_name(namespace: str, name: str, at: datetime) -> str:
    """`<namespace>.<run>.<UTC time>`: namespaces hold no dots, so the name splits unambiguously."""
    return path_component(f"{namespace}.{name}.{at.strftime('%Y%m%dT%H%M%SZ')}")
