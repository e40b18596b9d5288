"""Caps on tracked runs (issue 26): each run the controller tracks costs ~16 series (~4.9 KB of
`/metrics`) and its evaluations, and tenants create runs at will. Past `max_runs` in all or
`max_runs_per_namespace` in one namespace a run is not tracked: counted under its namespace and
logged once per namespace, never once per run. No I/O; the controller calls it from its loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator
from datetime import datetime

from collector.model import Ref

log = logging.getLogger("taugrid.controller")

Key = tuple[str, str, str]


class RunCaps:
    """Which runs are tracked, under two caps (0: no cap)."""

    def __init__(self, max_runs: int, max_per_namespace: int) -> None:
        self.max_runs = max_runs
        self.max_per_namespace = max_per_namespace
        self.tracked = 0
        self._per_ns: dict[str, int] = {}
        self._untracked: dict[str, set[Key]] = {}  # by namespace: runs a cap keeps out

    @property
    def floor(self) -> int:
        """Below this many runs no cap can bind."""
        caps = [c for c in (self.max_runs, self.max_per_namespace) if c > 0]
        return min(caps) if caps else 1 << 62

    def untracked(self) -> dict[str, int]:
        return {ns: len(keys) for ns, keys in self._untracked.items()}

    def keeps_out(self, key: Key) -> bool:
        """Whether a cap keeps `key`'s run out now (until `release` names it again)."""
        over = self._untracked.get(key[1])
        return over is not None and key in over

    def kept_out(self) -> Iterator[Key]:
        """The runs a cap keeps out now: `release` names them again when a place frees."""
        for keys in self._untracked.values():
            yield from keys

    def order(self, targets: Iterable[Ref], tracked: Collection[Key],
              created: Callable[[Ref], datetime | None]) -> list[Ref]:
        """Tracked runs first, then new ones oldest first: a burst of new runs never displaces a run
        already tracked, and which of them fit under a cap does not depend on listing order."""
        old: list[Ref] = []
        new: list[Ref] = []
        for r in targets:
            (old if r.key in tracked else new).append(r)

        def age(r: Ref) -> tuple[str, str, str, str]:
            at = created(r)
            return (at.isoformat() if at is not None else "~", *r.key)

        return old + sorted(new, key=age)

    def admit(self, ref: Ref) -> bool:
        """Start tracking `ref` unless a cap is reached (then it is counted under its namespace)."""
        ns = ref.namespace
        in_ns = self._per_ns.get(ns, 0)
        if self.max_per_namespace > 0 and in_ns >= self.max_per_namespace:
            cap = f"max_runs_per_namespace ({self.max_per_namespace:,})"
        elif self.max_runs > 0 and self.tracked >= self.max_runs:
            cap = f"max_runs ({self.max_runs:,}, all namespaces)"
        else:
            self._per_ns[ns] = in_ns + 1
            self.tracked += 1
            over = self._untracked.get(ns)
            if over is not None:
                over.discard(ref.key)
                if not over:
                    self._clear(ns)
            return True
        over = self._untracked.setdefault(ns, set())
        if not over:
            log.warning("runs over a cap are not tracked", extra={"namespace": ns, "cap": cap, "tracked": in_ns})
        over.add(ref.key)
        return False

    def release(self, ref: Ref) -> set[Key]:
        """A tracked run is gone: its slot frees. The runs a cap kept out that may fit now."""
        ns = ref.namespace
        binding = self.max_runs > 0 and self.tracked >= self.max_runs
        n = self._per_ns.get(ns, 0) - 1
        if n > 0:
            self._per_ns[ns] = n
        else:
            self._per_ns.pop(ns, None)
        self.tracked = max(0, self.tracked - 1)
        retry = set(self._untracked.get(ns, ()))
        if binding:
            for keys in self._untracked.values():
                retry |= keys
        return retry

    def prune(self, roots: Collection[Key]) -> None:
        """Forget runs kept out that are gone."""
        for ns in list(self._untracked):
            self._untracked[ns] = {k for k in self._untracked[ns] if k in roots}
            if not self._untracked[ns]:
                self._clear(ns)

    def _clear(self, ns: str) -> None:
        del self._untracked[ns]
        log.info("every run tracked again", extra={"namespace": ns})
