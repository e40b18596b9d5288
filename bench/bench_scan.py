"""Log-scan throughput against plain line iteration of the same file, same run, one core.

Generates a ~50 MB mixed log (Megatron iteration lines, kubelet-timestamped, amid Python logging,
NCCL INFO and warning noise, with a few XID/watchdog lines), then times:
  - plain: `for line in open(path, "rb")` (the floor any line scanner pays),
  - scan:  collector.progress.scan_path (decode, prefix parsing, prechecks, parsers),
and the scan's peak traced memory (tracemalloc; bounded by design, issue 8).
Times are CPU seconds of this process (time.process_time): the machine is shared, and wall time
measured what the neighbours did. With --baseline REF, the scan of git commit REF (its collector/, from
`git archive`) and today's are each timed in a child process of their own, alternating, --repeat times,
on the same file: medians and the ratio (CPU per line, neighbours' load shared alike).
Usage: .venv/bin/python bench/bench_scan.py [--mb 50] [--repeat 3] [--baseline 1b82892]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector.progress import scan_path

ROOT = Path(__file__).resolve().parents[1]

_NOISE = (
    "[2024-07-17 19:44:06,829] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 812.3 | bwd: 1630.1",
    "node-3:2211:2890 [5] NCCL INFO Channel 07/24 : 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
    "node-3:2211:2890 [5] NCCL INFO comm 0x55d5c8a0 rank 5 nranks 16 cudaDev 5 busId 9b000 - Init COMPLETE",
    "/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:429: UserWarning: torch.utils."
    "checkpoint: please pass in use_reentrant=True or use_reentrant=False explicitly.",
    "INFO:megatron.core.datasets.blended_megatron_dataset_builder:Building dataset splits with cls=GPTDataset",
    "saving checkpoint at iteration    1000 to /checkpoints/gpt-175b",
    " validation loss at iteration 1000 | lm loss value: 2.301440E+00 | lm loss PPL: 9.988251E+00 |",
    "(min, max) time across ranks (ms):",
    "    forward-backward ...............................: (8541.20, 8560.77)",
)


def generate(path: Path, megabytes: int, share: float = 0.3) -> int:
    rng = random.Random(0)
    t = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    target = megabytes * 1_000_000
    written = 0
    step = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            t += timedelta(microseconds=rng.randint(1_000, 900_000))
            stamp = t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z "
            r = rng.random()
            if r < share:
                step += 1
                line = (
                    f" iteration {step:>8}/  250000 | consumed samples: {step * 1024:>12} | elapsed time per "
                    f"iteration (ms): {rng.uniform(8000, 9000):.1f} | learning rate: 9.150E-06 | global batch "
                    f"size:  1024 | lm loss: {rng.uniform(1.5, 3):.6E} | loss scale: 1.0 | grad norm: "
                    f"{rng.uniform(0.1, 0.5):.3f} | number of skipped iterations:   0 | number of nan "
                    "iterations:   0 |"
                )
            elif r < share + 0.00005:
                line = "NVRM: Xid (PCI:0000:9b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
            elif r < share + 0.0001:
                line = (
                    "[rank3]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught "
                    "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=4, "
                    "NumelOut=4, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
                )
            else:
                line = rng.choice(_NOISE)
            data = stamp + line + "\n"
            f.write(data)
            written += len(data)
    return written


def plain(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        for _ in f:
            n += 1
    return n


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _export(ref: str, into: Path) -> Path:
    """collector/ of git commit `ref`, written under `into` (no checkout touched)."""
    out = into / f"baseline-{ref}"
    out.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "collector"],
                         check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(out, filter="data")
    return out


def _child_scan(tree: Path, path: Path) -> float:
    """CPU seconds of one scan_path of `path` by the collector in `tree`, in a fresh process."""
    code = ("import sys, time; from collector.progress import scan_path; p = sys.argv[1]; "
            "t = time.process_time(); scan_path(p); print(time.process_time() - t)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
    return float(out.stdout)


def compare(ref: str, megabytes: int, repeat: int) -> None:
    """Today's scan beside REF's, alternating child processes on the same file: medians."""
    with tempfile.TemporaryDirectory() as tmp:
        base = _export(ref, Path(tmp))
        for share in (0.3, 0.02):
            path = Path(tmp) / "mixed.log"
            generate(path, megabytes, share)
            lines = plain(path)
            runs: dict[str, list[float]] = {"now": [], ref: []}
            for _ in range(repeat):
                runs["now"].append(_child_scan(ROOT, path))
                runs[ref].append(_child_scan(base, path))
            now, then = statistics.median(runs["now"]), statistics.median(runs[ref])
            print(f"\n{lines} lines, {share:.0%} Megatron iteration lines; median of {repeat}, alternating")
            for name, t in ((ref, then), ("now", now)):
                shown = ", ".join(f"{x:.3f}" for x in runs[name])
                print(f"  {name:>8}: {t:.3f} s  {t / lines * 1e6:.2f} µs/line   (runs {shown})")
            print(f"  now / {ref}: {now / then:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", metavar="REF", help="also time the scan of this git commit, alternating")
    args = ap.parse_args()
    if args.baseline:
        print(f"cpu count {os.cpu_count()}, one core used; CPU seconds of scan_path, load {os.getloadavg()[0]:.2f}")
        compare(args.baseline, args.mb, args.repeat)
        return
    print(f"cpu count {os.cpu_count()}, one core used; best of {args.repeat}, CPU seconds")
    # share = fraction of lines that are Megatron iteration lines (the rest is noise)
    for share in (0.3, 0.02):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "mixed.log"
            size = generate(path, args.mb, share)
            mb = size / 1e6
            lines = plain(path)
            t_plain = best_of(args.repeat, lambda: plain(path))  # noqa: B023 (called before the loop moves on)
            t_scan = best_of(args.repeat, lambda: scan_path(path))  # noqa: B023
            result = scan_path(path)
            print(f"\n{mb:.1f} MB, {lines} lines, {share:.0%} Megatron iteration lines")
            print(f"  plain line iteration: {mb / t_plain:8.1f} MB/s  ({t_plain:.3f} s)")
            print(f"  scan_path:            {mb / t_scan:8.1f} MB/s  ({t_scan:.3f} s)")
            print(f"  ratio (scan time / plain time): {t_scan / t_plain:.1f}x")
            tracemalloc.start()
            scan_path(path)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            print(f"  scan_path peak traced memory: {peak / 1e6:.1f} MB")
            print(
                f"  found: {len(result.samples)} samples ({result.format}), last step "
                f"{result.samples[-1].step if result.samples else None}, {len(result.hangs)} hangs, "
                f"{len(result.xids)} xids, {len(result.diagnostics)} diagnostics"
            )


if __name__ == "__main__":
    main()
