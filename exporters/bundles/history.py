"""Raw object history kept for bundles, bounded in memory.

The controller normalizes objects and drops the raw JSON; a bundle needs the raw objects as they
were, including after they were deleted. This keeps, per object, the last few versions as
compact JSON bytes (managedFields dropped), and evicts the least recently changed objects when
the total passes its byte bound. Thread-safe: reflector threads record, the capture thread reads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from datetime import datetime
from typing import Any

import orjson

from exporters.bundles.model import ObjectVersions

Key = tuple[str, str, str]
MAX_OBJECT_BYTES = 1 << 20  # one version larger than this is kept as a stub


class ObjectHistory:
    def __init__(self, *, max_bytes: int = 64 << 20, versions: int = 16) -> None:
        self.max_bytes = max_bytes
        self.versions = versions
        self.bytes = 0
        self.evicted = 0
        self._lock = threading.Lock()
        self._objects: OrderedDict[Key, deque[tuple[datetime | None, str, bytes]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._objects)

    def record(self, key: Key, obj: Any, at: datetime | None, op: str = "upsert") -> None:
        raw = _compact(obj)
        with self._lock:
            hist = self._objects.get(key)
            if hist is None:
                hist = self._objects[key] = deque()
            else:
                self._objects.move_to_end(key)
                if hist and hist[-1][1] == op and hist[-1][2] == raw:
                    return  # a resync repeating the same version
            hist.append((at, op, raw))
            self.bytes += len(raw)
            while len(hist) > self.versions:
                self.bytes -= len(hist.popleft()[2])
            while self.bytes > self.max_bytes and len(self._objects) > 1:
                _, old = self._objects.popitem(last=False)
                self.bytes -= sum(len(v[2]) for v in old)
                self.evicted += 1

    def deleted(self, key: Key, obj: Any, at: datetime | None) -> None:
        self.record(key, obj, at, op="delete")

    def get(self, keys: set[Key]) -> tuple[ObjectVersions, ...]:
        with self._lock:
            found = [(k, tuple(self._objects[k])) for k in sorted(keys) if k in self._objects]
        return tuple(ObjectVersions(k[0], k[1], k[2], v) for k, v in found)

    def keys_where(self, namespace: str, names: set[str]) -> set[Key]:
        """Keys of objects in a namespace whose name is one of `names` or an event regarding one."""
        with self._lock:
            return {k for k in self._objects if k[1] == namespace and (k[2] in names or (
                k[0] == "Event" and k[2].partition(".")[0] in names))}


def _compact(obj: Any) -> bytes:
    if isinstance(obj, dict):
        meta = obj.get("metadata")
        if isinstance(meta, dict) and "managedFields" in meta:
            obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    try:
        raw = orjson.dumps(obj)
    except TypeError:
        raw = orjson.dumps({"unserializable": type(obj).__name__})
    # orjson's output keeps its growth buffer (~40% over its length here): an exact copy is what the
    # byte bound counts.
    raw = memoryview(raw).tobytes()
    if len(raw) > MAX_OBJECT_BYTES:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        raw = orjson.dumps({"metadata": meta if isinstance(meta, dict) else {},
                            "taugrid-evidence": f"object of {len(raw)} bytes not kept (bound {MAX_OBJECT_BYTES})"})
    return raw
