"""One watch stream's cursor over the store's log of writes: which entries it sees, and as what
(a write that moves an object into or out of a namespace/selector watch reads as ADDED/DELETED)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubesim.objects import Entry, Obj, meta_of
from kubesim.registry import ResourceType
from kubesim.selectors import Selector

if TYPE_CHECKING:
    from kubesim.store import Store


class Watch:
    """One watch stream's cursor over the store's event log."""

    def __init__(
        self,
        store: Store,
        rt: ResourceType,
        namespace: str,
        selector: Selector | None,
        start_rv: int,
        initial: list[Obj],
    ) -> None:
        self.store = store
        self.rt = rt
        self.namespace = namespace
        self.selector = selector if selector is not None and not selector.empty else None
        self.pos = start_rv
        self.initial: list[Obj] | None = initial

    def _match(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        if self.namespace and meta_of(obj).get("namespace") != self.namespace:
            return False
        return self.selector is None or self.selector.matches(obj)

    def poll(self, timeout: float) -> list[tuple[str, Entry | Obj]]:
        """Events since the last poll, waiting up to `timeout` seconds for one.

        Items are (type, Entry) for logged writes, or (type, object) for the initial state.
        Raises Expired when the watch fell behind the retained window.
        """
        if self.initial is not None:
            initial, self.initial = self.initial, None
            if initial:
                return [("ADDED", o) for o in initial]
        store = self.store
        storage = self.rt.storage_key
        with store.cond:
            if store.resource_version <= self.pos and not store.closed and timeout > 0:
                store.cond.wait(timeout)
            entries = store.events_after(self.pos)
            self.pos = max(self.pos, store.resource_version)
        out: list[tuple[str, Entry | Obj]] = []
        for e in entries:
            if e.storage != storage:
                continue
            if e.type == "MODIFIED" and (self.namespace or self.selector):
                was, now = self._match(e.prev), self._match(e.obj)
                if was and now:
                    out.append(("MODIFIED", e))
                elif now:
                    out.append(("ADDED", e))
                elif was:
                    out.append(("DELETED", e))
            elif self._match(e.obj):
                out.append((e.type, e))
        return out
