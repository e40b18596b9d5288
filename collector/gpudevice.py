"""One GPU (or MIG instance) as a source saw it, packed (`GpuDevice`); `collector.gpu` packs a pod's devices
together and re-exports these names (records only; pure)."""

from __future__ import annotations

import struct
from dataclasses import Field, FrozenInstanceError, dataclass, fields
from sys import intern
from typing import Any, ClassVar, Self, cast


@dataclass(frozen=True)
class _Fields:
    """`GpuDevice`'s fields, in order, with their defaults (`dataclasses.fields`, `replace` and `asdict`
    read them: the device is a dataclass to them)."""

    uuid: str  # GPU or MIG UUID
    index: int | None = None
    utilization: float | None = None  # ratio 0–1
    sm_active: float | None = None  # ratio 0–1
    power_w: float | None = None
    power_limit_w: float | None = None
    lost: bool = False
    hang_hint: bool = False
    xids: tuple[int, ...] = ()  # codes seen recently on this GPU
    mig_profile: str = ""
    shared: bool = False  # several pods use it (time-slicing, MPS, a shared claim): its readings are all of theirs
    sm_clock_hz: float | None = None
    clock_reasons: tuple[str, ...] = ()  # clocks-event (throttle) reasons holding its clocks down, by name
    memory_util: float | None = None  # ratio 0–1 of time device memory was read or written (bandwidth use)
    pcie_bps: float | None = None  # PCIe bytes/s, TX + RX
    nvlink_bps: float | None = None  # NVLink bytes/s over all links, TX + RX
    # The energy counter's window: joules used from `energy_from_s` to `energy_to_s` seconds before the
    # record's `read_at` (the agent's clock turned into the reader's); None: no counter, or one point yet.
    energy_j: float | None = None
    energy_from_s: float | None = None
    energy_to_s: float | None = None
    # NVML's remapped rows: a remap waits for the next GPU reset / a remap failed (replace the GPU)
    remap_pending: bool = False
    remap_failed: bool = False
    # when the agent first saw each XID code: (code, seconds before the record's `read_at`), by code
    xid_ages: tuple[tuple[int, float], ...] = ()
    ecc_uncorrected: int | None = None  # NVML's volatile uncorrected ECC errors (since the GPU's last reset)


# A controller holds every GPU pod's newest evidence (issue 30: 50k pods), so a device's readings are
# packed: one bytes a device (the index and ECC count where small, the readings as doubles), one int of
# bits (a reading absent, a flag set; shared by devices alike) and, only where it has any, one tuple of
# its rarer fields (shared by devices alike too: most have none; the rest mostly a clocks-event
# reason). The 22 slots and 11 float objects took ~470 B a device; this ~190. Every field reads back
# what was given: NaN, -0.0, ±inf as they were; a value of another type than its field's (an int
# reading) is kept aside as is. A reading costs ~60 ns instead of ~6: the per-evaluation readers
# (`gpu_summary`, `fault_free`, `energy_window`, `readings`) read the packed fields in one go.
_LAYOUT = struct.Struct("<hH11d")  # index, ECC count, the readings (in `_READINGS`' order)
_D = struct.Struct("<d").unpack_from
_H = struct.Struct("<h").unpack_from
_U = struct.Struct("<H").unpack_from
_ALL = struct.Struct("<11d").unpack_from  # the readings (`readings`), at offset 4
_SUMMED = struct.Struct("<d8xdd").unpack_from  # utilization, power, power limit (`gpu_summary`), at offset 4
_WINDOW = struct.Struct("<ddd").unpack_from  # energy_j, energy_from_s, energy_to_s (`energy_window`), at 68
# `_m`: bit i (0–10) reading i absent; then (the properties spell these out as numbers, for speed):
_NO_INDEX, _NO_ECC = 1 << 11, 1 << 12  # not packed (None, or kept aside)
_LOST, _HANG, _SHARED, _REMAP_PENDING, _REMAP_FAILED = (1 << b for b in range(13, 18))
_ODD = 1 << 18  # some value kept aside (the rare tuple's last item: (field, value), ...)
_ECC_SEEN = 1 << 19  # the ECC count packed is not 0 (`fault_free`)
_FAULT_BITS = _LOST | _REMAP_PENDING | _REMAP_FAILED | _ECC_SEEN | _ODD
_SUMMARY_BITS = 1 | 4 | 8 | _LOST | _HANG | _ODD  # what `gpu_summary` reads otherwise than in one go
_NAMES = tuple(f.name for f in fields(_Fields))
_READINGS = ("utilization", "sm_active", "power_w", "power_limit_w", "sm_clock_hz", "memory_util", "pcie_bps",
             "nvlink_bps", "energy_j", "energy_from_s", "energy_to_s")
# the rare tuple: (xids, clock_reasons, xid_ages, mig_profile, ((field, value kept aside), ...))
_Rare = tuple[tuple[int, ...], tuple[str, ...], tuple[tuple[int, float], ...], str, tuple[tuple[str, object], ...]]
_SHARED_RARE: dict[_Rare, _Rare] = {}
_MASKS: dict[int, int] = {}
_ABSENT: dict[int, tuple[int, ...]] = {}  # the readings a mask says absent, by position (at most 2,048)
_SHARED_MAX = 4096  # each: bounded (a hostile peer's names fill it, and later ones are then held unshared)
_NAN = object()  # NaN readings compare equal to each other (hashable; the dataclass's depended on identity)


class _Frozen:
    """A frozen record's guards, shared by `GpuDevice` and `gpu.PodGpuEvidence`: `__init__` sets each slot
    through object.__setattr__, nothing assigns or deletes one after; it pickles and copies as its class
    called with `_fields()`. (No slots of its own: the records' stay as they were, and no `__dict__`.)"""

    __slots__ = ()

    def _fields(self) -> tuple[object, ...]:
        raise NotImplementedError

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[type[Self], tuple[object, ...]]:
        return self.__class__, self._fields()


class _DeviceRecord(_Frozen):
    # `dataclasses` finds a record's fields along its MRO; orjson looks in the class's own dict only and
    # would take each field's value as borrowed, but a packed record's readings are properties that make
    # a new float on each read (freed under orjson: the process crashes). Held here, the fields serve
    # `fields`, `replace` and `asdict`, and orjson refuses the record with a TypeError instead.
    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]] = _Fields.__dataclass_fields__


class GpuDevice(_DeviceRecord):
    """One GPU (or MIG instance) as a source saw it: a frozen record with `_Fields`' fields, value
    equality and hashing (NaN readings equal to each other)."""

    __slots__ = ("uuid", "_m", "_b", "_rare")
    __match_args__: ClassVar[tuple[str, ...]] = _NAMES
    uuid: str
    _m: int
    _b: bytes
    _rare: _Rare | None

    def __init__(self, uuid: str, index: int | None = None, utilization: float | None = None,
                 sm_active: float | None = None, power_w: float | None = None, power_limit_w: float | None = None,
                 lost: bool = False, hang_hint: bool = False, xids: tuple[int, ...] = (), mig_profile: str = "",
                 shared: bool = False, sm_clock_hz: float | None = None, clock_reasons: tuple[str, ...] = (),
                 memory_util: float | None = None, pcie_bps: float | None = None, nvlink_bps: float | None = None,
                 energy_j: float | None = None, energy_from_s: float | None = None,
                 energy_to_s: float | None = None, remap_pending: bool = False, remap_failed: bool = False,
                 xid_ages: tuple[tuple[int, float], ...] = (), ecc_uncorrected: int | None = None) -> None:
        odd: list[tuple[str, object]] = []
        vals = [utilization, sm_active, power_w, power_limit_w, sm_clock_hz, memory_util, pcie_bps, nvlink_bps,
                energy_j, energy_from_s, energy_to_s]
        m = 0
        for i, v in enumerate(vals):
            if type(v) is not float:
                m |= 1 << i
                if v is not None:
                    odd.append((_READINGS[i], v))
                vals[i] = 0.0
        ix = ecc = 0
        if type(index) is int and -0x8000 <= index < 0x8000:
            ix = index
        else:
            m |= _NO_INDEX
            if index is not None:
                odd.append(("index", index))
        if type(ecc_uncorrected) is int and 0 <= ecc_uncorrected < 0x10000:
            ecc = ecc_uncorrected
            if ecc:
                m |= _ECC_SEEN
        else:
            m |= _NO_ECC
            if ecc_uncorrected is not None:
                odd.append(("ecc_uncorrected", ecc_uncorrected))
        for name, v, bit in (("lost", lost, _LOST), ("hang_hint", hang_hint, _HANG), ("shared", shared, _SHARED),
                             ("remap_pending", remap_pending, _REMAP_PENDING),
                             ("remap_failed", remap_failed, _REMAP_FAILED)):
            if v is True:
                m |= bit
            elif v is not False:
                odd.append((name, v))
        if odd:
            m |= _ODD
        m = _MASKS.get(m, m)  # (devices alike share one: an int past 256 is an object of its own, 32 B)
        if m > 256 and len(_MASKS) < _SHARED_MAX:
            _MASKS[m] = m
        rare: _Rare | None = None
        if xids or clock_reasons or xid_ages or mig_profile or odd or type(mig_profile) is not str:
            rare = (xids, clock_reasons, xid_ages, intern(mig_profile) if type(mig_profile) is str else mig_profile,
                    tuple(odd))
            if not xid_ages and not odd and all(type(x) is int for x in xids) and \
                    all(type(x) is str for x in clock_reasons):
                rare = _shared_rare(rare)
        object.__setattr__(self, "uuid", uuid)
        object.__setattr__(self, "_m", m)
        object.__setattr__(self, "_b", _LAYOUT.pack(ix, ecc, *vals))
        object.__setattr__(self, "_rare", rare)

    def _odd(self, name: str, default: object) -> Any:
        for n, v in self._rare[4] if self._rare is not None else ():
            if n == name:
                return v
        return default

    def _float_aside(self, name: str) -> float | None:
        return cast(float | None, self._odd(name, None))

    @property
    def index(self) -> int | None:
        m = self._m
        return _H(self._b, 0)[0] if not m & 0x800 else None if not m & 0x40000 else \
            cast(int | None, self._odd("index", None))

    @property
    def utilization(self) -> float | None:
        m = self._m
        return _D(self._b, 4)[0] if not m & 0x1 else None if not m & 0x40000 else self._float_aside("utilization")

    @property
    def sm_active(self) -> float | None:
        m = self._m
        return _D(self._b, 12)[0] if not m & 0x2 else None if not m & 0x40000 else self._float_aside("sm_active")

    @property
    def power_w(self) -> float | None:
        m = self._m
        return _D(self._b, 20)[0] if not m & 0x4 else None if not m & 0x40000 else self._float_aside("power_w")

    @property
    def power_limit_w(self) -> float | None:
        m = self._m
        return _D(self._b, 28)[0] if not m & 0x8 else None if not m & 0x40000 else self._float_aside("power_limit_w")

    @property
    def lost(self) -> bool:
        m = self._m
        return m & 0x2000 != 0 if not m & 0x40000 else cast(bool, self._odd("lost", m & 0x2000 != 0))

    @property
    def hang_hint(self) -> bool:
        m = self._m
        return m & 0x4000 != 0 if not m & 0x40000 else cast(bool, self._odd("hang_hint", m & 0x4000 != 0))

    @property
    def xids(self) -> tuple[int, ...]:
        r = self._rare
        return () if r is None else r[0]

    @property
    def mig_profile(self) -> str:
        r = self._rare
        return "" if r is None else r[3]

    @property
    def shared(self) -> bool:
        m = self._m
        return m & 0x8000 != 0 if not m & 0x40000 else cast(bool, self._odd("shared", m & 0x8000 != 0))

    @property
    def sm_clock_hz(self) -> float | None:
        m = self._m
        return _D(self._b, 36)[0] if not m & 0x10 else None if not m & 0x40000 else self._float_aside("sm_clock_hz")

    @property
    def clock_reasons(self) -> tuple[str, ...]:
        r = self._rare
        return () if r is None else r[1]

    @property
    def memory_util(self) -> float | None:
        m = self._m
        return _D(self._b, 44)[0] if not m & 0x20 else None if not m & 0x40000 else self._float_aside("memory_util")

    @property
    def pcie_bps(self) -> float | None:
        m = self._m
        return _D(self._b, 52)[0] if not m & 0x40 else None if not m & 0x40000 else self._float_aside("pcie_bps")

    @property
    def nvlink_bps(self) -> float | None:
        m = self._m
        return _D(self._b, 60)[0] if not m & 0x80 else None if not m & 0x40000 else self._float_aside("nvlink_bps")

    @property
    def energy_j(self) -> float | None:
        m = self._m
        return _D(self._b, 68)[0] if not m & 0x100 else None if not m & 0x40000 else self._float_aside("energy_j")

    @property
    def energy_from_s(self) -> float | None:
        m = self._m
        return _D(self._b, 76)[0] if not m & 0x200 else None if not m & 0x40000 else self._float_aside("energy_from_s")

    @property
    def energy_to_s(self) -> float | None:
        m = self._m
        return _D(self._b, 84)[0] if not m & 0x400 else None if not m & 0x40000 else self._float_aside("energy_to_s")

    @property
    def remap_pending(self) -> bool:
        m = self._m
        return m & 0x10000 != 0 if not m & 0x40000 else cast(bool, self._odd("remap_pending", m & 0x10000 != 0))

    @property
    def remap_failed(self) -> bool:
        m = self._m
        return m & 0x20000 != 0 if not m & 0x40000 else cast(bool, self._odd("remap_failed", m & 0x20000 != 0))

    @property
    def xid_ages(self) -> tuple[tuple[int, float], ...]:
        r = self._rare
        return () if r is None else r[2]

    @property
    def ecc_uncorrected(self) -> int | None:
        m = self._m
        return _U(self._b, 2)[0] if not m & 0x1000 else None if not m & 0x40000 else \
            cast(int | None, self._odd("ecc_uncorrected", None))

    def _key(self) -> tuple[object, ...]:
        return tuple(_nan_free(getattr(self, n)) for n in _NAMES)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, GpuDevice)
        return (self.uuid == other.uuid and self._m == other._m and self._b == other._b
                and self._rare == other._rare) or self._key() == other._key()  # (-0.0 == 0.0; NaN bits; aside)

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"GpuDevice({', '.join(f'{n}={getattr(self, n)!r}' for n in _NAMES)})"

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, n) for n in _NAMES)


Readings = tuple[float | None, float | None, float | None, float | None, float | None, float | None, float | None,
                 float | None, float | None, float | None, float | None]


def readings(d: GpuDevice) -> Readings:
    """`d`'s readings in one go, in `_READINGS`' order (utilization, sm_active, power_w, power_limit_w,
    sm_clock_hz, memory_util, pcie_bps, nvlink_bps, energy_j, energy_from_s, energy_to_s): the
    fail-slow comparison reads them all for every GPU."""
    m = d._m
    if m & _ODD:
        return (d.utilization, d.sm_active, d.power_w, d.power_limit_w, d.sm_clock_hz, d.memory_util, d.pcie_bps,
                d.nvlink_bps, d.energy_j, d.energy_from_s, d.energy_to_s)
    v = _ALL(d._b, 4)
    absent = m & 0x7FF
    if not absent:
        return cast(Readings, v)
    where = _ABSENT.get(absent)
    if where is None:
        where = _ABSENT[absent] = tuple(i for i in range(11) if absent >> i & 1)
    out: list[float | None] = list(v)
    for i in where:
        out[i] = None
    return cast(Readings, tuple(out))


def energy_window(d: GpuDevice) -> tuple[float, float, float] | None:
    """`d`'s energy counter window, (energy_j, energy_from_s, energy_to_s), in one go (energy per step
    reads it for every GPU of a run on every evaluation); None where any of the three is None."""
    m = d._m
    if not m & (0x700 | _ODD):
        return cast(tuple[float, float, float], _WINDOW(d._b, 68))
    j, a, b = d.energy_j, d.energy_from_s, d.energy_to_s
    return None if j is None or a is None or b is None else (j, a, b)


def fault_free(d: GpuDevice) -> bool:
    """No fault signal on `d`: not lost, no row remap pending or failed, no uncorrected ECC error, no
    XID (what `claims.workrisk` skips on every evaluation: read from the packed fields in one go)."""
    if d._m & _FAULT_BITS:
        return not (d.lost or d.remap_pending or d.remap_failed or d.ecc_uncorrected or d.xids)
    r = d._rare
    return r is None or not r[0]


def _nan_free(v: object) -> object:
    if isinstance(v, float):
        return _NAN if v != v else v
    return tuple(map(_nan_free, v)) if isinstance(v, tuple) else v  # (XID ages)


def _shared_rare(rare: _Rare) -> _Rare:
    kept = _SHARED_RARE.get(rare)
    if kept is not None:
        return kept
    if len(_SHARED_RARE) < _SHARED_MAX:
        _SHARED_RARE[rare] = rare
    return rare

