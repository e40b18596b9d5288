"""Selective decoding of the API's JSON: only the fields `collector.kube.normalize` reads.

A fleet pod is ~6 KB of JSON of which the records read a few hundred bytes. Decoding into
`msgspec` TypedDicts skips every other field while parsing (no dicts built for env, volumes,
managedFields...), and what comes out is still plain dicts, so `normalize` runs unchanged and its
records, warnings and errors are those of the full decode. Where the typed decode refuses a value
(a field of the wrong JSON type), the whole document falls back to the full `orjson` decode, so a
malformed object is reported exactly as before.

Pod ADDED/MODIFIED frames go further: they are decoded into the typed Structs of
`collector.kube_pod`, whose record is built from attributes (no dicts, no dict walk); a frame of
another type, another kind, or with a read field of an unexpected JSON type takes the dict path
above, and the Struct builder hands anything `normalize` would warn about to `normalize` itself.

Two differences, both in values no valid object has: an integer beyond 64 bits stays an exact int
(orjson makes it a float), and a number beyond double range in a field no record reads is skipped
(orjson refuses the whole document). Checking for them costs more than the decode itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import msgspec
import orjson
from msgspec import UNSET, Struct, UnsetType

from collector.kube_pod import PodEvent, PodObject

JSON = dict[str, Any]


# --- pods: the fields collector.kube._pod and normalize read ---------------------------------------


class _Meta(TypedDict, total=False):
    name: Any
    namespace: Any
    uid: Any
    resourceVersion: Any
    generation: Any
    creationTimestamp: Any
    deletionTimestamp: Any
    labels: Any
    ownerReferences: Any


class _ContainerSpec(TypedDict, total=False):
    name: Any  # a container without GPUs beside one with them is a helper (PodFacts.helpers)
    resources: Any


class _PodSpec(TypedDict, total=False):
    nodeName: Any
    containers: list[_ContainerSpec | Any]
    schedulingGates: Any
    resourceClaims: Any
    # where an unbound pod may run (PodFacts.placement)
    nodeSelector: Any
    affinity: Any
    tolerations: Any


class _ContainerStatus(TypedDict, total=False):
    name: Any
    ready: Any
    restartCount: Any
    state: Any
    lastState: Any
    allocatedResourcesStatus: Any


class _PodStatus(TypedDict, total=False):
    phase: Any
    reason: Any
    message: Any
    startTime: Any
    podIP: Any
    conditions: Any
    containerStatuses: list[_ContainerStatus | Any]
    initContainerStatuses: list[_ContainerStatus | Any]
    resourceClaimStatuses: Any


class _Pod(TypedDict, total=False):
    kind: Any
    apiVersion: Any
    metadata: _Meta
    spec: _PodSpec
    status: _PodStatus
    # A watch ERROR frame carries a Status here: what the reflector reads of it. One pass over the
    # frame, instead of a raw object decoded again by type, is what makes the selective path pay.
    code: Any
    reason: Any
    message: Any


class _PodList(TypedDict, total=False):
    metadata: Any
    items: list[_Pod]


class _PodEvent(TypedDict, total=False):
    type: Any
    object: _Pod  # also an ERROR frame's Status: code, reason and message are kept (see _Pod)


# A union of a TypedDict and Any is not something msgspec accepts: lists of items that are not
# objects fall back to the full decode instead (see the module docstring).
_PodSpec.__annotations__["containers"] = list[_ContainerSpec]
_PodStatus.__annotations__["containerStatuses"] = list[_ContainerStatus]
_PodStatus.__annotations__["initContainerStatuses"] = list[_ContainerStatus]


class Decoder:
    """Decodes list pages and watch frames of one kind; `orjson.loads` where no selection exists."""

    def __init__(self, page: Callable[[bytes], Any] | None = None, event: Callable[[bytes], Any] | None = None,
                 *, event_falls_back: bool = False, item: Callable[[bytes], Any] | None = None) -> None:
        self._page = page
        self._event = event
        self._item = item
        if event is not None and event_falls_back:
            self.event = event  # type: ignore[method-assign,assignment]  # it falls back itself: one call less per event

    @property
    def selective(self) -> bool:
        return self._page is not None

    def page(self, data: bytes) -> Any:
        return _decode(self._page, data)

    def event(self, line: bytes) -> Any:
        return _decode(self._event, line)

    def item(self, data: bytes) -> Any:
        """One item of a list, as `page` decodes it among a page's items (a list read item by item:
        collector.sources.listbody). A typed decode refused falls back for this item alone."""
        return _decode(self._item, data)


def _decode(typed: Callable[[bytes], Any] | None, data: bytes) -> Any:
    if typed is not None:
        try:
            return typed(data)
        except msgspec.DecodeError:  # ValidationError included: a field of an unexpected type
            pass  # the full decode reports it (or accepts it) as it always has
    return orjson.loads(data)


FULL = Decoder()

_pod_page_dicts = msgspec.json.Decoder(_PodList).decode
_pod_item_dicts = msgspec.json.Decoder(_Pod).decode
_pod_event_dicts = msgspec.json.Decoder(_PodEvent).decode
_pod_event_typed = msgspec.json.Decoder(PodEvent).decode


def _pod_event(line: bytes) -> Any:
    """ADDED/MODIFIED of a pod whose read fields all have their valid types: a `PodEvent`, which
    `collector.kube_pod.normalize_pod` turns into a record without dicts. Anything else (another
    frame type, a field of another type) is decoded into dicts as before."""
    try:
        e = _pod_event_typed(line)
    except msgspec.DecodeError:
        return _decode(_pod_event_dicts, line)
    if (e.type == "ADDED" or e.type == "MODIFIED") and type(e.object) is PodObject \
            and (e.object.kind is UNSET or e.object.kind == "Pod"):
        return e
    return _decode(_pod_event_dicts, line)  # what an ERROR or BOOKMARK frame carries is read from dicts


class _TypedPodList(Struct, gc=False):
    metadata: Any = UNSET
    items: list[PodObject] | None | UnsetType = UNSET


_pod_page_typed = msgspec.json.Decoder(_TypedPodList).decode
_pod_item_typed = msgspec.json.Decoder(PodObject).decode


def _is_pod(p: PodObject) -> bool:
    return p.kind is UNSET or p.kind == "Pod"


def _pod_page(data: bytes) -> Any:
    """A list page of pods whose items all decode typed: `PodObject`s (built into records without
    dicts, and sharing their parts as watch events do: collector/kube_pod.py), under the page's
    metadata; otherwise the page in dicts, as before."""
    try:
        page = _pod_page_typed(data)
    except msgspec.DecodeError:
        return _decode(_pod_page_dicts, data)
    if type(page.items) is list and not all(map(_is_pod, page.items)):
        return _decode(_pod_page_dicts, data)  # an item of another kind: read as dicts, as a watch frame is
    out: dict[str, Any] = {}
    if page.metadata is not UNSET:
        out["metadata"] = page.metadata
    if page.items is not UNSET:
        out["items"] = page.items
    return out


def _pod_item(data: bytes) -> Any:
    """One pod of a list read item by item: a `PodObject` where it decodes typed, as in `_pod_page`."""
    try:
        p = _pod_item_typed(data)
    except msgspec.DecodeError:
        return _decode(_pod_item_dicts, data)
    return p if _is_pod(p) else _decode(_pod_item_dicts, data)


def listed(item: Any, kind: str, api_version: str) -> Any:
    """A list item with the kind and apiVersion a list leaves out filled in (as the reflector does for
    watch frames); None for an item that is not an object."""
    if isinstance(item, dict):
        item.setdefault("kind", kind)
        item.setdefault("apiVersion", api_version)
        return item
    if type(item) is PodObject:
        if item.kind is UNSET:
            item.kind = kind
        if item.apiVersion is UNSET:
            item.apiVersion = api_version
        return item
    return None


# The previous pod path (selective dicts, then normalize's dict walk): kept for the benchmark and
# the equivalence tests.
POD_DICTS = Decoder(_pod_page_dicts, _pod_event_dicts, item=_pod_item_dicts)

_SELECTIVE: dict[tuple[str, str], Decoder] = {
    ("v1", "Pod"): Decoder(_pod_page, _pod_event, event_falls_back=True, item=_pod_item),
}


def decoder_for(api_version: str, kind: str, *, full: bool = False) -> Decoder:
    """The selective decoder of a kind when one exists and `full` (keep whole objects) is not asked."""
    return FULL if full else _SELECTIVE.get((api_version, kind), FULL)
