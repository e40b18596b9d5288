"""NCCL flight-recorder dumps across ranks: where the ranks diverge, and who never got there.

PyTorch's ProcessGroupNCCL keeps a ring buffer of recent collectives per rank
(`TORCH_NCCL_TRACE_BUFFER_SIZE`) and writes it on a watchdog timeout to
`TORCH_NCCL_DEBUG_INFO_TEMP_FILE` + rank (default `/tmp/nccl_trace_rank_<rank>`). The dump is a
pickle by default; PyTorch's JSON dump (`dump_json`) carries the same fields: `version`,
`pg_config` (group name → {name, desc, ranks}), `pg_status`
(pg id → last enqueued/started/completed collective), and `entries` (record_id, pg_id,
process_group (name, desc), collective_seq_id, p2p_seq_id, op_id, profiling_name,
time_created_ns, input/output sizes and dtypes, state scheduled|started|completed,
time_discovered_*_ns, retired, timeout_ms, is_p2p).

Dumps come from tenants' containers: a pickle is never loaded with the standard unpickler.
`decode_dump` reads JSON, or a pickle through an unpickler that resolves no global at all except
the three list builders of TorchScript's pickler, mapped to `list` — so only dicts, lists,
tuples, strings, numbers, booleans and None can come out. Input size is bounded.

Pure: bytes in, records out; no I/O.
"""

from __future__ import annotations

import io
import math
import pickle
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

DEFAULT_PREFIX = "nccl_trace_rank_"
MAX_DUMP_BYTES = 32 << 20  # a ring buffer of 2,000 entries with stack traces is a few MB
MAX_ENTRIES = 100_000
MAX_DEPTH = 32
_NAME = re.compile(r"(\d{1,7})(?:\.(?:json|pkl|pickle))?$")

# TorchScript's pickler writes typed lists of ints/floats/bools through these; they only ever wrap
# a plain list, so `list` is a faithful, harmless stand-in.
_ALLOWED_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch.jit._pickle", "build_intlist"): list,
    ("torch.jit._pickle", "build_doublelist"): list,
    ("torch.jit._pickle", "build_boollist"): list,
}


class DumpError(ValueError):
    """A dump that cannot be read safely; the message names the file and the problem."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        fn = _ALLOWED_GLOBALS.get((module, name))
        if fn is None:
            raise pickle.UnpicklingError(f"refusing global {module}.{name}: only plain containers and scalars")
        return fn

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refusing persistent id")


def _check_plain(value: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise DumpError("nested too deeply")
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _check_plain(k, depth + 1)
            _check_plain(v, depth + 1)
        return
    if isinstance(value, list | tuple):
        for v in value:
            _check_plain(v, depth + 1)
        return
    raise DumpError(f"unexpected {type(value).__name__} in dump")


@dataclass(frozen=True, slots=True)
class FrEntry:
    record_id: int
    pg_id: int
    pg_name: str
    pg_desc: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str  # e.g. "nccl:all_reduce"
    state: str  # scheduled | started | completed
    is_p2p: bool
    time_created_ns: int
    timeout_ms: int | None
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    retired: bool


@dataclass(frozen=True, slots=True)
class PgStatus:
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None


@dataclass(frozen=True, slots=True)
class FrDump:
    rank: int
    source: str
    version: str
    format: str  # "json" | "pickle"
    entries: tuple[FrEntry, ...]
    pg_ranks: Mapping[str, tuple[int, ...]]  # process group name → its global ranks
    pg_desc: Mapping[str, str]
    pg_status: Mapping[int, PgStatus]
    problems: tuple[str, ...] = ()


def rank_from_name(name: str, prefix: str = DEFAULT_PREFIX) -> int | None:
    """The rank a dump file is for, from its name (`nccl_trace_rank_7`, `..._7.json`)."""
    base = name.rsplit("/", 1)[-1]
    if not base.startswith(prefix):
        return None
    m = _NAME.fullmatch(base[len(prefix):])
    return int(m.group(1)) if m else None


def decode_dump(data: bytes, source: str, rank: int | None = None) -> FrDump:
    """One rank's dump from its bytes (JSON or pickle); raises DumpError naming `source`."""
    if len(data) > MAX_DUMP_BYTES:
        raise DumpError(f"{source}: {len(data)} bytes, over the {MAX_DUMP_BYTES} byte bound")
    head = data.lstrip()[:1]
    try:
        if head == b"{":
            raw, fmt = orjson.loads(data), "json"
        elif data[:1] == b"\x80":
            raw, fmt = _PlainUnpickler(io.BytesIO(data)).load(), "pickle"
        else:
            raise DumpError(f"{source}: neither JSON nor a pickle")
        _check_plain(raw)
    except DumpError:
        raise
    except orjson.JSONDecodeError as e:
        raise DumpError(f"{source}: not valid JSON: {e}") from e
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            RecursionError, MemoryError) as e:
        raise DumpError(f"{source}: unsafe or corrupt pickle: {e}") from e
    if not isinstance(raw, dict):
        raise DumpError(f"{source}: expected a mapping at the top, got {type(raw).__name__}")
    r = rank if rank is not None else rank_from_name(source)
    if r is None:
        raise DumpError(f"{source}: no rank (name it {DEFAULT_PREFIX}<rank>)")
    return _parse(raw, source, r, fmt)


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    if isinstance(v, str | bytes):
        try:
            return int(v)
        except ValueError:
            return None
    return None


def _str(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return "" if v is None else str(v)


def _ranks(v: Any) -> tuple[int, ...]:
    """pg_config ranks: a string "[0, 1, 2]" as PyTorch writes it, or a list."""
    if isinstance(v, list | tuple):
        items: Iterable[Any] = v
    else:
        items = _str(v).strip().strip("[]").split(",")
    out = []
    for x in items:
        n = _int(x.strip() if isinstance(x, str) else x)
        if n is not None and n >= 0:
            out.append(n)
    return tuple(out)


def _parse(raw: dict[Any, Any], source: str, rank: int, fmt: str) -> FrDump:
    problems: list[str] = []
    pg_ranks: dict[str, tuple[int, ...]] = {}
    pg_desc: dict[str, str] = {}
    cfg = raw.get("pg_config")
    if isinstance(cfg, dict):
        for name, info in cfg.items():
            if isinstance(info, dict):
                pg_ranks[_str(name)] = _ranks(info.get("ranks"))
                pg_desc[_str(name)] = _str(info.get("desc"))
    status: dict[int, PgStatus] = {}
    st = raw.get("pg_status")
    if isinstance(st, dict):
        for pg_id, s in st.items():
            pid = _int(pg_id)
            if pid is not None and isinstance(s, dict):
                status[pid] = PgStatus(_int(s.get("last_enqueued_collective")),
                                       _int(s.get("last_started_collective")),
                                       _int(s.get("last_completed_collective")))
    entries: list[FrEntry] = []
    items = raw.get("entries") or []
    if not isinstance(items, list | tuple):
        problems.append("entries is not a list")
        items = []
    if len(items) > MAX_ENTRIES:
        problems.append(f"{len(items)} entries; read the last {MAX_ENTRIES}")
        items = items[-MAX_ENTRIES:]
    for i, e in enumerate(items):
        if not isinstance(e, dict):
            problems.append(f"entry {i}: not a mapping")
            continue
        pg = e.get("process_group")
        name, desc = (_str(pg[0]), _str(pg[1]) if len(pg) > 1 else "") if isinstance(pg, list | tuple) and pg \
            else (_str(pg), "")
        seq = _int(e.get("collective_seq_id"))
        if seq is None:
            problems.append(f"entry {i}: no collective_seq_id")
            continue
        sizes = e.get("input_sizes")
        entries.append(FrEntry(
            record_id=_int(e.get("record_id")) or 0,
            pg_id=_int(e.get("pg_id")) or 0,
            pg_name=name,
            pg_desc=desc,
            collective_seq_id=seq,
            p2p_seq_id=_int(e.get("p2p_seq_id")) or 0,
            op_id=_int(e.get("op_id")) or 0,
            profiling_name=_str(e.get("profiling_name"))[:200],
            state=_str(e.get("state")) or "scheduled",
            is_p2p=bool(e.get("is_p2p")),
            time_created_ns=_int(e.get("time_created_ns")) or 0,
            timeout_ms=_int(e.get("timeout_ms")),
            input_sizes=tuple(tuple(_int(d) or 0 for d in s) for s in sizes if isinstance(s, list | tuple))
            if isinstance(sizes, list | tuple) else (),
            input_dtypes=tuple(_str(d) for d in e.get("input_dtypes") or () if isinstance(d, str | bytes)),
            retired=bool(e.get("retired")),
        ))
    return FrDump(rank=rank, source=source, version=_str(raw.get("version")), format=fmt,
                  entries=tuple(entries), pg_ranks=pg_ranks, pg_desc=pg_desc, pg_status=status,
                  problems=tuple(problems))


# --- analysis across ranks -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a rank ran: its pod and node (and how that was decided)."""

    pod: str
    node: str
    how: str  # "dump location" | "inferred: rank // ranks per pod" | ...


@dataclass(frozen=True, slots=True)
class GroupFinding:
    """One process group's verdict."""

    pg_name: str
    pg_desc: str
    ranks: tuple[int, ...]
    diverged_at: int | None  # collective_seq_id of the first collective not completed by every rank
    collective: str  # its profiling name, as the ranks that reached it recorded it
    reached: tuple[int, ...]  # ranks whose buffer holds that collective
    never_reached: tuple[int, ...]  # ranks that never enqueued it: the suspects
    mismatched: tuple[int, ...]  # ranks that reached it with a different op or input sizes
    not_started: tuple[int, ...]  # reached it, but the kernel was never seen starting
    no_dump: tuple[int, ...]  # ranks of the group without a dump
    last_completed: Mapping[int, int | None]
    summary: str


@dataclass(frozen=True, slots=True)
class HangAnalysis:
    ranks: tuple[int, ...]
    groups: tuple[GroupFinding, ...]
    suspects: tuple[int, ...]
    placement: Mapping[int, Placement]
    summary: str
    problems: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        def where(r: int) -> dict[str, Any]:
            p = self.placement.get(r)
            return {"rank": r, "pod": p.pod if p else None, "node": p.node if p else None,
                    "placement": p.how if p else "unknown"}

        return {
            "summary": self.summary,
            "ranks_with_dumps": list(self.ranks),
            "suspects": [where(r) for r in self.suspects],
            "groups": [{
                "process_group": g.pg_name, "desc": g.pg_desc, "ranks": list(g.ranks),
                "diverged_at_collective_seq_id": g.diverged_at, "collective": g.collective,
                "reached": list(g.reached), "never_reached": list(g.never_reached),
                "mismatched": list(g.mismatched), "not_started": list(g.not_started), "no_dump": list(g.no_dump),
                "last_completed": {str(k): v for k, v in sorted(g.last_completed.items())},
                "summary": g.summary,
            } for g in self.groups],
            "problems": list(self.problems),
        }


def _short(ranks: Sequence[int], limit: int = 12) -> str:
    s = ", ".join(str(r) for r in ranks[:limit])
    return s + (f" … (+{len(ranks) - limit})" if len(ranks) > limit else "")


def _group(name: str, dumps: Sequence[FrDump]) -> GroupFinding | None:
    declared: tuple[int, ...] = ()
    desc = ""
    for d in dumps:
        if name in d.pg_ranks and d.pg_ranks[name]:
            declared = d.pg_ranks[name]
            desc = d.pg_desc.get(name, "")
            break
    by_rank: dict[int, dict[int, FrEntry]] = {}
    completed: dict[int, int | None] = {}
    enqueued: dict[int, int | None] = {}
    for d in dumps:
        ents = [e for e in d.entries if e.pg_name == name and not e.is_p2p]
        if not ents and name not in d.pg_ranks:
            continue
        seqs = {e.collective_seq_id: e for e in ents}
        by_rank[d.rank] = seqs
        done = [e.collective_seq_id for e in ents if e.state == "completed"]
        pg_ids = {e.pg_id for e in ents}
        status = [d.pg_status[p] for p in pg_ids if p in d.pg_status]
        last_c = max(done, default=None)
        last_e = max(seqs, default=None)
        for s in status:  # pg_status outlives a wrapped ring buffer
            if s.last_completed is not None and s.last_completed >= 0:
                last_c = s.last_completed if last_c is None else max(last_c, s.last_completed)
            if s.last_enqueued is not None and s.last_enqueued >= 0:
                last_e = s.last_enqueued if last_e is None else max(last_e, s.last_enqueued)
        completed[d.rank] = last_c
        enqueued[d.rank] = last_e
    if not by_rank:
        return None
    ranks = tuple(sorted(set(declared) | set(by_rank)))
    no_dump = tuple(r for r in ranks if r not in by_rank)
    floor = min((c if c is not None else 0) for c in completed.values())
    top = max((e if e is not None else 0) for e in enqueued.values())
    if top <= floor:
        return GroupFinding(name, desc, ranks, None, "", tuple(sorted(by_rank)), (), (), (), no_dump, completed,
                            f"group {name}: every rank with a dump completed collective {floor}; no divergence")
    seq = floor + 1
    reached = tuple(r for r in sorted(by_rank) if (enqueued[r] or 0) >= seq)
    never = tuple(r for r in sorted(by_rank) if (enqueued[r] or 0) < seq)
    ops = [by_rank[r][seq] for r in reached if seq in by_rank[r]]
    op_names = [e.profiling_name for e in ops]
    collective = max(set(op_names), key=op_names.count) if op_names else "unknown (not in the ring buffer)"
    sizes = [e.input_sizes for e in ops if e.profiling_name == collective]
    common_size = max(set(sizes), key=sizes.count) if sizes else ()
    mismatched = tuple(r for r in reached if seq in by_rank[r] and (
        by_rank[r][seq].profiling_name != collective or (common_size and by_rank[r][seq].input_sizes != common_size)))
    not_started = tuple(r for r in reached if seq in by_rank[r] and by_rank[r][seq].state == "scheduled")
    if never:
        text = (f"group {name}: ranks diverge at collective #{seq} ({collective}); "
                f"rank(s) {_short(never)} never reached it, {len(reached)} rank(s) wait in it")
    elif mismatched:
        text = (f"group {name}: all ranks reached collective #{seq} but rank(s) {_short(mismatched)} "
                f"called a different op or size than {collective}")
    else:
        text = (f"group {name}: every rank is inside collective #{seq} ({collective}) and none completed it "
                f"(network or NCCL problem rather than one late rank)")
    if no_dump:
        text += f"; no dump from rank(s) {_short(no_dump)}"
    return GroupFinding(name, desc, ranks, seq, collective, reached, never, mismatched, not_started, no_dump,
                        completed, text)


def analyze(dumps: Sequence[FrDump], placement: Mapping[int, Placement] | None = None) -> HangAnalysis:
    """The hang across ranks: per process group, the first collective not every rank completed."""
    placement = dict(placement or {})
    if not dumps:
        return HangAnalysis((), (), (), placement, "no flight-recorder dumps")
    names = sorted({e.pg_name for d in dumps for e in d.entries} | {n for d in dumps for n in d.pg_ranks})
    groups = [g for n in names if (g := _group(n, dumps)) is not None]
    diverged = [g for g in groups if g.diverged_at is not None]
    # Suspects: ranks that never reached the collective others wait in; failing that, mismatched
    # ranks; a group where all ranks are stuck together has no single suspect.
    suspects: set[int] = set()
    for g in diverged:
        suspects.update(g.never_reached or g.mismatched)
    problems = tuple(f"{d.source}: {p}" for d in dumps for p in d.problems)
    if not diverged:
        summary = "no divergence: every rank completed the same collectives"
    else:
        # The first group (by the lowest rank count: sub-groups hang inside the world group) decides.
        lead = min(diverged, key=lambda g: (not g.never_reached, len(g.ranks), g.pg_name))
        summary = lead.summary
        if suspects:
            where = []
            for r in sorted(suspects)[:8]:
                p = placement.get(r)
                where.append(f"rank {r} ({p.pod} on {p.node})" if p else f"rank {r}")
            summary += "; suspects: " + ", ".join(where)
    return HangAnalysis(tuple(sorted(d.rank for d in dumps)), tuple(groups), tuple(sorted(suspects)), placement,
                        summary, problems)
