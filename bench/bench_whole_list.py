"""An unpaginated pod list (the reflector's fallback after a paged list expired), read the old way
(the whole answer, then decoded whole) and the new way (off the socket, item by item: Listing with
limit 0), each in a fresh process: peak RSS and seconds, interleaved, medians over repeats.

The simulator runs in a process of its own, with `--pods` realistic ~6 KB pods (bench_controller's);
each child lists them once with the pod decoder the controller uses and keeps only each pod's name
(a consumer keeping small records). Peak RSS is the list's own (VmHWM reset before it, Linux).
"old" is the Listing loop as it was before item-by-item reads (`get_text`, `Decoder.page`), kept
here. `--modes` may add "pages" (limit 500, the page path) for reference, and "pages-streamed"
(pages read item by item as the whole list is: what moving the page path over would give).

Usage: .venv/bin/python bench/bench_whole_list.py [--pods 48700] [--repeats 3] [--modes old,new]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def status_kib(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak() -> bool:
    """The peak RSS (VmHWM) set back to the current RSS (Linux), so that it is the list's own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _name(item: Any) -> str:
    """A listed pod's name: a dict's, or a typed `PodObject`'s (the pod decoder's clean items)."""
    name: str = item["metadata"]["name"] if isinstance(item, dict) else item.metadata.name
    return name


def child(mode: str, url: str) -> None:
    from collector.sources.decode import decoder_for
    from collector.sources.kube_api import KubeApi, Resource, api_client_for

    pod = Resource("Pod", "", "v1", "pods", optional=False)
    api = KubeApi(api_client_for(url), request_timeout=600)
    decoder = decoder_for("v1", "Pod")
    names: list[str] = []
    base = status_kib()
    reset = reset_peak()
    t0, c0 = time.monotonic(), time.process_time()
    if mode == "old":  # one unpaginated answer read whole and decoded whole: the page path, as it was
        from collector.sources.kube_api import Listing
        for item in Listing(api, pod, 0, decoder)._page([]):
            names.append(_name(item))
    else:
        if mode == "pages-streamed":  # pages read as the whole list is: what the page path would cost so
            from collector.sources import kube_api
            kube_api.Listing._page = kube_api.Listing._streamed  # type: ignore[method-assign]
        for item in api.iter_list(pod, limit=0 if mode == "new" else 500, decoder=decoder):
            names.append(_name(item))
    secs, cpu = time.monotonic() - t0, time.process_time() - c0
    # KiB on Linux; without the reset, the process's peak (imports included)
    peak = status_kib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"mode": mode, "items": len(names), "s": secs, "cpu_s": cpu, "base_mib": base / 1024,
                      "peak_mib": peak / 1024, "after_mib": status_kib() / 1024}))


def populate(pods: int, per_run: int) -> tuple[Any, Any, str]:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_controller import _sim_main

    parent, conn = mp.Pipe()
    proc = mp.Process(target=_sim_main, args=(conn, None, 1000), daemon=True)
    proc.start()
    url = parent.recv()
    runs = -(-pods // per_run)
    t = time.monotonic()
    parent.send(("populate", 0, runs, per_run, max(1, pods // 8)))
    got = parent.recv()
    if isinstance(got, Exception):
        raise got
    print(f"simulator: {got['pods']} pods ({statistics.mean(got['sizes']):.0f} bytes each as served) "
          f"in {time.monotonic() - t:.0f} s", flush=True)
    return proc, parent, url


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=48_700)
    ap.add_argument("--per-run", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="old,new")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "URL"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    modes = a.modes.split(",")
    proc, conn, url = populate(a.pods, a.per_run)
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        for rep in range(a.repeats):
            order = modes if rep % 2 == 0 else modes[::-1]  # interleaved, the order alternating
            for m in order:
                out = subprocess.run([sys.executable, __file__, "--child", m, url], env=env, check=True,
                                     capture_output=True, text=True)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                rows[m].append(row)
                print(f"  {rep} {m:<5} {row['items']} pods {row['s']:6.2f} s (cpu {row['cpu_s']:5.2f} s)  "
                      f"peak {row['peak_mib']:7.0f} MiB  base {row['base_mib']:4.0f}  after {row['after_mib']:6.0f} "
                      f"  load {loadavg()}", flush=True)
    finally:
        conn.send(("close",))
        proc.join(30)
    print(f"\nmedians over {a.repeats} (load average now {loadavg()}):")
    for m in modes:
        r = rows[m]
        print(f"  {m:<5} {statistics.median(x['s'] for x in r):6.2f} s"
              f"  cpu {statistics.median(x['cpu_s'] for x in r):5.2f} s"
              f"  peak {statistics.median(x['peak_mib'] for x in r):6.0f} MiB"
              f"  after {statistics.median(x['after_mib'] for x in r):6.0f} MiB")


if __name__ == "__main__":
    main()
