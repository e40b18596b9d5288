"""What the simulator's store holds and hands out: object and key types, settings, log entries, list
results, and the errors a list or watch raises for a version out of range."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubesim.errors import ApiError

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Store behaviour that tests and benchmarks tune."""

    # Number of most recent writes kept for watch resumption and continue tokens; a watch or
    # continue token older than this window answers 410 Gone (Expired).
    watch_window: int = 10_000
    # Per-container log text kept (oldest lines dropped first).
    log_max_bytes: int = 1 << 20
    # Seed for uids and generated names, so a scenario replays identically.
    seed: int = 0
    # core/v1 Events are deleted this many (scenario) seconds after their last write, as
    # kube-apiserver's --event-ttl (1 h by default) does through etcd leases; None keeps them.
    event_ttl_s: float | None = None


@dataclass(slots=True)
class Entry:
    """One write in the event log. `prev` is the object before the write (None for ADDED)."""

    rv: int
    storage: str
    type: str
    obj: Obj
    prev: Obj | None


@dataclass(slots=True)
class ListResult:
    items: list[Obj]
    resource_version: int
    continue_token: str
    remaining: int | None


class Expired(Exception):
    """A watch fell behind the retained window."""

    def __init__(self, rv: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {rv} ({oldest})")


class TooLarge(Exception):
    """A list or watch asked for a resourceVersion this store has not reached (a restored or
    replaced store, or a client that saw another server). The server answers it as Kubernetes' watch
    cache does: 504 Timeout "Too large resource version" (k8s.io/apiserver storage errors)."""

    def __init__(self, rv: int, current: int) -> None:
        super().__init__(f"Too large resource version: {rv}, current: {current}")
        self.rv, self.current = rv, current


def meta_of(obj: Obj) -> Obj:
    """The object's metadata ({} when it has none)."""
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def parse_rv(text: str) -> int:
    """A resourceVersion query parameter as a number (400 Bad Request when it is not one)."""
    try:
        value = int(text)
    except ValueError:
        raise ApiError.bad_request(f"invalid resource version: {text!r}") from None
    if value < 0:
        raise ApiError.bad_request(f"invalid resource version: {text!r}")
    return value
