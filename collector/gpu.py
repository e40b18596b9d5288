"""GPU evidence per pod, from node agents or dcgm-exporter (records only; pure).

The claims read these through `gpu_summary`: how many GPUs the kubelet actually allocated to a
run's pods (scheduled), whether any is lost (blocked stage / running), and whether they look busy
but cold, the hang hint (progressing). Readings older than the freshness bound are not used.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import Field, dataclass, fields
from datetime import datetime, timedelta
from typing import Any, ClassVar, cast

from collector.gpudevice import (
    _FAULT_BITS,
    _HANG,
    _LAYOUT,
    _LOST,
    _NO_INDEX,
    _ODD,
    _SHARED,
    _SHARED_MAX,
    _SUMMARY_BITS,
    GpuDevice,
    Readings,
    _Frozen,
    _Rare,
    energy_window,
    fault_free,
    readings,
)
from collector.gpupack import (
    _ASIDE,
    _DEVICE_BITS,
    _ECC,
    _ENERGY,
    _HEAD,
    _INDEX,
    _KIND_SHIFT,
    _KINDS,
    _LIMIT,
    _MASK,
    _MIG,
    _MIG_SEEN,
    _POWER,
    _STATE_BITS,
    _UTIL,
    _UUIDS_AT,
    _XIDS_SEEN,
    Columns,
    NodeColumns,
    _Aside,
    _col,
    _Column,
    _layout,
    _pack,
    _reasons_aside,
    _uuid_text,
    sent_problem,
)

__all__ = ["Columns", "GpuDevice", "GpuSummary", "NodeColumns", "PodGpuEvidence", "Readings", "clock_reasons_at",
           "compared", "device_at", "energy_window", "energy_windows", "fault_free", "faulty", "gpu_summary",
           "held_state", "readings", "readings_of", "same_held_bytes", "sampled", "sendable", "uuid_at", "uuids"]


@dataclass(frozen=True)
class _PodFields:
    """`PodGpuEvidence`'s fields, in order (`dataclasses.fields`, `replace`, `asdict` read them)."""

    namespace: str
    pod: str
    node: str
    source: str  # "agent" | "dcgm"
    read_at: datetime
    devices: tuple[GpuDevice, ...]
    containers: tuple[str, ...] = ()


_SHARED_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}
_POD_NAMES = tuple(f.name for f in fields(_PodFields))


class _PodRecord(_Frozen):
    __slots__ = ()
    # the fields on a base, not the class: orjson refuses the record instead of reading `devices` and
    # the packed readings as borrowed (gpudevice._DeviceRecord says why)
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]] = _PodFields.__dataclass_fields__


class PodGpuEvidence(_PodRecord):
    """The devices one pod holds on its node, as one source saw them at `read_at` (reader's clock): a
    frozen record with `_PodFields`' fields, value equality and hashing."""

    __slots__ = ("namespace", "pod", "node", "source", "read_at", "containers", "_p", "_x")
    __match_args__: ClassVar[tuple[str, ...]] = _POD_NAMES
    namespace: str
    pod: str
    node: str
    source: str
    read_at: datetime
    containers: tuple[str, ...]
    _p: bytes
    _x: _Aside | None

    def __init__(self, namespace: str, pod: str, node: str, source: str, read_at: datetime,
                 devices: tuple[GpuDevice, ...], containers: tuple[str, ...] = ()) -> None:
        self._set(namespace, pod, node, source, read_at, containers, *_pack(devices))

    @classmethod
    def from_columns(cls, namespace: str, pod: str, node: str, source: str, read_at: datetime, table: NodeColumns,
                     idx: Sequence[int], containers: tuple[str, ...] = ()) -> PodGpuEvidence | None:
        """The record `cls(...)` makes of the devices `GpuDevice` would make of `table`'s at `idx`, without
        making them (the agent poller's path for what every agent sends every pass); None where one of
        them does not pack (`NodeColumns`: then make the devices)."""
        packed = table.packed(idx)
        if packed is None:
            return None
        e = object.__new__(cls)
        e._set(namespace, pod, node, source, read_at, containers, *packed)
        return e

    @classmethod
    def from_sent(cls, namespace: str, pod: str, node: str, source: str, read_at: datetime, p: bytes,
                  reasons: Sequence[tuple[str, ...]] | None = None, containers: tuple[str, ...] = ()
                  ) -> PodGpuEvidence | None:
        """The record a source sent packed (an agent's version 4 document), each device's clocks-event
        reasons beside it (None: none); None where `p` is not one `NodeColumns` could have packed
        (`gpupack.sent_problem` says why), or `reasons` is not one a device."""
        if (reasons is not None and (len(p) < _HEAD.size or len(reasons) != _HEAD.unpack_from(p)[0])) \
                or sent_problem(p) is not None:
            return None
        e = object.__new__(cls)
        e._set(namespace, pod, node, source, read_at, containers, p, _reasons_aside(reasons))
        return e

    def _set(self, namespace: str, pod: str, node: str, source: str, read_at: datetime,
             containers: tuple[str, ...], p: bytes, x: _Aside | None) -> None:
        if type(containers) is tuple and all(type(c) is str for c in containers):  # (pods alike: ("main",))
            shared = _SHARED_NAMES.get(containers)
            if shared is not None:
                containers = shared
            elif len(_SHARED_NAMES) < _SHARED_MAX:
                containers = _SHARED_NAMES.setdefault(containers, containers)
        put = object.__setattr__
        put(self, "namespace", namespace)
        put(self, "pod", pod)
        put(self, "node", node)
        put(self, "source", source)
        put(self, "read_at", read_at)
        put(self, "containers", containers)
        put(self, "_p", p)
        put(self, "_x", x)

    @property
    def devices(self) -> tuple[GpuDevice, ...]:
        return _devices(self)

    @property
    def device_count(self) -> int:
        return cast(int, _HEAD.unpack_from(self._p)[0])

    def _fields(self) -> tuple[object, ...]:
        return (self.namespace, self.pod, self.node, self.source, self.read_at, self.devices, self.containers)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, PodGpuEvidence)
        if (self.namespace, self.pod, self.node, self.source, self.read_at, self.containers) != \
                (other.namespace, other.pod, other.node, other.source, other.read_at, other.containers):
            return False
        return (self._p == other._p and self._x == other._x) or self.devices == other.devices

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"PodGpuEvidence({', '.join(f'{n}={v!r}' for n, v in zip(_POD_NAMES, self._fields(), strict=True))})"


def sendable(e: PodGpuEvidence) -> tuple[bytes, list[tuple[str, ...]] | None] | None:
    """`e`'s record and each device's clocks-event reasons (None: none), as a source sends them packed
    (`PodGpuEvidence.from_sent` reads them back); None where `e` holds more than they can say (a UUID
    kept aside, an XID, a MIG profile, a value kept aside) or its record is not one `from_sent` takes."""
    x = e._x
    reasons: list[tuple[str, ...]] | None = None
    if x is not None:
        rares, names = x
        if names is not None or rares is None:
            return None
        reasons = []
        for r in rares:
            if r is not None and (r[0] or r[2] or r[3] or r[4] or not r[1]):
                return None
            reasons.append(() if r is None else r[1])
    return (e._p, reasons) if sent_problem(e._p) is None else None


def uuid_at(e: PodGpuEvidence, i: int) -> str:
    """Device `i`'s UUID."""
    n, _, lay = _layout(e._p)
    return _uuid(e, i, _col(e._p, lay[_MASK], n)[i])


def _uuid(e: PodGpuEvidence, i: int, m: int) -> str:
    kind = m >> _KIND_SHIFT & 3
    if kind == _ASIDE:
        assert e._x is not None and e._x[1] is not None
        return cast(str, e._x[1][i])
    at = _UUIDS_AT + 16 * i
    return ("MIG-" if kind == _MIG else "GPU-") + _uuid_text(e._p[at:at + 16])


def uuids(e: PodGpuEvidence) -> tuple[str, ...]:
    """Every device's UUID, in order."""
    n, _, lay = _layout(e._p)
    return tuple(_uuid(e, i, m) for i, m in enumerate(_col(e._p, lay[_MASK], n)))


def _devices(e: PodGpuEvidence) -> tuple[GpuDevice, ...]:
    p = e._p
    n, _, lay = _layout(p)
    cols = [_col(p, c, n) for c in lay]
    rares = e._x[0] if e._x is not None else None
    out = []
    new, put, pack = object.__new__, object.__setattr__, _LAYOUT.pack
    for i in range(n):
        m = cols[0][i]
        d = new(GpuDevice)
        put(d, "uuid", _uuid(e, i, m))
        put(d, "_m", m & _DEVICE_BITS)
        put(d, "_b", pack(*[c[i] for c in cols[1:]]))
        put(d, "_rare", None if rares is None else rares[i])
        out.append(d)
    return tuple(out)


def device_at(e: PodGpuEvidence, i: int) -> GpuDevice:
    """Device `i` (built: the record holds none)."""
    return _devices(e)[i]


def _keys(e: PodGpuEvidence, n: int, any_: int, masks: tuple[int, ...] | None = None) -> tuple[object, ...]:
    """Each device's UUID as a key telling devices apart: its 16 bytes where a canonical `GPU-<uuid>`,
    else its text (two keys are equal exactly where the UUIDs are)."""
    if not any_ & _KINDS:
        return cast(tuple[bytes, ...], _raws(n).unpack_from(e._p, _UUIDS_AT))
    names = e._x[1] if e._x is not None else None
    if names is not None and names.count(None) == 0:  # (every UUID kept aside: their text)
        return names
    p = e._p
    if masks is None:
        masks = _masks(e)
    return tuple(p[_UUIDS_AT + 16 * i:_UUIDS_AT + 16 * i + 16] if not m & _KINDS else _uuid(e, i, m)
                 for i, m in enumerate(masks))


def _raws(n: int) -> struct.Struct:
    st = _RAWS.get(n)
    if st is None:
        st = struct.Struct(f"<{'16s' * n}")
        if len(_RAWS) < _SHARED_MAX:
            _RAWS[n] = st
    return st


_RAWS: dict[int, struct.Struct] = {}


def faulty(e: PodGpuEvidence) -> list[GpuDevice]:
    """The devices with a fault signal (not `fault_free`), in order: what `claims.workrisk` reads on
    every evaluation (a pod whose bits say none at once; a device built only where one may be)."""
    p = e._p
    n, any_, lay = _layout(p)
    if not any_ & (_FAULT_BITS | _XIDS_SEEN):
        return []
    rares = e._x[0] if e._x is not None else None
    devs = _devices(e)
    return [d for i, (m, d) in enumerate(zip(_col(p, lay[_MASK], n), devs, strict=True))
            if (m & _FAULT_BITS or (rares is not None and rares[i] is not None)) and not fault_free(d)]


def readings_of(e: PodGpuEvidence) -> list[Readings]:
    """Each device's readings (`readings`), in order, from the columns."""
    p = e._p
    n, any_, lay = _layout(p)
    if any_ & _ODD:
        return [readings(d) for d in _devices(e)]
    if not n:
        return []
    cols, masks, every = _reading_cols(p, n, any_, lay)
    out = cast(list[Readings], list(zip(*(c if c is not None else (None,) * n for c in cols), strict=True)))
    for i, m in enumerate(masks or ()):
        if m & 0x7FF != every:
            out[i] = cast(Readings, tuple(None if m >> j & 1 else v for j, v in enumerate(out[i])))
    return out


def _reading_cols(p: bytes, n: int, any_: int, lay: tuple[_Column, ...]) -> tuple[list[tuple[Any, ...] | None],
                                                                      tuple[int, ...] | None, int]:
    """A record's 11 reading columns (None: a reading no device has), its devices' masks where a reading
    is absent on some device (None: every reading on every device), and the readings absent on all."""
    cols: list[tuple[Any, ...] | None] = [_col(p, c, n) for c in lay[_UTIL:]]
    if not any_ & 0x7FF:
        return cols, None, 0
    masks = _col(p, lay[_MASK], n)
    every = 0x7FF
    for m in masks:
        every &= m
    for j in range(11):
        if every >> j & 1:
            cols[j] = None
    return cols, masks, every


def compared(e: PodGpuEvidence) -> list[tuple[object, int, Readings]]:
    """The devices the fail-slow comparison reads (`claims.gpuspread`: not lost, not shared, no MIG
    profile), each as (a key telling UUIDs apart, as `_keys`; its place; its readings), in order."""
    p = e._p
    n, any_, lay = _layout(p)
    masks = _col(p, lay[_MASK], n)
    keys = _keys(e, n, any_, masks)
    rs = readings_of(e)
    if not any_ & (_ODD | _LOST | _SHARED | _MIG_SEEN):
        return list(zip(keys, range(n), rs, strict=True))
    return [(keys[i], i, rs[i]) for i, d in enumerate(_devices(e)) if not d.lost and not d.shared and not d.mig_profile]


def reading_columns(e: PodGpuEvidence) -> tuple[bytes, list[tuple[Any, ...] | None]] | None:
    """What `compared` gives of a record whose devices it reads all alike, column by column: the
    devices' keys one after another (16 bytes each), and each of `readings`' 11 values as a column
    (None: absent on every device). None where it would not read them alike: a device lost, shared, a
    MIG instance or odd, a UUID not canonical, a reading present on some devices only."""
    p = e._p
    n, any_, lay = _layout(p)
    if not n or any_ & (_ODD | _LOST | _SHARED | _MIG_SEEN | _KINDS):
        return None
    cols, masks, every = _reading_cols(p, n, any_, lay)
    if masks is not None and (any_ ^ every) & 0x7FF:
        return None
    return p[_UUIDS_AT:_UUIDS_AT + 16 * n], cols


def clock_reasons_at(e: PodGpuEvidence, i: int) -> tuple[str, ...]:
    """Device `i`'s clocks-event reasons (from the rare fields beside)."""
    r = e._x[0][i] if e._x is not None and e._x[0] is not None else None
    return () if r is None else r[1]


def energy_windows(e: PodGpuEvidence) -> list[tuple[bool, tuple[float, float, float] | None]]:
    """Each device's (shared or a MIG instance, `energy_window`), in order (`claims.energy`, every
    evaluation: from the columns)."""
    p = e._p
    n, any_, lay = _layout(p)
    if any_ & (_ODD | _SHARED | _MIG_SEEN):
        return [(bool(d.shared or d.mig_profile), energy_window(d)) for d in _devices(e)]
    js, froms, tos = (_col(p, c, n) for c in lay[_ENERGY:_ENERGY + 3])
    if not any_ & 0x700:
        return [(False, w) for w in zip(js, froms, tos, strict=True)]
    return [(False, None if m & 0x700 else (js[i], froms[i], tos[i]))
            for i, m in enumerate(_col(p, lay[_MASK], n))]


def energy_columns(e: PodGpuEvidence) -> tuple[Sequence[float], Sequence[float], Sequence[float]] | None:
    """Every device's energy window as three columns (joules, from, to: `energy_window`'s), where each
    device is alone (neither shared nor a MIG instance) and has one; None otherwise, and for a pod of
    no device (`energy_windows` says which device and why). `claims.energy` on every evaluation: a run
    of 80 GPUs read without a tuple a device."""
    p = e._p
    n, any_, lay = _layout(p)
    if not n or any_ & (_ODD | _SHARED | _MIG_SEEN | 0x700):
        return None
    js, froms, tos = (_col(p, c, n) for c in lay[_ENERGY:_ENERGY + 3])
    return js, froms, tos


Sampled = tuple[str, int | None, float | None, float | None, tuple[int, ...], tuple[tuple[int, float], ...]]


def sampled(e: PodGpuEvidence) -> list[Sampled]:
    """Each device's (UUID, index, utilization, power, XIDs, XID ages), in order: what the ADX rows read
    of every pod on every pass (`planes.node_agents.gpu_records`), from the columns."""
    p = e._p
    n, any_, lay = _layout(p)
    if any_ & _ODD:
        return [(d.uuid, d.index, d.utilization, d.power_w, d.xids, d.xid_ages) for d in _devices(e)]
    masks = _col(p, lay[_MASK], n)
    ix, ut, pw = _col(p, lay[_INDEX], n), _col(p, lay[_UTIL], n), _col(p, lay[_POWER], n)
    rares = e._x[0] if e._x is not None else None
    out: list[Sampled] = []
    for i, m in enumerate(masks):
        r = None if rares is None else rares[i]
        out.append((_uuid(e, i, m), None if m & _NO_INDEX else ix[i], None if m & 1 else ut[i],
                    None if m & 4 else pw[i], () if r is None else r[0], () if r is None else r[2]))
    return out


def held_state(e: PodGpuEvidence) -> object:
    """What `planes.node_agents.same_devices` compares of `e`'s devices (UUID, index, lost, hang hint,
    XIDs, MIG profile, row remaps, ECC count), in one value from the columns; None where a value kept
    aside makes the devices the only way to tell."""
    p = e._p
    n, any_, lay = _layout(p)
    if any_ & _ODD:
        return None
    rares = e._x[0] if e._x is not None else None
    # of the rare fields, the XIDs and MIG profile: a throttle reason or an XID's age alone is no state
    # (a power cap on and off pass after pass re-evaluated every run it came and went on)
    state = None if rares is None or not any_ & (_XIDS_SEEN | _MIG_SEEN) else \
        tuple(None if r is None or (type(r[0]) is tuple and not r[0] and type(r[3]) is str and not r[3])
              else (r[0], r[3]) for r in rares)
    return (n, p[_UUIDS_AT:_UUIDS_AT + 16 * n], e._x[1] if e._x is not None else None,
            tuple(m & _STATE_BITS for m in _col(p, lay[_MASK], n)), _col(p, lay[_INDEX], n), _col(p, lay[_ECC], n),
            state)


def same_held_bytes(a: PodGpuEvidence, b: PodGpuEvidence) -> bool:
    """Whether every byte `held_state` reads of `a` and of `b` is the same (the header, the UUIDs, the
    bits, index and ECC columns; no UUID, XID or MIG profile kept aside): their held states are then
    equal, found without building either (a GPU pass asks it of every pod). False says nothing: compare
    `held_state`."""
    pa, pb = a._p, b._p
    xa, xb = a._x, b._x
    if (xa is not None and xa[1] is not None) or (xb is not None and xb[1] is not None) or \
            pa[:_HEAD.size] != pb[:_HEAD.size]:
        return False
    _, any_, lay = _layout(pa)
    util = lay[_UTIL]
    if any_ & (_ODD | _XIDS_SEEN | _MIG_SEEN) or util is None:  # (rare fields beside but these: no state)
        return False
    return pa[_HEAD.size:util[0]] == pb[_HEAD.size:util[0]]


@dataclass(frozen=True, slots=True)
class GpuSummary:
    pods: int  # pods with fresh GPU evidence
    allocated: int  # devices allocated to them
    lost: tuple[str, ...]  # UUIDs of lost GPUs under them
    hang_hint: tuple[str, ...]  # UUIDs busy-but-cold for the sustain window
    utilization: float | None  # mean ratio over devices that report it
    power_w: float | None  # mean watts per device
    power_limit_w: float | None
    xids: tuple[int, ...]
    read_at: datetime | None  # the oldest reading used


def gpu_summary(evidence: Iterable[PodGpuEvidence], pods: Iterable[tuple[str, str]], now: datetime,
                max_age: timedelta) -> GpuSummary:
    """Fresh GPU evidence for the (namespace, pod) pairs of one run; one record per pod (newest)."""
    wanted = set(pods)
    newest: dict[tuple[str, str], PodGpuEvidence] = {}
    for e in evidence:
        key = (e.namespace, e.pod)
        if key in wanted and now - e.read_at <= max_age and (key not in newest or e.read_at > newest[key].read_at):
            newest[key] = e
    # Every device of every pod, by column (every run's evaluation: no device object built); a device
    # two pods name (a shared GPU) counts once, in its first place, with the last pod's readings.
    recs = list(newest.values())
    seen = total = 0
    keys: set[object] = set()
    utils_at: list[float] = []
    powers_at: list[float] = []
    limits_at: list[float] = []
    for e in recs:  # (most runs: every reading there, nothing to name: the three columns in one go)
        p = e._p
        n, flags, any_ = _HEAD.unpack_from(p)
        seen |= any_
        total += n
        keys.update(_keys(e, n, any_))
        rd = _SUMMED_BY.get((n, flags)) or _summed_reader(p, n, flags)
        v = rd[0].unpack_from(p, rd[1])
        a, b = rd[2], rd[3]
        utils_at += v[:a] * n if a == 1 else v[:a]
        powers_at += v[a:b] * n if b - a == 1 else v[a:b]
        limits_at += v[b:] * n if len(v) - b == 1 else v[b:]
    if len(keys) != total or seen & (_SUMMARY_BITS | _XIDS_SEEN):
        return _gpu_summary(newest)
    return GpuSummary(
        pods=len(newest),
        allocated=total,
        lost=(),
        hang_hint=(),
        utilization=sum(utils_at) / len(utils_at) if utils_at else None,
        power_w=sum(powers_at) / len(powers_at) if powers_at else None,
        power_limit_w=sum(limits_at) / len(limits_at) if limits_at else None,
        xids=(),
        read_at=min((e.read_at for e in recs), default=None),
    )


_SUMMED_BY: dict[tuple[int, int], tuple[struct.Struct, int, int, int]] = {}


def _summed_reader(p: bytes, n: int, flags: int) -> tuple[struct.Struct, int, int, int]:
    """The utilization, SM activity (skipped), power and power limit columns in one struct: (it, its
    offset, where power starts in what it gives, where the limit starts)."""
    _, _, lay = _layout(p)
    util, sm, power, limit = (cast(tuple[int, struct.Struct, bool], c) for c in lay[_UTIL:_LIMIT + 1])
    k = [1 if c[2] else n for c in (util, sm, power, limit)]
    rd = (struct.Struct(f"<{k[0]}d{8 * k[1]}x{k[2]}d{k[3]}d"), util[0], k[0], k[0] + k[2])
    if len(_SUMMED_BY) < _SHARED_MAX:
        _SUMMED_BY[(n, flags)] = rd
    return rd


def _masks(e: PodGpuEvidence) -> tuple[int, ...]:
    n, _, lay = _layout(e._p)
    return _col(e._p, lay[_MASK], n)


def _gpu_summary(newest: dict[tuple[str, str], PodGpuEvidence]) -> GpuSummary:
    """`gpu_summary` where a device is named twice, lacks a reading, is lost, hangs or has XIDs."""
    masks: list[int] = []
    utils_at: list[float] = []
    powers_at: list[float] = []
    limits_at: list[float] = []
    rares: list[_Rare | None] = []
    starts: list[tuple[int, PodGpuEvidence]] = []
    where: dict[object, int] = {}
    for e in newest.values():
        p = e._p
        n, any_, lay = _layout(p)
        ms = _col(p, lay[_MASK], n)
        base = len(masks)
        starts.append((base, e))
        masks += ms
        utils_at += _col(p, lay[_UTIL], n)
        powers_at += _col(p, lay[_POWER], n)
        limits_at += _col(p, lay[_LIMIT], n)
        rares += e._x[0] if e._x is not None and e._x[0] is not None else (None,) * n
        where.update(zip(_keys(e, n, any_, ms), range(base, base + n), strict=True))
    lost: list[str] = []
    hung: list[str] = []
    xids: set[int] = set()
    utils: list[float] = []
    powers: list[float] = []
    limits: list[float] = []

    def owner(o: int) -> tuple[PodGpuEvidence, int]:
        base, e = next(s for s in reversed(starts) if s[0] <= o)
        return e, o - base

    for o in (range(len(masks)) if len(where) == len(masks) else where.values()):
        m = masks[o]
        r = rares[o]
        if r is not None:
            xids.update(r[0])
        if not m & _SUMMARY_BITS:  # the three readings there, not lost, no hang hint, nothing kept aside
            utils.append(utils_at[o])
            powers.append(powers_at[o])
            limits.append(limits_at[o])
            continue
        if m & _ODD:
            d = device_at(*owner(o))
            ut_, pw_, lim_, lo, hh = d.utilization, d.power_w, d.power_limit_w, d.lost, d.hang_hint
        else:
            ut_ = None if m & 1 else utils_at[o]
            pw_ = None if m & 4 else powers_at[o]
            lim_ = None if m & 8 else limits_at[o]
            lo, hh = m & _LOST != 0, m & _HANG != 0
        if ut_ is not None:
            utils.append(ut_)
        if pw_ is not None:
            powers.append(pw_)
        if lim_ is not None:
            limits.append(lim_)
        if lo:
            lost.append(uuid_at(*owner(o)))
        if hh:
            hung.append(uuid_at(*owner(o)))
    return GpuSummary(
        pods=len(newest),
        allocated=len(where),
        lost=tuple(sorted(lost)),
        hang_hint=tuple(sorted(hung)),
        utilization=sum(utils) / len(utils) if utils else None,
        power_w=sum(powers) / len(powers) if powers else None,
        power_limit_w=sum(limits) / len(limits) if limits else None,
        xids=tuple(sorted(xids)),
        read_at=min((e.read_at for e in newest.values()), default=None),
    )
