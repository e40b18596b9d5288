"""Patch application: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch.

Strategic merge is the common subset: maps merge like a merge patch, lists of maps merge by their
`name` (or `type`) key, `$patch: delete|replace` and `$setElementOrder/...` directives are honoured,
other `$` directives are dropped.
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.errors import ApiError

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH)

_MERGE_KEYS = ("name", "type")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _merge_key(items: list[Any]) -> str | None:
    for key in _MERGE_KEYS:
        if items and all(isinstance(i, dict) and key in i for i in items):
            return key
    return None


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch as described in the module docstring."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    if patch.get("$patch") == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], value, orders.get(key))
        else:
            merged = strategic_merge_patch(out.get(key), value)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
    for key, order in orders.items():
        if key not in patch and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], [], order)
    return out


def _merge_list(current: list[Any], patch: list[Any], order: Any) -> list[Any]:
    key = _merge_key([*current, *[p for p in patch if not (isinstance(p, dict) and "$patch" in p and len(p) == 1)]])
    if key is None:
        return copy.deepcopy([p for p in patch if not (isinstance(p, dict) and "$patch" in p)])
    merged: dict[Any, Any] = {item[key]: item for item in current}
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            continue
        if item.get("$patch") == "delete":
            merged.pop(item[key], None)
        else:
            merged[item[key]] = strategic_merge_patch(merged.get(item[key]), item)
    if isinstance(order, list):
        wanted = [o.get(key) for o in order if isinstance(o, dict)]
        ordered = [merged[k] for k in wanted if k in merged]
        ordered += [v for k, v in merged.items() if k not in wanted]
        return ordered
    return list(merged.values())


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"json patch: invalid pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise ApiError(422, f"json patch: path /{'/'.join(parts)} does not exist")
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        index = len(parent) if last == "-" else int(last) if last.isdigit() else -1
        if not 0 <= index <= len(parent):
            raise ApiError(422, f"json patch: bad array index {last!r}")
        parent.insert(index, value)
    else:
        raise ApiError(422, "json patch: parent is not a container")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise ApiError(422, "json patch: cannot remove the whole document")
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise ApiError(422, f"json patch: path /{'/'.join(parts)} does not exist")


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 operations: add, remove, replace, move, copy, test."""
    if not isinstance(ops, list):
        raise ApiError.bad_request("json patch: the body must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError.bad_request(f"json patch: malformed operation {op!r}")
        kind, parts = op["op"], _pointer(str(op["path"]))
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "replace":
            _walk(doc, parts)
            if parts:
                _remove(doc, parts)
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = _pointer(str(op.get("from", "")))
            value = copy.deepcopy(_walk(doc, source))
            if kind == "move":
                _remove(doc, source)
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _walk(doc, parts) != op.get("value"):
                raise ApiError(422, f"json patch: test failed at {op['path']}")
        else:
            raise ApiError.bad_request(f"json patch: unknown operation {kind!r}")
    return doc


def apply_patch(target: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """Apply a patch of the given Content-Type (media type without parameters) to a copy of target."""
    if content_type == MERGE_PATCH:
        out = merge_patch(target, patch)
    elif content_type == STRATEGIC_MERGE_PATCH:
        out = strategic_merge_patch(target, patch)
    elif content_type == JSON_PATCH:
        out = json_patch(target, patch)
    else:
        raise ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{', '.join(PATCH_TYPES)}",
        )
    if not isinstance(out, dict):
        raise ApiError(422, "the patch did not produce an object")
    return out
