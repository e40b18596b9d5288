"""Label and field selectors with the Kubernetes syntax and semantics."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubesim.errors import ApiError

_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_SET_OP = re.compile(r"^(\S+)\s+(in|notin)\s+\((.*)\)$")


@dataclass(frozen=True, slots=True)
class Requirement:
    """One label requirement: `op` is one of =, !=, in, notin, exists, !exists, gt, lt."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op in ("gt", "lt") and present:
            try:
                have, want = int(str(value)), int(self.values[0])
            except ValueError:
                return False
            return have > want if self.op == "gt" else have < want
        return False


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _bad(kind: str, text: str, why: str) -> ApiError:
    return ApiError.bad_request(f"unable to parse requirement: {kind} selector {text!r}: {why}")


def _check_key(key: str, text: str) -> str:
    if not _KEY.match(key):
        raise _bad("label", text, f"invalid label key {key!r}")
    return key


def _check_value(value: str, text: str) -> str:
    if len(value) > 63 or not _VALUE.match(value):
        raise _bad("label", text, f"invalid label value {value!r}")
    return value


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """Parse `a=b,c!=d,e in (x,y),f notin (z),g,!h,n>3`; raise ApiError 400 when malformed."""
    reqs: list[Requirement] = []
    for part in _split_top(text):
        m = _SET_OP.match(part)
        if m:
            key, op, vals = m.group(1), m.group(2), m.group(3)
            values = tuple(_check_value(v.strip(), text) for v in vals.split(",")) if vals.strip() else ()
            reqs.append(Requirement(_check_key(key, text), op, values))
            continue
        for token, op in (("!=", "!="), ("==", "="), ("=", "="), (">", "gt"), ("<", "lt")):
            if token in part:
                key, _, value = part.partition(token)
                value = value.strip()
                if op in ("gt", "lt") and not value.lstrip("-").isdigit():
                    raise _bad("label", text, f"{value!r} is not an integer")
                if op not in ("gt", "lt"):
                    _check_value(value, text)
                reqs.append(Requirement(_check_key(key.strip(), text), op, (value,)))
                break
        else:
            if part.startswith("!"):
                reqs.append(Requirement(_check_key(part[1:].strip(), text), "!exists"))
            elif " " in part:
                raise _bad("label", text, f"unexpected {part!r}")
            else:
                reqs.append(Requirement(_check_key(part, text), "exists"))
    return tuple(reqs)


def _get_path(obj: Mapping[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _field_str(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


FieldPathOf = Callable[[str], "str | None"]


def parse_field_selector(text: str, path_of: FieldPathOf) -> tuple[tuple[str, bool, str], ...]:
    """Parse `a=b,c!=d` into (stored path, equal, value) triples; labels `path_of` rejects → 400."""
    out: list[tuple[str, bool, str]] = []
    for part in _split_top(text):
        for token, equal in (("!=", False), ("==", True), ("=", True)):
            if token in part:
                label, _, value = part.partition(token)
                label = label.strip()
                path = path_of(label)
                if path is None:
                    raise ApiError.bad_request(f"field label not supported: {label}")
                out.append((path, equal, value.strip()))
                break
        else:
            raise ApiError.bad_request(f"invalid field selector: {part!r}: expected an operator")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed label selector plus field selector, matched against stored objects."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[tuple[str, bool, str], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.labels and not self.fields

    def matches(self, obj: Mapping[str, Any]) -> bool:
        if self.labels:
            labels = _get_path(obj, "metadata.labels") or {}
            if not all(r.matches(labels) for r in self.labels):
                return False
        return all((_field_str(_get_path(obj, path)) == value) == equal for path, equal, value in self.fields)


def build_selector(label_selector: str, field_selector: str, path_of: FieldPathOf) -> Selector:
    """Selector from the raw `labelSelector` and `fieldSelector` query parameters."""
    return Selector(
        labels=parse_label_selector(label_selector) if label_selector else (),
        fields=parse_field_selector(field_selector, path_of) if field_selector else (),
    )
