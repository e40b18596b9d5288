"""A node agent's `samples` rows decoded straight to a pack where every row is a trainer's plain step
line (`sources.agents._plain`): the samples the object path builds from the same rows, field for
field, and the very pack `PackedSamples.pack` makes of them; any other rows take the object path.
A seeded search of rows as agents and hostile peers send them (orjson's round trip: what the poller
reads)."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import orjson

from collector.progress.model import PackedSamples
from collector.sources.agents import _samples, _scan, agent_source, log_entry

SOURCE = agent_source("gpu-0")
T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _row(rng: random.Random, i: int, odd: float) -> Any:
    at = T0 + timedelta(seconds=i, microseconds=rng.randrange(10**6))
    row: list[Any] = [1000 + i, at.isoformat(), rng.uniform(0.5, 9.0), False, 500_000, 10 + i]
    if rng.random() < odd:
        k = rng.randrange(6)
        row[k] = rng.choice({
            0: [None, True, 1000.0, "1000", 2**63, 2**64 - 1, -(2**63), 2**63 - 1],
            1: [None, 17, "not a time", at.replace(tzinfo=None).isoformat(), at.isoformat().replace("+00:00", "Z"),
                at.astimezone(ZoneInfo("Asia/Kolkata")).isoformat(), "9999-12-31T23:59:59+00:00"],
            2: [None, 0, 3, 0.0, "nan", "inf", "-inf", "2.5", True, 2**64 - 1, 1e308],
            3: [True, None, "yes", 1, 0],
            4: [None, 2.5, True, 2**63, 0, -5],
            5: [None, False, True, 0, -3, 2**63, 7.0],
        }[k])
    if rng.random() < odd / 4:
        return rng.choice([row[:5], "row", None, {"step": 1}, row + ["extra"]])
    return row


def test_plain_rows_decode_to_the_pack_of_the_object_paths_samples() -> None:
    rng = random.Random(7)
    packed = other = 0
    for _ in range(3000):
        odd = rng.choice([0.0, 0.0, 0.01, 0.05, 0.3])
        fmt = rng.choice(["megatron", None])
        rows = [_row(rng, i, odd) for i in range(rng.choice([0, 1, 2, 30, 30, 31]))]
        entry = orjson.loads(orjson.dumps({"namespace": "ml", "pod": "head", "container": "trainer", "lines": 99,
                                           "format": fmt, "after": 5, "samples": rows}))
        scan = _scan(entry, SOURCE)
        want = _samples(entry["samples"], entry["format"])
        # the samples, field for field (a NaN loss by its repr: == of a sample is its fields')
        assert [repr(x) for x in scan.samples] == [repr(x) for x in want]
        assert list(scan.samples) == want or any(x.loss is not None and math.isnan(x.loss) for x in want)
        if isinstance(scan.samples, PackedSamples):
            packed += 1
            ref = PackedSamples.pack(tuple(want))
            assert ref is not None and ref.columns() is not None  # (only a plain pack is decoded so)
            got = scan.samples
            assert (got._data, got._n, got._base, got._formats, got._kept, got._plain) == \
                (ref._data, ref._n, ref._base, ref._formats, ref._kept, ref._plain)
            assert got._base is not None and ref._base is not None and got._base.tzinfo is ref._base.tzinfo
            assert got.columns() == ref.columns()
        else:
            other += 1
            # (rows the object path takes: samples, and an odd one that is not a plain pack's)
            assert type(scan.samples) is tuple
            if entry["samples"] and all(type(r) is list and len(r) == 6 for r in entry["samples"]) \
                    and all(type(v) is int for r in entry["samples"] for v in (r[0], r[4], r[5])) \
                    and all(type(r[2]) is float and math.isfinite(r[2]) and r[3] is False for r in entry["samples"]) \
                    and all(type(r[1]) is str and r[1].endswith("+00:00") for r in entry["samples"]) \
                    and all(abs(v) < 2**63 for r in entry["samples"] for v in (r[0], r[4], r[5])):
                raise AssertionError(f"plain rows left to the object path: {entry['samples'][:3]}")
        got_entry = log_entry(entry, SOURCE)
        assert got_entry is not None
        if isinstance(got_entry, tuple):  # (no row at all: a quiet container's increment)
            assert not entry["samples"]
        else:
            assert [repr(x) for x in got_entry.scan.samples] == [repr(x) for x in want]
    assert packed > 800 and other > 800, (packed, other)


def test_a_trainers_steady_increment_is_decoded_to_a_pack_its_samples_unbuilt() -> None:
    rows = [[1000 + i, (T0 + timedelta(seconds=i)).isoformat(), 2.0 + i / 100, False, 500_000, 10 + i]
            for i in range(30)]
    entry = orjson.loads(orjson.dumps({"namespace": "ml", "pod": "head", "container": "trainer", "lines": 40,
                                       "format": "megatron", "after": 9, "samples": rows}))
    scan = _scan(entry, SOURCE)
    assert isinstance(scan.samples, PackedSamples)
    assert scan.samples._built is None  # (nothing built: the loop reads its columns)
    cols = scan.samples.columns()
    assert cols is not None and list(cols[0]) == [1000 + i for i in range(30)]
    assert scan.samples.sample(-1).at == T0 + timedelta(seconds=29)
    assert scan.samples.sample(0).format == "megatron"
