"""One shared object per equal value: `Interner`, for tuples that thousands of records repeat (a pod's
helper names, a run link's key, a run's claim state), so each equal value is held once."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class Interner(Generic[T]):
    """`intern(value)`: the first value equal to it that was seen, or `value` itself from now on. At
    most `cap` values are remembered: past it they are all forgotten (bounded memory whatever tenants
    create; a value seen again is shared anew)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._seen: dict[T, T] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def __call__(self, value: T) -> T:
        found = self._seen.get(value)
        if found is None:
            if len(self._seen) >= self.cap:
                self._seen.clear()
            found = self._seen[value] = value
        return found
