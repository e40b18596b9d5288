"""How `gpu.PodGpuEvidence` packs a pod's devices in one bytes (`_pack`, from `GpuDevice`s; `NodeColumns`,
from a document's columns) and where each column lies (`_layout`): records only, pure."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable, Sequence
from sys import intern
from typing import Any, NamedTuple, cast

from collector.gpudevice import (
    _ECC_SEEN,
    _HANG,
    _LAYOUT,
    _LOST,
    _NO_ECC,
    _NO_INDEX,
    _ODD,
    _REMAP_FAILED,
    _REMAP_PENDING,
    _SHARED,
    _SHARED_MAX,
    _SHARED_RARE,
    GpuDevice,
    _Rare,
    _shared_rare,
)

# A controller holds every GPU pod's newest evidence (issue 30: 50k pods), so a pod's devices are
# packed together in one bytes: a header (devices, which columns are stored once), each device's
# UUID as its 16 bytes where it is a canonical `GPU-<uuid>` / `MIG-<uuid>` (else kept aside as given),
# then column by column each device's bits (`GpuDevice._m`, and the UUID's kind), index, ECC count
# and 11 readings; a column alike on every device of the pod (a power limit, an energy window's
# ends, the ECC count, the bits) is stored once, indexes 0, 1, 2… not at all. The rare fields
# (`GpuDevice._rare`) and UUIDs kept aside are one tuple beside (shared by pods alike). A device
# object and 8 UUID strings took ~2.2 KB a pod of 8 GPUs; this ~0.7. `devices` builds the
# `GpuDevice`s on access; the per-evaluation readers below read the columns instead.
_HEAD = struct.Struct("<IHI")  # devices; flags: bit c column c stored once, _ARANGE indexes 0..n-1; `_ANY`
_ARANGE = 1 << 14
_UUIDS_AT = _HEAD.size
_GPU, _MIG, _ASIDE = 0, 1, 2  # the UUID's kind, in bits 20-21 of the bits column
_KIND_SHIFT = 20
_KINDS = 3 << _KIND_SHIFT
_DEVICE_BITS = (1 << _KIND_SHIFT) - 1
# The header's last word: every device's bits or-ed, and these two: some device may have XIDs / a MIG
# profile. The per-evaluation readers skip a pod whose devices have nothing to read by it alone.
_XIDS_SEEN, _MIG_SEEN = 1 << 22, 1 << 23
# the columns: bits, index, ECC count, then the readings (`gpudevice._READINGS`' order), as in `_LAYOUT`
_CHARS = "IhH" + "d" * 11
_MASK, _INDEX, _ECC, _UTIL, _SM, _POWER, _LIMIT = 0, 1, 2, 3, 4, 5, 6
_ENERGY = 11  # energy_j, energy_from_s, energy_to_s: columns 11, 12, 13
_STATE_BITS = (1 << 11 | 1 << 12 | _LOST | _HANG | 3 << 16 | _ODD | _KINDS)  # `same_devices` reads
_Column = tuple[int, struct.Struct, bool] | None  # offset, its struct, stored once; None: indexes 0..n-1
_Layout = tuple[int, int, tuple[_Column, ...]]  # devices, `_ANY` word, the columns
_LAYOUTS: dict[tuple[int, int], tuple[_Column, ...]] = {}
_ARANGES: dict[int, bytes] = {}
_PAD = bytes(4)
assert _LAYOUT.size + len(_PAD) == 96  # (`_pack` reads a device's fields as 12 words)
# the beside tuple: (each device's rare fields or None, each device's UUID kept aside or None) or None
_Aside = tuple[tuple[_Rare | None, ...] | None, tuple[object, ...] | None]
_SHARED_ASIDE: dict[_Aside, _Aside] = {}
_NO_UUID = bytes(16)
_FLOAT = {float}
# UUIDs one after another, each canonical (what `_uuid_bytes` packs: 32 lower-case hex digits, dashed)
_CANONICAL = re.compile(r"(?:(?:GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})*")


def _layout(p: bytes) -> _Layout:
    n, flags, any_ = _HEAD.unpack_from(p)
    lay = _LAYOUTS.get((n, flags))
    if lay is None:
        cols: list[_Column] = []
        off = _UUIDS_AT + 16 * n
        for c, ch in enumerate(_CHARS):
            if c == _INDEX and flags & _ARANGE:
                cols.append(None)
                continue
            once = bool(flags >> c & 1)
            st = struct.Struct(f"<{1 if once else n}{ch}")
            cols.append((off, st, once))
            off += st.size
        lay = tuple(cols)
        if len(_LAYOUTS) < _SHARED_MAX:
            _LAYOUTS[(n, flags)] = lay
    return n, any_, lay


def _col(p: bytes, col: _Column, n: int) -> tuple[Any, ...]:
    if col is None:
        return tuple(range(n))
    off, st, once = col
    v = st.unpack_from(p, off)
    return v * n if once else v


def _arange(n: int) -> bytes:
    """Indexes 0..n-1 as an index column's bytes."""
    b = _ARANGES.get(n)
    if b is None:
        b = struct.pack(f"<{n}h", *range(n))
        if len(_ARANGES) < _SHARED_MAX:
            _ARANGES[n] = b
    return b


def _uuid_bytes(u: object) -> tuple[int, bytes]:
    """A canonical `GPU-<uuid>` / `MIG-<uuid>` (lower case, dashed: what `_uuid` writes back) as its kind
    and 16 bytes; any other as `_ASIDE`."""
    if type(u) is str and len(u) == 40 and u[12] == u[17] == u[22] == u[27] == "-" and u[3] == "-" and \
            (u.startswith("GPU-") or u.startswith("MIG-")):
        h = u[4:]
        if h == h.lower():
            try:
                raw = bytes.fromhex(h.replace("-", ""))  # (32 hex digits: no room for the blanks it skips)
            except ValueError:
                raw = b""
            if len(raw) == 16:
                return (_GPU if u[0] == "G" else _MIG), raw
    return _ASIDE, _NO_UUID


def _uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _pack(devices: Iterable[GpuDevice]) -> tuple[bytes, _Aside | None]:
    devs = tuple(devices)
    n = len(devs)
    masks: list[int] = []
    parts: list[bytes] = [b""]
    rares: list[_Rare | None] | None = None
    names: list[object] | None = None
    any_ = 0
    for i, d in enumerate(devs):
        kind, raw = _uuid_bytes(d.uuid)
        if kind == _ASIDE:
            if names is None:
                names = [None] * n
            u = d.uuid  # (interned: the next pass's record holds the same string, as the parser did)
            names[i] = intern(u) if type(u) is str else u
        r = d._rare
        if r is not None:
            if rares is None:
                rares = [None] * n
            rares[i] = r
            if not (type(r[0]) is tuple and not r[0]):  # (a hint: the readers read the device where set)
                any_ |= _XIDS_SEEN
            if not (type(r[3]) is str and not r[3]):
                any_ |= _MIG_SEEN
        m = d._m | kind << _KIND_SHIFT
        any_ |= m
        masks.append(m)
        parts.append(raw)
    flags = _bits_column(parts, masks)
    # Each column's bytes as they are (NaN's bits, -0.0 apart from 0.0): 4 bytes of padding and every
    # device's 92 make 12 words, a reading every 12th word from the second (an index or ECC count, every
    # 48th half from the third or fourth).
    words = memoryview(b"".join(x for d in devs for x in (_PAD, d._b)))
    halves, words = words.cast("H"), words.cast("Q")
    for c in range(_INDEX, _UTIL + 11):
        flags |= _column(parts, c, (halves[c + 1::48] if c < _UTIL else words[c - _UTIL + 1::12]).tobytes(), n)
    parts[0] = _HEAD.pack(n, flags, any_)
    return b"".join(parts), _aside(rares, names)


def _bits_column(parts: list[bytes], masks: list[int]) -> int:
    """The devices' bits column put in `parts` (once where alike): the header's flag bit it sets."""
    n = len(masks)
    if n > 1 and masks.count(masks[0]) == n:
        parts.append(struct.pack("<I", masks[0]))
        return 1
    parts.append(struct.pack(f"<{n}I", *masks))
    return 0


def _column(parts: list[bytes], c: int, col: bytes, n: int) -> int:
    """Column `c` of `n` devices (`col`, its bytes) put in `parts`: the header's flag bits it sets."""
    w = 2 if c < _UTIL else 8
    if c == _INDEX and n < 0x8000 and col == _arange(n):
        return _ARANGE
    if n > 1 and col == col[:w] * n:
        parts.append(col[:w])
        return 1 << c
    parts.append(col)
    return 0


class Columns(NamedTuple):
    """Devices column by column, as a source's document holds them (`NodeColumns`): each sequence one
    value a device, in order; None: that field absent on every device."""

    uuids: Sequence[object]
    indexes: Sequence[object] | None = None
    ecc_uncorrected: Sequence[object] | None = None
    readings: Sequence[Sequence[object] | None] = ()  # `gpudevice._READINGS`' order (fewer: the rest absent)
    flags: Sequence[Sequence[object] | None] = ()  # lost, hang_hint, shared, remap_pending, remap_failed
    clock_reasons: Sequence[tuple[str, ...]] | None = None


_FLAG_BITS = (_LOST, _HANG, _SHARED, _REMAP_PENDING, _REMAP_FAILED)
_INT = {int}


class NodeColumns:
    """A document's devices (`Columns`) checked and packed column by column once, so that each pod's
    record is slices of them (`PodGpuEvidence.from_columns`): what `_pack` makes of the devices
    `GpuDevice` would make of the values, without making them. A device that would keep a value aside
    (a reading not a float or None, an index past 16 bits, an ECC count past 16, a flag not a bool), or
    that `skip` names, does not pack: its pod's record is made from devices instead."""

    __slots__ = ("n", "bad", "_masks", "_raws", "_names", "_cols", "_rares")

    def __init__(self, c: Columns, skip: Sequence[bool] | None = None) -> None:
        n = self.n = len(c.uuids)
        bad = self.bad = list(skip) if skip is not None else [False] * n
        bits = [0] * n
        cols: list[bytes | None] = []  # index, ECC count, the 11 readings (None: zeros)
        ix = _ints(c.indexes, n, -0x8000, 0x8000, _NO_INDEX, bits, bad)
        cols.append(None if ix is None else struct.pack(f"<{n}h", *ix))
        ecc = _ints(c.ecc_uncorrected, n, 0, 0x10000, _NO_ECC, bits, bad)
        if ecc is not None:
            for i, count in enumerate(ecc):
                if count:
                    bits[i] |= _ECC_SEEN
        cols.append(None if ecc is None else struct.pack(f"<{n}H", *ecc))
        dn = f"<{n}d"
        for j in range(11):
            col = c.readings[j] if j < len(c.readings) else None
            if col is None or len(col) != n:
                for i in range(n):
                    bits[i] |= 1 << j
                    bad[i] = bad[i] or col is not None
                cols.append(None)
                continue
            kinds = set(map(type, col))
            if kinds != _FLOAT:
                vals = list(col)
                for i, v in enumerate(vals):
                    if v is None:
                        bits[i] |= 1 << j
                    if type(v) is not float:
                        bad[i] = bad[i] or v is not None
                        vals[i] = 0.0
                col = vals
            cols.append(struct.pack(dn, *col))
        for bit, col in zip(_FLAG_BITS, c.flags, strict=False):
            if col is None:
                continue
            if len(col) != n:
                bad = self.bad = [True] * n
                continue
            for i, v in enumerate(col):
                if v is True:
                    bits[i] |= bit
                elif v is not False:
                    bad[i] = True
        uu = c.uuids
        joined = "".join(uu) if all(type(u) is str for u in uu) else ""  # type: ignore[arg-type]
        names: list[object] | None = None
        if len(joined) == 40 * n and _CANONICAL.fullmatch(joined):  # (every UUID canonical: one fromhex)
            raws = bytes.fromhex(joined.replace("GPU-", "").replace("MIG-", "").replace("-", ""))
            if "MIG-" in joined:
                bits = [b | (_GPU if cast(str, u)[0] == "G" else _MIG) << _KIND_SHIFT
                        for b, u in zip(bits, uu, strict=True)]
        else:
            parts: list[bytes] = []
            for i, u in enumerate(uu):
                kind, raw = _uuid_bytes(u)
                if kind == _ASIDE:
                    if names is None:
                        names = [None] * n
                    names[i] = intern(u) if type(u) is str else u
                parts.append(raw)
                bits[i] |= kind << _KIND_SHIFT
            raws = b"".join(parts)
        self._masks = bits
        self._raws = raws
        self._names = names
        self._cols = cols
        self._rares: list[_Rare | None] | None = None
        if c.clock_reasons is not None and any(c.clock_reasons):
            self._rares = _reasons_rares(c.clock_reasons)

    def packed(self, idx: Sequence[int]) -> tuple[bytes, _Aside | None] | None:
        """The packed record of the devices at `idx` (in order; None where one does not pack)."""
        n = len(idx)
        if not n or any(self.bad[i] for i in idx):
            return None
        a = idx[0]
        run = idx[-1] - a == n - 1 and (n < 3 or all(idx[k] < idx[k + 1] for k in range(n - 1)))
        if run:
            b = a + n
            masks = self._masks[a:b]
            parts: list[bytes] = [b"", self._raws[16 * a:16 * b]]
        else:
            masks = [self._masks[i] for i in idx]
            parts = [b"", b"".join(self._raws[16 * i:16 * i + 16] for i in idx)]
        flags = _bits_column(parts, masks)
        for c, col in enumerate(self._cols, _INDEX):
            w = 2 if c < _UTIL else 8
            if col is None:
                sub = bytes(w * n)
            elif run:
                sub = col[w * a:w * (a + n)]
            else:
                sub = b"".join(col[w * i:w * i + w] for i in idx)
            flags |= _column(parts, c, sub, n)
        any_ = 0
        for m in set(masks):
            any_ |= m
        parts[0] = _HEAD.pack(n, flags, any_)
        names = rares = None
        if self._names is not None:
            names = [self._names[i] for i in idx]
            if all(x is None for x in names):
                names = None
        if self._rares is not None:
            rares = [self._rares[i] for i in idx]
            if all(x is None for x in rares):
                rares = None
        return b"".join(parts), _aside(rares, names)


def _ints(col: Sequence[object] | None, n: int, lo: int, hi: int, absent: int, bits: list[int],
          bad: list[bool]) -> list[int] | None:
    """A column of small ints (index, ECC count) as the values packed (None: absent on every device):
    `absent` in `bits` where a value is None, `bad` where one is not an int in [lo, hi)."""
    if col is None or len(col) != n:
        for i in range(n):
            bits[i] |= absent
            bad[i] = bad[i] or col is not None
        return None
    kinds = set(map(type, col))
    if kinds == _INT:
        ints = cast(Sequence[int], col)
        if min(ints) >= lo and max(ints) < hi:
            return list(ints)
    out = [0] * n
    for i, v in enumerate(col):
        if type(v) is int and lo <= v < hi:
            out[i] = v
        else:
            bits[i] |= absent
            bad[i] = bad[i] or v is not None
    return out


def _reasons_rares(reasons: Sequence[tuple[str, ...]]) -> list[_Rare | None]:
    """Each device's rare fields where it has only clocks-event reasons (None: none)."""
    kept: dict[tuple[str, ...], _Rare] = {}  # (one lookup in the shared table a reason set)
    return [None if not r else kept.get(r) or kept.setdefault(r, _shared_rare(((), r, (), "", ()))) for r in reasons]


def _reasons_aside(reasons: Sequence[tuple[str, ...]] | None) -> _Aside | None:
    """The beside tuple of a pod's devices with only clocks-event reasons beside their columns."""
    return _aside(_reasons_rares(reasons), None) if reasons is not None and any(reasons) else None


def _aside(rares: list[_Rare | None] | None, names: list[object] | None) -> _Aside | None:
    """The beside tuple of a pod's rare fields and UUIDs kept aside (shared by pods alike where it may be)."""
    if rares is None and names is None:
        return None
    aside: _Aside = (None if rares is None else tuple(rares), None if names is None else tuple(names))
    if names is None and len(_SHARED_ASIDE) < _SHARED_MAX and all(r is None or _shared(r) for r in aside[0] or ()):
        aside = _SHARED_ASIDE.setdefault(aside, aside)
    return aside


def _shared(r: _Rare) -> bool:
    """`r` is one `gpudevice._shared_rare` keeps (hashable, plain: it may key a shared aside)."""
    return _SHARED_RARE.get(r) is r


# A record sent whole (an agent's version 4 document, `sent_problem`): what `NodeColumns` packs from a
# version 2 document's columns and no more. Bits: a reading, index or ECC count absent, the five flags,
# an ECC count seen, a GPU or MIG UUID (not one kept aside, nothing odd, no XID or MIG hint).
_SENT_BITS = ((1 << 11) - 1 | _NO_INDEX | _NO_ECC | _LOST | _HANG | _SHARED | _REMAP_PENDING | _REMAP_FAILED
              | _ECC_SEEN | _MIG << _KIND_SHIFT)
_SENT_FLAGS = (1 << (_UTIL + 11)) - 1 | _ARANGE
MAX_SENT_DEVICES = 128  # a pod's GPUs and MIG instances (16 GPUs × 7 instances is 112); more: the columns
# the largest such record: every column stored per device (a UUID's 16 bytes and a device's column values)
MAX_SENT_BYTES = _UUIDS_AT + MAX_SENT_DEVICES * (16 + struct.calcsize("<" + _CHARS))
# An energy window the controller believes (`agent_gpus._energy`): at most this long, ending at most this
# long before the document was made, at most this many joules per second (a GPU draws ~1 kW).
ENERGY_WINDOW_MAX_S = 3600.0
ENERGY_MAX_W = 10_000.0
_RATIO, _RATE_LO, _RATE_HI = 5, 6, 7  # readings read by `_ratio` and `_rate` (`agent_gpus._READING_COLUMNS`)
_ENERGY_ABSENT = 7 << 8  # energy_j, energy_from_s, energy_to_s absent: all three or none


def _range(n: int) -> tuple[int, ...]:
    r = _RANGES.get(n)
    if r is None:
        r = _RANGES[n] = tuple(range(n))
    return r


class _Plan(NamedTuple):
    """How `sent_problem` reads a record of one (devices, column flags): its columns after the UUIDs
    as one struct (they lie end to end), each column's stored values in what it unpacks (None: indexes
    0..n-1), and each column stored per device as (offset, width, bytes), to tell it is not alike."""

    full: struct.Struct
    spans: tuple[tuple[int, int] | None, ...]
    per_device: tuple[tuple[int, int, int], ...]
    columns: tuple[_Column, ...]


def _plan(p: bytes, n: int, flags: int) -> _Plan:
    _, _, lay = _layout(p)
    fmt, at = "<", 0
    spans: list[tuple[int, int] | None] = []
    per_device = []
    for c, col in enumerate(lay):
        if col is None:
            spans.append(None)
            continue
        off, st, once = col
        k = 1 if once else n
        fmt += f"{k}{_CHARS[c]}"
        spans.append((at, at + k))
        at += k
        if not once and n > 1:
            per_device.append((off, st.size // n, st.size))
    plan = _Plan(struct.Struct(fmt), tuple(spans), tuple(per_device), lay)
    if len(_PLANS) < _SHARED_MAX:
        _PLANS[(n, flags)] = plan
    return plan


_PLANS: dict[tuple[int, int], _Plan] = {}
_RANGES: dict[int, tuple[int, ...]] = {}  # indexes 0..n-1 by n (at most MAX_SENT_DEVICES)


def sent_problem(p: bytes) -> str | None:
    """Why `p` is not a record `NodeColumns` could pack from a document's columns (None: it is one).

    An agent sends each pod's record whole (version 4) and the controller holds it as it came, so it is
    checked here as the columns are: its layout exact (the columns stored once exactly where `_column`
    stores them: one record for one set of devices), its bits only those above, a value where a bit
    says absent +0.0 (0 for an index or ECC count), every reading finite, the ratios and rates in
    range, an energy window whole and believable (its ends are seconds before the document's instant,
    as `agent_gpus._energy` makes them), an ECC count seen exactly where one is not 0."""
    if type(p) is not bytes or len(p) < _HEAD.size:
        return "shorter than a record's header"
    n, flags, any_ = _HEAD.unpack_from(p)
    plan = _PLANS.get((n, flags))
    if plan is None:
        if not 0 < n <= MAX_SENT_DEVICES:
            return f"{n} devices (at most {MAX_SENT_DEVICES})"
        if flags & ~_SENT_FLAGS or (flags & _ARANGE and flags & 1 << _INDEX) or (n == 1 and flags & ~_ARANGE):
            return f"column flags {flags:#x}"
        plan = _plan(p, n, flags)
    full, spans, per_device, lay = plan
    start = _UUIDS_AT + 16 * n
    if len(p) != start + full.size:
        return f"{len(p)} bytes, its layout {start + full.size}"
    for off, w, size in per_device:  # (n copies of its first value, side by side: every device's alike)
        if p.count(p[off:off + w], off, off + size) == n:
            return "a column alike on every device not stored once"
    vals = full.unpack_from(p, start)
    stored: list[tuple[Any, ...]] = [vals[sp[0]:sp[1]] if sp is not None else _range(n) for sp in spans]
    if spans[_INDEX] is not None and stored[_INDEX] == _range(n):
        return "indexes 0..n-1 not stored as such"
    masks = stored[_MASK]
    every = 0
    for m in set(masks) if len(masks) > 1 else masks:
        every |= m
    if every & ~_SENT_BITS:
        return f"device bits {every & ~_SENT_BITS:#x}"
    if any_ != every:
        return "its header's bits are not its devices'"
    r0 = cast(tuple[int, int], spans[_UTIL])[0]
    if not math.isfinite(sum(vals[r0:])) and not all(map(math.isfinite, vals[r0:])):
        return "a reading not finite"
    ratio = stored[_UTIL + _RATIO]
    if min(ratio) < 0.0 or max(ratio) > 1.0:
        return "a memory utilization outside 0..1"
    for j in (_RATE_LO, _RATE_HI):
        if min(stored[_UTIL + j]) < 0.0 or max(stored[_UTIL + j]) >= 1e13:
            return "a link rate outside 0..10 TB/s"
    if len(masks) == 1:  # (every device alike in its bits: each column checked as stored)
        m = masks[0]
        if m & _NO_INDEX and any(stored[_INDEX]):
            return "an index where its bit says none"
        eccs = stored[_ECC]
        if (m & _ECC_SEEN or any(eccs)) if m & _NO_ECC else (0 in eccs) if m & _ECC_SEEN else any(eccs):
            return "an ECC count and its bits disagree"
        e = m & _ENERGY_ABSENT
        if e and e != _ENERGY_ABSENT:
            return "an energy window in part"
        if m & 0x7FF:
            for j in range(11):
                if m >> j & 1:
                    off, st, _ = cast(tuple[int, struct.Struct, bool], lay[_UTIL + j])
                    if p.count(0, off, off + st.size) != st.size:
                        return f"reading {j} where its bit says none"
        if e:
            return None
        joules, froms, tos = stored[_ENERGY:_ENERGY + 3]
        if len(froms) == len(tos) == 1:
            a, b = froms[0], tos[0]
            if not (0.0 <= b < a <= ENERGY_WINDOW_MAX_S and min(joules) >= 0.0 and
                    max(joules) <= ENERGY_MAX_W * (a - b)):
                return "an energy window the controller would not believe"
            return None
    return _each_device([v * n if len(v) == 1 and n > 1 else v for v in stored])


def _each_device(cols: list[tuple[Any, ...]]) -> str | None:
    """`sent_problem`'s checks of each device's bits against its values, device by device."""
    for i, m in enumerate(cols[_MASK]):
        if m & _NO_INDEX and cols[_INDEX][i]:
            return "an index where its bit says none"
        ecc = cols[_ECC][i]
        if (m & _ECC_SEEN or ecc) if m & _NO_ECC else bool(m & _ECC_SEEN) != (ecc != 0):
            return "an ECC count and its bits disagree"
        e = m & _ENERGY_ABSENT
        if e and e != _ENERGY_ABSENT:
            return "an energy window in part"
        for j in range(11):
            x = cols[_UTIL + j][i]
            if m >> j & 1 and (x != 0.0 or math.copysign(1.0, x) < 0):
                return f"reading {j} where its bit says none"
        if not e:
            j, a, b = cols[_ENERGY][i], cols[_ENERGY + 1][i], cols[_ENERGY + 2][i]
            if not (0.0 <= b < a <= ENERGY_WINDOW_MAX_S and 0.0 <= j <= ENERGY_MAX_W * (a - b)):
                return "an energy window the controller would not believe"
    return None
