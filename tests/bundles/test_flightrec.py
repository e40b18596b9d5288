"""NCCL flight-recorder dumps: safe decoding (JSON and pickle) and the hang analysis across ranks."""

from __future__ import annotations

import os
import pickle
import pickletools
from typing import Any

import pytest

from collector.flightrec import DumpError, Placement, analyze, decode_dump, rank_from_name
from tests.bundles.scenario import HUNG_SEQ, LATE_RANK, as_json_dump, as_pickle_dump, fr_dump, hung_dumps


def decoded(dumps: dict[int, dict[str, Any]], fmt: str = "pickle") -> list[Any]:
    enc = as_pickle_dump if fmt == "pickle" else as_json_dump
    return [decode_dump(enc(d), f"nccl_trace_rank_{r}{'.json' if fmt == 'json' else ''}") for r, d in dumps.items()]


def test_rank_from_the_file_name() -> None:
    assert rank_from_name("/tmp/nccl_trace_rank_7") == 7
    assert rank_from_name("nccl_trace_rank_12.json") == 12
    assert rank_from_name("nccl_trace_rank_x") is None
    assert rank_from_name("trace_7") is None


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_both_formats_decode_to_the_same_records(fmt: str) -> None:
    d = decoded({3: fr_dump(3, 8, last_enqueued=100, last_completed=98)}, fmt)[0]
    assert d.rank == 3 and d.format == fmt and d.version == "2.4"
    assert d.pg_ranks == {"0": tuple(range(8))}
    assert d.pg_status[0].last_enqueued == 100 and d.pg_status[0].last_completed == 98
    states = [(e.collective_seq_id, e.state) for e in d.entries]
    assert states[-3:] == [(98, "completed"), (99, "started"), (100, "scheduled")]
    e = d.entries[-1]
    assert e.profiling_name == "nccl:all_reduce" and e.pg_name == "0" and e.pg_desc == "default_pg"
    assert e.input_sizes == ((466119168,),) and e.timeout_ms == 600000 and not e.is_p2p


def test_torchscript_typed_lists_are_admitted_as_plain_lists() -> None:
    # TorchScript's pickler writes int lists through torch.jit._pickle.build_intlist.
    class IntList(list[int]):
        def __reduce__(self) -> Any:
            return (_build_intlist, (list(self),))

    d = fr_dump(0, 2, last_enqueued=5, last_completed=5)
    d["entries"][0]["input_sizes"] = [IntList([4, 1024])]
    data = pickle.dumps(d, protocol=2)
    data = data.replace(b"tests.bundles.test_flightrec\n_build_intlist", b"torch.jit._pickle\nbuild_intlist")
    assert b"torch.jit._pickle" in data
    out = decode_dump(data, "nccl_trace_rank_0")
    assert out.entries[0].input_sizes == ((4, 1024),)


def _build_intlist(x: list[int]) -> list[int]:
    return x


class _Evil:
    def __reduce__(self) -> Any:
        return (os.system, ("touch /tmp/taugrid-pwned",))


def test_a_pickle_with_code_is_refused_without_running_it(tmp_path: Any) -> None:
    marker = "/tmp/taugrid-pwned"
    if os.path.exists(marker):
        os.unlink(marker)
    d = fr_dump(0, 2, last_enqueued=5, last_completed=5)
    d["entries"][0]["frames"] = _Evil()
    data = pickle.dumps(d, protocol=2)
    assert any(op.name in ("GLOBAL", "STACK_GLOBAL") for op, _, _ in pickletools.genops(data))
    with pytest.raises(DumpError, match="nccl_trace_rank_0: unsafe or corrupt pickle: refusing global"):
        decode_dump(data, "nccl_trace_rank_0")
    assert not os.path.exists(marker)


@pytest.mark.parametrize("data,message", [
    (b"\x80\x02}q\x00(X", "unsafe or corrupt pickle"),
    (b"{not json", "not valid JSON"),
    (b"hello", "neither JSON nor a pickle"),
    (b"[1, 2]", "neither JSON nor a pickle"),
])
def test_bad_dumps_name_the_file_and_the_problem(data: bytes, message: str) -> None:
    with pytest.raises(DumpError, match=f"nccl_trace_rank_4.*{message}"):
        decode_dump(data, "nccl_trace_rank_4")


def test_the_rank_that_never_reached_the_collective_is_the_suspect() -> None:
    dumps = decoded(hung_dumps(world=16))
    placement = {LATE_RANK: Placement("llm-w1", "gpu-node-1", "dump found with this pod")}
    a = analyze(dumps, placement)
    (g,) = a.groups
    assert g.diverged_at == HUNG_SEQ and g.collective == "nccl:all_reduce"
    assert g.never_reached == (LATE_RANK,) and len(g.reached) == 15 and g.no_dump == ()
    assert a.suspects == (LATE_RANK,)
    assert f"rank {LATE_RANK} (llm-w1 on gpu-node-1)" in a.summary
    js = a.to_json()
    assert js["suspects"] == [{"rank": 13, "pod": "llm-w1", "node": "gpu-node-1",
                               "placement": "dump found with this pod"}]


def test_all_ranks_stuck_together_has_no_single_suspect() -> None:
    dumps = decoded({r: fr_dump(r, 4, last_enqueued=50, last_completed=49) for r in range(4)}, "json")
    a = analyze(dumps)
    assert a.suspects == () and a.groups[0].diverged_at == 50
    assert "every rank is inside collective #50" in a.summary


def test_a_rank_calling_a_different_collective_is_named() -> None:
    dumps = {r: fr_dump(r, 4, last_enqueued=50, last_completed=49) for r in range(4)}
    dumps[2] = fr_dump(2, 4, last_enqueued=50, last_completed=49, op="nccl:all_gather")
    a = analyze(decoded(dumps))
    assert a.groups[0].mismatched == (2,) and a.suspects == (2,)


def test_no_divergence_and_missing_dumps() -> None:
    done = analyze(decoded({r: fr_dump(r, 4, last_enqueued=50, last_completed=50) for r in range(3)}))
    assert done.suspects == () and "no divergence" in done.summary
    assert done.groups[0].no_dump == (3,)  # pg_config declares 4 ranks; rank 3 left no dump


def test_a_wrapped_ring_buffer_falls_back_on_pg_status() -> None:
    # Rank 1's buffer holds only old entries, but its pg_status says where it really is.
    d0 = fr_dump(0, 2, last_enqueued=900, last_completed=899)
    d1 = fr_dump(1, 2, last_enqueued=880, last_completed=880)
    d1["pg_status"]["0"] = {"last_enqueued_collective": 899, "last_started_collective": 899,
                            "last_completed_collective": 899}
    a = analyze(decoded({0: d0, 1: d1}))
    assert a.groups[0].diverged_at == 900 and a.suspects == (1,)
