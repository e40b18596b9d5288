"""What evidence bundles cost the controller, against a baseline measured in the same run.

  - history hook: ObjectHistory.record per watch event (a realistic ~6 KB pod, new resourceVersion
    each time) against the baseline the controller already pays per event, `normalize` of the same
    decoded object; and the memory the history holds per pod at its bounds;
  - bundle write: one stalled 16-rank run (2 pods, logs, 16 flight-recorder dumps) written and
    redacted, against copying the same input bytes to disk unredacted.
Usage: .venv/bin/python bench/bench_bundles.py [--events 20000] [--pods 5000]
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_controller import realistic_pod  # noqa: E402

from collector.capture import bundle_from_dump  # noqa: E402
from collector.kube import normalize  # noqa: E402
from collector.settings import Settings  # noqa: E402
from exporters.bundles.history import ObjectHistory  # noqa: E402
from exporters.bundles.writer import write_bundle  # noqa: E402
from tests.bundles.scenario import NOW, RUN, write_scenario  # noqa: E402

T = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


def bench_hook(events: int) -> None:
    base = realistic_pod("research", "run-0", 0, T, "gpu-0001")
    objs: list[dict[str, Any]] = []
    for i in range(events):
        o = copy.deepcopy(base) if i < 50 else objs[i % 50]
        o["metadata"] = {**o["metadata"], "resourceVersion": str(1000 + i)}
        objs.append(o)
    size = len(__import__("orjson").dumps(base))
    t0 = time.perf_counter()
    for o in objs:
        normalize(o)
    t_norm = time.perf_counter() - t0
    h = ObjectHistory()
    t0 = time.perf_counter()
    for i, o in enumerate(objs):
        h.record(("Pod", "research", f"p{i % 500}"), o, T)
    t_hist = time.perf_counter() - t0
    print(f"history hook: {events} events of a {size / 1024:.1f} KB pod")
    print(f"  baseline normalize      {t_norm / events * 1e6:7.1f} µs/event")
    print(f"  ObjectHistory.record    {t_hist / events * 1e6:7.1f} µs/event "
          f"({t_hist / t_norm * 100:.0f}% of normalize)")


def bench_memory(pods: int) -> None:
    base = realistic_pod("research", "run-0", 0, T, "gpu-0001")
    tracemalloc.start()
    h = ObjectHistory(max_bytes=64 << 20, versions=16)
    before = tracemalloc.get_traced_memory()[0]
    for i in range(pods):
        for v in range(3):
            o = {**base, "metadata": {**base["metadata"], "name": f"p{i}", "resourceVersion": str(v)}}
            h.record(("Pod", "research", f"p{i}"), o, T)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    print(f"history memory: {pods} pods × 3 versions: {held / 2**20:.1f} MiB held "
          f"({held / pods / 1024:.1f} KB/pod), {h.bytes / 2**20:.1f} MiB counted, {h.evicted} evicted "
          f"(bound 64 MiB)")


def bench_write() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dump = write_scenario(root / "dump")
        inp = bundle_from_dump(dump, RUN, Settings(), at=NOW, artifacts_dir=root / "artifacts")
        raw = sum(len(o.versions[0][2]) for o in inp.objects) + sum(len(t.data or b"") for t in inp.logs) + sum(
            len(a.data) for a in inp.artifacts)
        t0 = time.perf_counter()
        for i in range(5):
            d = root / f"copy{i}"
            d.mkdir()
            for j, a in enumerate(inp.artifacts):
                (d / f"a{j}").write_bytes(a.data)
            for j, t in enumerate(inp.logs):
                (d / f"l{j}").write_bytes(t.data or b"")
            for j, o in enumerate(inp.objects):
                (d / f"o{j}").write_bytes(o.versions[0][2])
        t_copy = (time.perf_counter() - t0) / 5
        t0 = time.perf_counter()
        for i in range(5):
            write_bundle(inp, root / f"b{i}")
        t_write = (time.perf_counter() - t0) / 5
        files = sum(1 for p in (root / "b0").rglob("*") if p.is_file())
        out = sum(p.stat().st_size for p in (root / "b0").rglob("*") if p.is_file())
        shutil.rmtree(root / "b1")
        print(f"bundle write: stalled 16-rank run, {raw / 1024:.0f} KB of input → {files} files, {out / 1024:.0f} KB")
        print(f"  baseline raw copy       {t_copy * 1000:7.1f} ms")
        print(f"  write_bundle            {t_write * 1000:7.1f} ms (redact, hash, analyse, page)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--pods", type=int, default=5_000)
    args = ap.parse_args()
    bench_hook(args.events)
    bench_memory(args.pods)
    bench_write()


if __name__ == "__main__":
    main()
