"""Breaking a JSON object at one place, for the property tests over Kubernetes objects."""

from __future__ import annotations

from typing import Any


def set_path(obj: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    """`obj` with the value at `path` replaced by `value` (or deleted), in place where it can be;
    a path that does not lead anywhere leaves it as it was. The empty path replaces the whole."""
    if not path:
        return value
    parent = obj
    for k in path[:-1]:
        try:
            parent = parent[k]
        except (KeyError, IndexError, TypeError):
            return obj
    if isinstance(parent, dict) != isinstance(path[-1], str):
        return obj  # JSON keys are strings, list indexes ints
    try:
        if delete:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    except (KeyError, IndexError, TypeError):
        pass
    return obj
