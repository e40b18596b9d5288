"""The controller's progress history over a long run: memory per container, analysis and poll CPU.

The controller reads a progress-carrying container's log every log poll (30 s) and keeps, per
signal, what the polls saw (`merge_history`), then compacts it (`claims.progress.compacted`).
Simulated here without HTTP for one container training at a given cadence (one Megatron progress
line per step, with the kubelet's timestamp prefix), polled every 30 s for the given hours; each
poll's text goes through the scanner as the controller's does.

Variants, in one run:
  - baseline: every poll reads the whole 500-line tail and the history keeps every sample read
              (up to HISTORY_SAMPLES; the code before compaction also thinned the carried-over
              part to one sample per 30 s, which still kept up to 4,096).
  - compacted, whole tail: the same reads, the history compacted after each merge.
  - compacted, since last line (the controller now): after the first read, each poll asks for
              the lines since the last one read (`sinceTime`, whole seconds: that second's lines
              come again); one read in RESYNC is whole.

Figures: samples kept after the last poll, their bytes (tracemalloc), × 5,000 runs (one
progress-carrying head each, DESIGN.md's fleet), what the analysis keeps per signal between
evaluations (its stream's walk and straggler track), `analyze` per evaluation on a scan it has not
walked (the evaluation after this container's poll) and on the same scan (an evaluation after
another signal's poll, or the clock's), and CPU per poll (scan, merge, compaction; no HTTP) with its share of a core
for 5,000 heads every 30 s.

Usage: .venv/bin/python bench/bench_history.py [--hours 34] [--cadences 1,10,60,300]
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
import tracemalloc
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from collector.claims.progress import analyze, compacted  # noqa: E402
from collector.claims.stragglers import _sample_track  # noqa: E402
from collector.correlate import Signal  # noqa: E402
from collector.logrotation import RESYNC  # noqa: E402
from collector.model import Ref  # noqa: E402
from collector.progress import ProgressSample, scan_text  # noqa: E402
from collector.progress.history import merge_history  # noqa: E402
from collector.settings import ClaimSettings  # noqa: E402

T0 = datetime(2026, 1, 10, tzinfo=UTC)
POD = Ref("Pod", "ns", "run-0-head")
S = ClaimSettings()
POLL_S = 30
TAIL = 500
FLEET_RUNS = 5000
VARIANTS = (("baseline: whole tail, every sample kept", False, False),
            ("compacted, whole tail", True, False),
            ("compacted, since last line (now)", True, True))


def line(step: int, cadence: float) -> str:
    at = T0 + timedelta(seconds=step * cadence)
    return (f"{at:%Y-%m-%dT%H:%M:%S}.{at.microsecond:06d}123Z  iteration {step:>8}/ 10000000 | consumed samples: "
            f"{step * 8:>12} | elapsed time per iteration (ms): {cadence * 1000:.1f} | lm loss: "
            f"{2.5 - step * 1e-6:.6E} | number of skipped iterations:   0 |")


def read(now_s: float, cadence: float, since_s: int | None) -> bytes:
    """What the kubelet serves at `now_s`: the last TAIL lines, those from second `since_s` on."""
    last = int(now_s // cadence)
    first = max(1, last - TAIL + 1)
    if since_s is not None:  # the first step stamped at or after that second
        first = max(first, math.ceil(since_s / cadence))
    return "".join(line(step, cadence) + "\n" for step in range(first, last + 1)).encode()


def simulate(hours: float, cadence: float, *, compact: bool, since: bool) -> tuple[Signal, float]:
    """The signal the controller holds after `hours` of polls; CPU seconds a poll (scan, merge, compaction)."""
    sig: Signal | None = None
    spent = 0.0
    polls = int(hours * 3600 // POLL_S)
    last_s: int | None = None  # the whole second of the last line read
    for k in range(1, polls + 1):
        now = T0 + timedelta(seconds=k * POLL_S)
        whole = not since or last_s is None or k % RESYNC == 0
        data = read(k * POLL_S, cadence, None if whole else last_s)
        t = time.process_time()
        new = scan_text(data, source="ns/run-0-head/main")
        if sig is not None and not new.lines:
            sig = Signal(POD, "main", sig.scan, now)
        else:
            sig = Signal(POD, "main", new if sig is None else merge_history(sig.scan, new), now)
        if compact:
            sig = compacted(sig, S)
        spent += time.process_time() - t
        if data:
            last_step = int(data.rsplit(b"  iteration ", 1)[1].split(b"/", 1)[0])
            last_s = int(last_step * cadence)
    assert sig is not None
    return sig, spent / polls


def size_of(sig: Signal) -> int:
    """Bytes the history's samples hold (rebuilt under tracemalloc, as the controller would hold them)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    copy = tuple(ProgressSample(s.step, None if s.at is None else s.at + timedelta(0), None if s.loss is None
                                else s.loss + 0.0, s.line + 0, s.format, s.skipped, s.total, s.covers)
                 for s in sig.scan.samples)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(copy) == len(sig.scan.samples)
    return after - before


def analyze_us(sig: Signal, now: datetime, *, fresh: bool = True) -> float:
    """`analyze` of the one signal, µs (median of 5): each call on a scan object it has not walked
    (`fresh`: an evaluation after this container's poll), or on the same one (its walk kept)."""
    copies = [replace(sig, scan=replace(sig.scan)) for _ in range(200)] if fresh else [sig] * 200
    took = []
    for _ in range(5):
        t = time.perf_counter()
        for c in copies:
            analyze([c], S, now)
        took.append((time.perf_counter() - t) / len(copies))
        copies = [replace(sig, scan=replace(sig.scan)) for _ in range(200)] if fresh else copies
    return statistics.median(took) * 1e6


def kept_bytes(sig: Signal, now: datetime) -> int:
    """Bytes the analysis keeps for the signal between evaluations: its stream's walk (advances, tails)
    and its straggler track (`claims.progress_walk`, `claims.stragglers`), while the scan is held."""
    analyze([sig], S, now)  # (first calls fill interpreter caches: not per signal)
    _sample_track(sig.scan)
    copy = replace(sig, scan=replace(sig.scan))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    analyze([copy], S, now)
    _sample_track(copy.scan)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, default=34.0)
    ap.add_argument("--cadences", default="1,10,60,300", help="seconds between progress lines")
    args = ap.parse_args()
    print(f"history after {args.hours:g} h of {POLL_S} s polls (tail {TAIL} lines), one container")
    print("| step every | variant | samples kept | bytes | × 5,000 runs | analysis kept | analyze, new scan "
          "| analyze, same scan | CPU per poll | 5,000 heads / 30 s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for cadence in (float(c) for c in args.cadences.split(",")):
        now = T0 + timedelta(hours=args.hours)
        rows = []
        for name, compact, since in VARIANTS:
            sig, poll_s = simulate(args.hours, cadence, compact=compact, since=since)
            size = size_of(sig)
            kept = kept_bytes(sig, now)
            rows.append((len(sig.scan.samples), size, analyze_us(sig, now), poll_s))
            print(f"| {cadence:g} s | {name} | {len(sig.scan.samples):,} | {size / 1024:,.1f} KiB "
                  f"| {size * FLEET_RUNS / 2**20:,.0f} MiB | {kept / 1024:,.1f} KiB | {rows[-1][2]:,.0f} µs "
                  f"| {analyze_us(sig, now, fresh=False):,.0f} µs | {poll_s * 1e6:,.0f} µs "
                  f"| {poll_s * FLEET_RUNS / POLL_S:.3f} core |", flush=True)
        (n0, b0, a0, p0), _, (n1, b1, a1, p1) = rows
        print(f"|  | baseline / now | {n0 / n1:.1f}× | {b0 / b1:.1f}× | | | {a0 / a1:.1f}× | | {p0 / p1:.1f}× | |",
              flush=True)


if __name__ == "__main__":
    main()
