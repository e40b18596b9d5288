"""JSON and YAML parsing for input the collector does not control (dumps, settings files).

- YAML aliases are refused: `kubectl` never writes them, and a kilobyte of nested aliases
  expands to gigabytes (the "billion laughs"). The check runs while constructing, before any
  expansion, so the refusal costs nothing.
- Duplicate keys in an object are reported (by key and position); the value that the Kubernetes
  API's own decoders keep, the last, is kept, never silently.
- Callers cap the input size before parsing (`check_size`, `MAX_OBJECT_BYTES`).

Every reader of tenant or dump JSON/YAML in the package parses through here: the dump loader,
the bundle's raw-object copy, settings files.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterator
from typing import Any

import yaml

MAX_OBJECT_BYTES = 256 << 20  # one JSON/YAML dump file (~40,000 pods as JSON; parsing takes ~4.5x in memory)


class UnsafeInput(ValueError):
    """Input refused before or while parsing: too big, or YAML aliases."""


def check_size(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise UnsafeInput(f"{size} bytes, over the {limit}-byte limit for {what}; not read "
                          f"(split the file, or raise the limit if it is trusted)")


_BaseLoader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _NoAliasLoader(_BaseLoader):  # type: ignore[misc]
    """SafeLoader (C parser where available) that refuses aliases and reports duplicate keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # A node reached a second time is an alias (*name) of an anchored one: refuse it before
        # anything is expanded.
        if node in self.constructed_objects or node in self.recursive_objects:
            mark = node.start_mark
            raise UnsafeInput(f"YAML alias at line {mark.line + 1} refused (kubectl never writes aliases; "
                              "they can expand without bound)")
        return super().construct_object(node, deep=deep)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is None:
                    continue
                if key in seen:
                    self.duplicates.append(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}; "
                                           "the last value is used")
                seen.add(key)
        result: dict[Hashable, Any] = super().construct_mapping(node, deep=deep)
        return result


def yaml_documents(text: str, duplicates: list[str]) -> Iterator[Any]:
    """Each document of a YAML stream; duplicate-key notes go to `duplicates`.

    Raises yaml.YAMLError for bad syntax and UnsafeInput for aliases (after the good documents).
    """
    loader = _NoAliasLoader(text)
    try:
        while loader.check_data():
            doc = loader.get_data()
            duplicates.extend(loader.duplicates)
            loader.duplicates.clear()
            yield doc
    finally:
        loader.dispose()


def documents(data: bytes, suffix: str, duplicates: list[str] | None = None) -> Iterator[Any]:
    """Each document of one JSON (`.json`) or YAML file, through the checks above.

    Raises UnsafeInput (aliases), yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError or
    RecursionError, after the documents before the problem.
    """
    dup = [] if duplicates is None else duplicates
    if suffix == ".json":
        yield json_loads(data, dup)
        return
    yield from yaml_documents(data.decode("utf-8"), dup)


def json_loads(data: bytes | str, duplicates: list[str]) -> Any:
    """Parse JSON, noting each object key given twice (json.JSONDecodeError on bad syntax)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items):
            seen: set[str] = set()
            for k, _ in items:
                if k in seen and len(duplicates) < 100:
                    duplicates.append(f"duplicate key {k!r}; the last value is used")
                seen.add(k)
        return out

    return json.loads(data, object_pairs_hook=pairs)
