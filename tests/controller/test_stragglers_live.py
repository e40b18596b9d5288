"""The live controller names a straggler from its pods' logs and exports it (issue 28): the official
client against the simulator's API, the log poller's `--timestamps` tails, the claim engine, the
Prometheus exposition."""

from __future__ import annotations

import random
from datetime import timedelta

from exporters.prometheus import render
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, Clock, apply_run, start, wait_until

LINE = ("iteration {s:>8}/  250000 | consumed samples: {c:>12} | elapsed time per iteration (ms): 10012.2 | "
        "lm loss: 2.504220E+00 | loss scale: 1.0 | number of skipped iterations:   0 |")


def test_the_controller_names_the_slow_pod_and_exports_it() -> None:
    with Simulator(settings=FAST, watch_window=50) as sim:
        sim.start()
        _play(sim)


def _play(sim: Simulator) -> None:
    apply_run(sim, "llm", workers=4)
    rng = random.Random(3)
    start_at = T0 - timedelta(seconds=10 * 40 + 20)
    for k in range(40):
        step_start = start_at + timedelta(seconds=10 * k)
        for i in range(4):
            c = 8.0 * (1 + rng.uniform(-0.03, 0.03)) * (1.25 if i == 2 else 1.0)  # pod w2: 25 % slower
            sim.store.append_log("research", f"llm-w{i}", "main", [LINE.format(s=k + 1, c=(k + 1) * 1024)],
                                 step_start + timedelta(seconds=c))
    c = start(sim, Clock(T0), log_poll_interval=timedelta(seconds=0.1))
    try:
        def named() -> tuple[str, ...]:
            rc = next((r for r in c.claims.values() if r.ref.name == "llm"), None)
            return tuple(x.pod for x in rc.stragglers.suspects) if rc is not None and rc.stragglers else ()

        wait_until(lambda: named() == ("llm-w2",), what="the straggler named")
        rc = next(r for r in c.claims.values() if r.ref.name == "llm")
        assert rc.progressing.observed.value == "true"
        (s,) = rc.stragglers.suspects if rc.stragglers else ()
        assert s.node == "gpu-2" and s.basis == "arrival" and 0.15 < s.lag_ratio < 0.35
        text = render(c.registry).decode()
        assert 'taugrid_run_straggler{basis="arrival",kind="TauRun",namespace="research",node="gpu-2",' \
               'pod="llm-w2",' in text
    finally:
        c.close()
