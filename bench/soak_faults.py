"""Fault soak (`make soak`, not in CI): a controller against the simulator under rotating faults.

For --minutes, every few seconds one fault is injected through the simulator's fault API (410
storms, dropped watches and connections, 429 with Retry-After, 500s, slow answers) while runs
start, crash, recover and go away. Then faults are cleared and the faulted controller's claims,
once settled, must equal those of a controller that started on the final cluster (the
uninterrupted answer), and the claim transitions it exported must have none lost or repeated and
end where that controller's start (tests/faults/streams.py). Prints the faults injected and the
outcome; exits 1 on a difference.

Usage: .venv/bin/python bench/soak_faults.py [--minutes 10] [--seed 1]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from collector.controller import Controller  # noqa: E402
from collector.sources.kube_api import KubeApi, api_client_for  # noqa: E402
from exporters.adx import AdxExporter  # noqa: E402
from kubesim.errors import ApiError  # noqa: E402
from kubesim.server import Simulator  # noqa: E402
from tests.controller.test_controller import FAST, T0, Clock, _diff, apply_run, settings, settle  # noqa: E402
from tests.faults.streams import claim_rows, sink, stream_problems  # noqa: E402


def _start(s: Simulator, clock: Clock, directory: Path) -> tuple[Controller, AdxExporter]:
    exporter = sink(directory)
    c = Controller(KubeApi(api_client_for(s.base_url)), settings(), clock.now, sink=exporter)
    c.open()
    deadline = time.monotonic() + 60
    while not c.ready.wait(0.1):
        if time.monotonic() > deadline:
            raise SystemExit("controller never ready")
    return c, exporter


def _at(row: dict[str, Any]) -> Any:
    return row["Timestamp"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    logging.disable(logging.WARNING)
    rng = random.Random(a.seed)
    clock = Clock(T0)
    injected: dict[str, int] = {}
    tmp = Path(tempfile.mkdtemp(prefix="soak-faults-"))
    with Simulator(settings=FAST, watch_window=100, clock=clock) as s:
        s.start()
        for i in range(a.runs):
            apply_run(s, f"run-{i}", ns=f"team-{i % 3}")
        c, c_sink = _start(s, clock, tmp / "faulted")
        end = time.monotonic() + a.minutes * 60
        try:
            while time.monotonic() < end:
                kind = rng.choice(["gone", "drop_watch", "drop", "429", "500", "delay"])
                injected[kind] = injected.get(kind, 0) + 1
                if kind == "gone":
                    s.faults.gone(rng.randint(1, 8))
                elif kind == "drop_watch":
                    s.faults.drop_watch(after_events=rng.randint(0, 3), count=rng.randint(1, 10))
                elif kind == "drop":
                    s.faults.drop(count=rng.randint(1, 10), verbs=("list", "get"))
                elif kind == "429":
                    s.faults.fail(429, count=rng.randint(1, 5), retry_after_s=rng.randint(1, 3))
                elif kind == "500":
                    s.faults.fail(500, count=rng.randint(1, 10), verbs=("list", "watch"))
                else:
                    s.faults.delay(rng.uniform(0.1, 1.5), count=rng.randint(1, 5))
                # The cluster's clock moves a second a round and what the runs do is dated by it: a run
                # that crashes again crashes later (on a stopped clock every crash and recovery had the
                # same times, so a repeat transition was the earlier one again: the same RowId).
                clock.advance(1)
                for _ in range(rng.randint(1, 6)):
                    i = rng.randrange(a.runs)
                    if rng.random() < 0.1:
                        with contextlib.suppress(ApiError):  # already gone
                            s.store.delete(s.resource("taugrid.io/v1alpha1", "TauRun"), f"team-{i % 3}", f"run-{i}")
                    else:
                        apply_run(s, f"run-{i}", ns=f"team-{i % 3}", crash=rng.random() < 0.4, at=clock.now())
                time.sleep(rng.uniform(0.5, 3))
                s.faults.clear()
            faulted = settle(c, since=time.monotonic())
        finally:
            c.close()
            c_sink.close()
        clean_c, clean_sink = _start(s, clock, tmp / "clean")
        try:
            clean = settle(clean_c, since=time.monotonic())
        finally:
            clean_c.close()
            clean_sink.close()
    rows, want = claim_rows(tmp / "faulted" / "store.duckdb"), claim_rows(tmp / "clean" / "store.duckdb")
    # The clean controller saw only the final cluster: compare where each claim's stream ends.
    ends = {(r["RunUid"], r["Claim"]): (r["Verdict"], r["Observed"]) for r in sorted(rows, key=_at)}
    clean_ends = {(r["RunUid"], r["Claim"]): (r["Verdict"], r["Observed"]) for r in want}
    problems = stream_problems(rows) + [f"{k}: stream ends at {ends.get(k)}, the clean controller's at {v}"
                                        for k, v in clean_ends.items() if ends.get(k) != v]
    print(f"exported: {len(rows)} claim transitions; {len(problems)} lost, repeated or ending elsewhere")
    for p in problems[:20]:
        print("  ", p)
    diff = _diff(faulted, clean)
    print(f"soak {a.minutes:g} min, seed {a.seed}: faults {injected}; {len(clean)} runs; "
          f"{'claims equal to an uninterrupted controller' if not diff else f'{len(diff)} differences'}")
    for d in diff[:20]:
        print("  ", d)
    sys.exit(1 if diff or problems else 0)


if __name__ == "__main__":
    main()
