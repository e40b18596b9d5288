"""Pods straight from typed structs to records: the watch's fast path.

A watch line of a pod is decoded (`collector.sources.decode`) into the `msgspec` Structs below,
which hold only what `collector.kube.normalize` reads of a pod and type each field as a valid
object has it. `normalize_pod` then builds the record from the attributes, without dicts.

Equivalence with `normalize` is by construction, not by a second reading of every odd case:
- a field of another JSON type fails the typed decode, and the line takes the dict path;
- anything the fast builder meets that `normalize` would warn about or refuse (an odd timestamp,
  an unknown phase, a condition without a type, no name, DRA claims, device health...) makes it
  hand the Struct, as plain builtins, to `normalize` itself: same record, warnings and errors.
`tests/scale/test_decode_equivalence.py` checks it with hypothesis.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from collector import kube
from collector.interning import Interner
from collector.model import Condition, ContainerFacts, ObjectRecord, OwnerRef, PodFacts, Ref
from collector.settings import TauGridContract

# Optional fields: absent (UNSET) and null are both "missing" to normalize, as `.get()` is.
_Str = str | None | UnsetType
_Int = int | None | UnsetType


class _Owner(Struct, gc=False):
    kind: _Str = UNSET
    name: _Str = UNSET
    uid: _Str = UNSET
    controller: bool | None | UnsetType = UNSET


# Only the labels a record keeps (kube.KEPT_LABELS), one field each under the label's own name: the
# decode skips the dozens of others a fleet's pods carry instead of building a dict of them, and
# `msgspec.to_builtins` gives back the kept ones, by name, in one C call.
_KEPT_NAMES = sorted(kube.KEPT_LABELS | kube.POD_IDENTITY_LABELS)  # identity labels: read, not kept
# Frozen, so hashable: a pod's kept labels are looked up as decoded (`_labels_of`).
_Labels: Any = msgspec.defstruct(
    "_Labels", [(f"k{i}", str | UnsetType, UNSET) for i in range(len(_KEPT_NAMES))],
    rename={f"k{i}": name for i, name in enumerate(_KEPT_NAMES)}, frozen=True, gc=False)


class _Meta(Struct, gc=False):
    name: str | UnsetType = UNSET
    namespace: _Str = UNSET
    resourceVersion: _Str = UNSET
    generation: _Int = UNSET
    creationTimestamp: _Str = UNSET
    deletionTimestamp: _Str = UNSET
    labels: _Labels | None | UnsetType = UNSET
    ownerReferences: list[_Owner] | None | UnsetType = UNSET


class _Resources(Struct, gc=False):
    # Quantities are strings on the wire; typed so, the decode is a third faster than into Any.
    limits: dict[str, str] | None | UnsetType = UNSET
    requests: dict[str, str] | None | UnsetType = UNSET


_resources = msgspec.json.Decoder(_Resources | None).decode


class _ContainerSpec(Struct, gc=False):
    # Kept as the raw JSON text: a group's pods (and every update of one pod) repeat the same
    # resources, so their GPU count is looked up by that text (`_gpus_in`) instead of decoding
    # and scanning two dicts per container per event.
    resources: msgspec.Raw | UnsetType = UNSET
    name: _Str = UNSET


class _Spec(Struct, gc=False):
    nodeName: _Str = UNSET
    containers: list[_ContainerSpec] | None | UnsetType = UNSET
    schedulingGates: Any = UNSET
    resourceClaims: Any = UNSET
    # Read only for an unbound pod (rare: normalize reads it); raw, so a bound pod's cost nothing.
    nodeSelector: msgspec.Raw | UnsetType = UNSET
    affinity: msgspec.Raw | UnsetType = UNSET
    tolerations: msgspec.Raw | UnsetType = UNSET


class _Condition(Struct, frozen=True, gc=False):
    type: _Str = UNSET
    status: _Str = UNSET
    reason: _Str = UNSET
    message: _Str = UNSET
    lastTransitionTime: _Str = UNSET
    lastUpdateTime: _Str = UNSET


class _Detail(Struct, frozen=True, gc=False):
    reason: _Str = UNSET
    message: _Str = UNSET
    startedAt: _Str = UNSET
    finishedAt: _Str = UNSET
    exitCode: _Int = UNSET


class _State(Struct, frozen=True, gc=False):
    waiting: _Detail | None | UnsetType = UNSET
    running: _Detail | None | UnsetType = UNSET
    terminated: _Detail | None | UnsetType = UNSET


class _ContainerStatus(Struct, frozen=True, gc=False):
    name: _Str = UNSET
    ready: bool | None | UnsetType = UNSET
    restartCount: _Int = UNSET
    state: _State | None | UnsetType = UNSET
    lastState: _State | None | UnsetType = UNSET
    allocatedResourcesStatus: Any = UNSET


class _Status(Struct, gc=False):
    phase: _Str = UNSET
    reason: _Str = UNSET
    message: _Str = UNSET
    startTime: _Str = UNSET
    podIP: _Str = UNSET
    conditions: list[_Condition] | None | UnsetType = UNSET
    containerStatuses: list[_ContainerStatus] | None | UnsetType = UNSET
    initContainerStatuses: list[_ContainerStatus] | None | UnsetType = UNSET
    resourceClaimStatuses: Any = UNSET


class PodObject(Struct, gc=False):
    """A pod as the fast path holds it. The reflector fills kind/apiVersion when absent."""

    kind: str | UnsetType = UNSET
    apiVersion: str | UnsetType = UNSET
    metadata: _Meta | UnsetType = UNSET
    spec: _Spec | None | UnsetType = UNSET
    status: _Status | None | UnsetType = UNSET

    @property
    def resource_version(self) -> str:
        m = self.metadata
        return (m.resourceVersion or "") if type(m) is _Meta and type(m.resourceVersion) is str else ""

    def name_of(self) -> str:
        """What `where` names in warnings: namespace/name, as the controller does for dicts."""
        m = self.metadata
        if type(m) is not _Meta:
            return "?"
        return f"{m.namespace or ''}/{m.name or '?'}".lstrip("/")


class PodEvent(Struct, gc=False):
    """An ADDED or MODIFIED watch frame of a pod (other frames take the dict path)."""

    type: str | UnsetType = UNSET
    object: PodObject | UnsetType = UNSET


class _Unclean(Exception):
    """Something `normalize` would warn about or refuse: it reads this pod instead."""


_UNCLEAN = _Unclean()
_EMPTY_DETAIL = _Detail()
_NO_STATE = _State()
_NO_SPEC = _Spec()
_NO_STATUS = _Status()

# Timestamps read cleanly before (RFC3339, parsed): a watch repeats the same ones in every update
# of an object. Bounded by clearing: a refill costs one parse per distinct string.
_TIMES: dict[str, datetime] = {}
_TIMES_MAX = 1 << 16


def _time(value: str | None | UnsetType) -> datetime | None:
    if value is UNSET or value is None or value == "":
        return None
    assert type(value) is str
    t = _TIMES.get(value)
    if t is None:
        try:
            t = kube._parse_time(value)
        except Exception:  # normalize warns (or fails) on it: let it
            raise _UNCLEAN from None
        if kube._not_rfc3339(value):
            raise _UNCLEAN
        if len(_TIMES) >= _TIMES_MAX:
            _TIMES.clear()
        _TIMES[value] = t
    return t


# A timestamp read before, without a call: `_seen(v) or _time(v)` (a datetime is never false).
_seen: Any = _TIMES.get


def _s(value: str | None | UnsetType) -> str:
    return value if type(value) is str else ""


_intern = sys.intern
_builtins: Any = msgspec.to_builtins


def _raw_json(value: Any) -> Any:
    """The builtins of a field kept as raw JSON text, for `normalize` (as the dict path decodes it)."""
    if type(value) is msgspec.Raw:
        return msgspec.json.decode(value)
    raise TypeError(f"unexpected {type(value).__name__}")

# The records are NamedTuples: `tuple.__new__` with every field in order builds one at a quarter of
# the keyword call's cost (a watch builds ~8 per pod event). The asserts keep the field counts honest.
_new: Any = tuple.__new__
assert (len(ContainerFacts._fields), len(PodFacts._fields), len(ObjectRecord._fields), len(Condition._fields),
        len(Ref._fields)) == (12, 18, 10, 5, 4), "a record changed: update the tuples built below"


# Built parts by the decoded Struct (frozen: hashed and compared by value). A watch repeats most of
# a pod's status in every update (conditions, the containers that did not change), and a gang's pods
# share them: each is built once, and the records share the tuples. Bounded by clearing.
_PARTS_MAX = 1 << 14
_CONDITIONS: dict[_Condition, tuple[Condition | None, datetime | None]] = {}
_CONTAINERS: dict[tuple[_ContainerStatus, bool], tuple[ContainerFacts, datetime | None]] = {}


def _condition(c: _Condition) -> tuple[Condition | None, datetime | None]:
    """A pod condition's record (None for a type no claim reads) and its time."""
    ctype = c.type
    if not ctype:
        raise _UNCLEAN
    if ctype not in kube.POD_CONDITIONS:
        return None, None
    cstatus = c.status
    if cstatus not in kube.CONDITION_STATUSES:
        raise _UNCLEAN
    v = c.lastTransitionTime or c.lastUpdateTime
    t = _seen(v) or _time(v)
    assert type(ctype) is str and type(cstatus) is str
    cond: Condition = _new(Condition, (_intern(ctype), _intern(cstatus),
                                       _intern(c.reason) if type(c.reason) is str else "", _s(c.message), t))
    return cond, t


def _container(c: _ContainerStatus, init: bool) -> tuple[ContainerFacts, datetime | None]:
    if c.allocatedResourcesStatus is not UNSET:
        if type(c.allocatedResourcesStatus) is list and c.allocatedResourcesStatus:
            raise _UNCLEAN  # device health: rare, read by normalize
        return _container_facts(c, init)  # (an Any field: not hashable in general)
    key = (c, init)
    found = _CONTAINERS.get(key)
    if found is None:
        found = _container_facts(c, init)
        if len(_CONTAINERS) >= _PARTS_MAX:
            _CONTAINERS.clear()
        _CONTAINERS[key] = found
    return found


def _container_facts(c: _ContainerStatus, init: bool) -> tuple[ContainerFacts, datetime | None]:
    state = c.state if type(c.state) is _State else _NO_STATE
    # The first of waiting, running, terminated present (null counts: it names the state).
    d = state.waiting
    if d is not UNSET:
        which = "waiting"
    else:
        d = state.running
        if d is not UNSET:
            which = "running"
        else:
            d = state.terminated
            which = "terminated" if d is not UNSET else ""
    detail = d if type(d) is _Detail else _EMPTY_DETAIL
    last_state = c.lastState if type(c.lastState) is _State else _NO_STATE
    last = last_state.terminated if type(last_state.terminated) is _Detail else _EMPTY_DETAIL
    v = detail.startedAt or detail.finishedAt
    since = _seen(v) or _time(v)
    v = last.finishedAt
    finished = _seen(v) or _time(v)
    newest = since if finished is None or (since is not None and since > finished) else finished
    exit_code, last_exit = detail.exitCode, last.exitCode
    facts: ContainerFacts = _new(ContainerFacts, (
        _intern(c.name) if type(c.name) is str else "",  # name
        init,
        bool(c.ready),
        c.restartCount or 0,  # restart_count
        which,  # state
        _intern(detail.reason) if type(detail.reason) is str else "",  # state_reason
        _s(detail.message)[:500],  # state_message
        since,  # state_since
        exit_code if type(exit_code) is int else None,  # exit_code
        _intern(last.reason) if type(last.reason) is str else "",  # last_reason
        last_exit if type(last_exit) is int else None,  # last_exit_code
        finished,  # last_finished
    ))
    return facts, newest


# Per contract, the role of a pod's apiVersion (hashing the frozen contract per event costs more
# than the rest of the lookup); the contract is kept as the value so that its id stays its own.
_ROLES: dict[int, tuple[TauGridContract, dict[str, str]]] = {}
# OwnerRefs are frozen and shared: every pod of a RayCluster or Job names the same one; with it, the
# tuple of it alone (a pod's usual `owners`).
_OWNERS: dict[tuple[str, str, str, bool], tuple[OwnerRef, tuple[OwnerRef]]] = {}
# A pod's helpers (`PodFacts.helpers`), one tuple per distinct set: a fleet's pods carry the same sidecars.
_HELPERS: Interner[tuple[str, ...]] = Interner(_PARTS_MAX)


# GPU count by a container's resources JSON text; -1 where `normalize` must read them (a field of
# another JSON type). Bounded by clearing: a fleet has few distinct resource sections.
_GPUS: dict[bytes, int] = {}
_GPUS_MAX = 1 << 12


def _gpus_in(raw: msgspec.Raw) -> int:
    text = bytes(raw)
    n = _GPUS.get(text)
    if n is None:
        try:
            r = _resources(text)
        except msgspec.DecodeError:
            n = -1
        else:
            n = kube.gpus_of(r.limits, r.requests) if r is not None else 0
        if len(_GPUS) >= _GPUS_MAX:
            _GPUS.clear()
        _GPUS[text] = n
    if n < 0:
        raise _UNCLEAN
    return n


# The shared mapping of each distinct set of kept labels, by the decoded Struct (stored with its
# strings interned, so a key costs a few pointers). Bounded by clearing, as kube.shared_labels is.
_BY_LABELS: dict[Any, tuple[Mapping[str, str], tuple[str, str, int]]] = {}
_NO_IDENTITY = ("", "", 0)


def _labels_of(labels: Any) -> tuple[Mapping[str, str], tuple[str, str, int]]:
    """The kept labels (shared) and the pod's identity in its run (`kube.pod_identity`)."""
    found = _BY_LABELS.get(labels)
    if found is None:
        decoded = _builtins(labels)
        kept = {k: v for k, v in decoded.items() if k in kube.KEPT_LABELS}
        found = (kube.shared_labels(kept) if kept else kube._NO_LABELS, kube.identity_of(decoded))
        if len(_BY_LABELS) >= _TIMES_MAX:
            _BY_LABELS.clear()
        _BY_LABELS[_Labels(*(_intern(v) if type(v) is str else v for v in msgspec.structs.astuple(labels)))] = found
    return found


def _role(contract: TauGridContract, api_version: str) -> str:
    held = _ROLES.get(id(contract))
    if held is None or held[0] is not contract:
        held = _ROLES[id(contract)] = (contract, {})
    role = held[1].get(api_version)
    if role is None:
        role = held[1][api_version] = kube._role(contract, "Pod", api_version)
    return role


def _owner(kind: str, name: str, uid: str, controller: bool) -> tuple[OwnerRef, tuple[OwnerRef]]:
    """The shared OwnerRef, and the shared tuple of it alone."""
    key = (kind, name, uid, controller)
    o = _OWNERS.get(key)
    if o is None:
        if len(_OWNERS) >= _TIMES_MAX:
            _OWNERS.clear()
        ref = OwnerRef(kind=_intern(kind), name=_intern(name), uid=_intern(uid[:64]), controller=controller)
        o = _OWNERS[key] = (ref, (ref,))
    return o


def _helpers(names: list[str]) -> tuple[str, ...]:
    return _HELPERS(tuple(names))


def _build(p: PodObject, contract: TauGridContract) -> ObjectRecord:
    meta = p.metadata
    if type(meta) is not _Meta or not meta.name or p.kind != "Pod":
        raise _UNCLEAN  # normalize raises MalformedObject (or reads another kind)
    api_version = _intern(p.apiVersion) if type(p.apiVersion) is str else ""  # ("v1": one string, not one a pod)
    if _role(contract, api_version):
        raise _UNCLEAN
    name = meta.name
    assert type(name) is str
    ns = meta.namespace or ""
    if "/" in name or ".." in name or "/" in ns or ".." in ns:
        raise _UNCLEAN
    v = meta.creationTimestamp
    created = _seen(v) or _time(v)
    newest = created
    labels, identity = _labels_of(meta.labels) if type(meta.labels) is _Labels else (kube._NO_LABELS, _NO_IDENTITY)
    owners = []
    alone: tuple[OwnerRef, ...] = ()
    for o in meta.ownerReferences or ():
        if not o.kind or not o.name:
            raise _UNCLEAN
        assert type(o.kind) is str and type(o.name) is str
        ref, alone = _owner(o.kind, o.name, o.uid if type(o.uid) is str else "", bool(o.controller))
        owners.append(ref)
    deleting = bool(meta.deletionTimestamp)
    if deleting:
        t = _time(meta.deletionTimestamp)
        if t is not None and (newest is None or t > newest):
            newest = t
    status = p.status if type(p.status) is _Status else _NO_STATUS
    spec = p.spec if type(p.spec) is _Spec else _NO_SPEC
    conditions = []
    for c in status.conditions or ():
        found = _CONDITIONS.get(c)
        if found is None:
            found = _condition(c)
            if len(_CONDITIONS) >= _PARTS_MAX:
                _CONDITIONS.clear()
            _CONDITIONS[c] = found
        cond, t = found
        if cond is not None:
            conditions.append(cond)
            if t is not None and (newest is None or t > newest):
                newest = t
    containers = []
    for statuses, init in ((status.initContainerStatuses, True), (status.containerStatuses, False)):
        for cs in statuses or ():
            cfacts, t = _container(cs, init)
            containers.append(cfacts)
            if t is not None and (newest is None or t > newest):
                newest = t
    phase = status.phase
    if phase is UNSET or phase is None:
        phase = ""
    elif phase not in kube.POD_PHASES:
        raise _UNCLEAN
    if type(spec.resourceClaims) is list and spec.resourceClaims:
        raise _UNCLEAN  # DRA claim names: rare, read by normalize
    if not spec.nodeName and (spec.nodeSelector is not UNSET or spec.affinity is not UNSET
                              or spec.tolerations is not UNSET):
        raise _UNCLEAN  # an unbound pod's placement: read by normalize
    v = status.startTime
    start = _seen(v) or _time(v)
    if start is not None and (newest is None or start > newest):
        newest = start
    gpus = 0
    without: list[str] = []  # app containers that request no GPU: helpers where another does
    for cspec in spec.containers or ():
        r = cspec.resources
        g = _gpus_in(r) if r is not UNSET else 0
        gpus += g
        if not g and type(cspec.name) is str:
            without.append(_intern(cspec.name))
    gates = spec.schedulingGates
    facts = _new(PodFacts, (
        _intern(phase),  # phase
        _intern(status.reason) if type(status.reason) is str else "",  # reason
        _s(status.message)[:500],  # message
        _intern(spec.nodeName) if type(spec.nodeName) is str else "",  # node_name
        gpus,
        start,  # start_time
        tuple(containers),
        deleting,
        labels.get(kube.RAY_NODE_TYPE_LABEL, ""),  # ray_node_type (shared_labels interned it)
        _s(status.podIP),  # pod_ip
        (),  # claims
        (),  # unhealthy_devices
        tuple(str(g.get("name")) for g in gates if type(g) is dict) if type(gates) is list else (),  # scheduling_gates
        *identity,  # role, rank, attempt
        _helpers(without) if gpus and without else (),  # helpers
        None,  # placement (an unbound pod with one takes normalize's path)
    ))
    generation = meta.generation
    record: ObjectRecord = _new(ObjectRecord, (
        _new(Ref, ("Pod", _intern(ns), name, "")),  # ref
        api_version,
        meta.resourceVersion or "",  # resource_version
        generation if type(generation) is int else None,  # generation
        created,
        labels,
        alone if len(owners) == 1 else tuple(owners),  # owners
        tuple(conditions),
        facts,
        newest,
    ))
    return record


def pod_record(p: PodObject, contract: TauGridContract) -> ObjectRecord | None:
    """The record of a clean pod; None where `normalize_pod` must hand it to `normalize` (the
    watch's hot path: no Normalized, no problem list)."""
    try:
        return _build(p, contract)
    except _Unclean:
        return None


def normalize_pod(p: PodObject, contract: TauGridContract | None = None, *,
                  where: str | None = None) -> kube.Normalized:
    """`normalize` for a typed pod: the same record, warnings and errors, without the dict walk.
    `where` (what warnings name) defaults to "Pod namespace/name", built only when one is needed."""
    contract = contract or kube.DEFAULT_CONTRACT
    try:
        return kube.Normalized(_build(p, contract), [])
    except _Unclean:
        return kube.normalize(_builtins(p, enc_hook=_raw_json), contract,
                              where=f"Pod {p.name_of()}" if where is None else where)


kube.TYPED_NORMALIZERS[PodObject] = normalize_pod
