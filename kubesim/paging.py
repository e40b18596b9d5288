"""Paged lists: a type's objects as they were at an older resourceVersion (rebuilt from the log of
writes), the sorted keys each page bisects (cached per version), the page itself, and the continue
token that resumes after it."""

from __future__ import annotations

import base64
import bisect
from collections import OrderedDict
from collections.abc import Sequence

import orjson

from kubesim.errors import ApiError
from kubesim.objects import Entry, Key, Obj, meta_of
from kubesim.selectors import Selector


def encode_continue(rv: int, key: Key) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": f"{key[0]}/{key[1]}\x00"})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, Key]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = orjson.loads(raw)
        ns, _, name = str(data["start"]).rstrip("\x00").partition("/")
        return int(data["rv"]), (ns, name)
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError.bad_request(f"continue key is not valid: {exc}") from exc


def snapshot(
    bucket: dict[Key, Obj], log: Sequence[Entry], storage: str, rv: int, current: int, window: int
) -> dict[Key, Obj]:
    """The objects of one storage `bucket` as they were at `rv`, undoing the logged writes after it
    (`current` is the store's latest version; lock held)."""
    if rv >= current:
        return bucket
    if rv < current - window or (log and log[0].rv > rv + 1):
        raise ApiError.expired(
            "The provided continue parameter is too old to display a consistent list result. "
            "You can start a new list without the continue parameter."
        )
    snap = dict(bucket)
    for entry in reversed(log):
        if entry.rv <= rv:
            break
        if entry.storage != storage:
            continue
        key = (meta_of(entry.obj).get("namespace", ""), meta_of(entry.obj)["name"])
        if entry.prev is None:
            snap.pop(key, None)
        else:
            snap[key] = entry.prev
    return snap


class SortedKeys:
    """A paged list's sorted keys at its resourceVersion (what a version holds never changes), so
    that each page is a bisect, not a sort of the whole type: lists of 300k Events were O(n^2)."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._cache: OrderedDict[tuple[str, int, str], list[Key]] = OrderedDict()

    def at(self, storage: str, rv: int, namespace: str, snap: dict[Key, Obj], current: int) -> list[Key]:
        """The sorted keys of `snap` (the type at `rv`, in `namespace` or all), cached (lock held)."""
        cache_key = (storage, rv, namespace)
        keys = self._cache.get(cache_key)
        if keys is None:
            keys = sorted(k for k in snap if k[0] == namespace) if namespace else sorted(snap)
            if rv <= current:  # a version this store has not reached yet may still change
                self._cache[cache_key] = keys
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(cache_key)
        return keys


def page(
    snap: dict[Key, Obj], keys: list[Key], start: Key | None, limit: int, selector: Selector | None
) -> tuple[list[Obj], int]:
    """The objects after `start` (at least the page, and one past it), and how many remain in all."""
    first = 0 if start is None else bisect.bisect_right(keys, start)
    if selector is None or selector.empty:
        # Only the page (and one past it, to know whether more remain) is read.
        end = len(keys) if not limit else min(len(keys), first + limit + 1)
        return [snap[k] for k in keys[first:end]], len(keys) - first
    objs = [o for k in keys[first:] if selector.matches(o := snap[k])]
    return objs, len(objs)


def cut(objs: list[Obj], more: int, limit: int, rv: int) -> tuple[list[Obj], str, int | None]:
    """The page itself, its continue token ("" for the last page) and the remaining item count."""
    if not (limit and more > limit):
        return objs, "", None
    last = objs[limit - 1]
    token = encode_continue(rv, (meta_of(last).get("namespace", ""), meta_of(last)["name"]))
    return objs[:limit], token, more - limit
