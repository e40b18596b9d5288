"""The simulator's GPUs (kubesim/gpus.py, issue 28): lockstep busy shares, a throttling GPU apart from
its peers with its reasons set, counters that only grow, healthy GPUs close to each other."""

from __future__ import annotations

import random
import statistics

from kubesim.gpus import HW_THERMAL, LIMIT_W, SM_MHZ, GpuPlay


def _play(slow: bool, slower: float = 0.25, steps: int = 20) -> GpuPlay:
    play = GpuPlay(random.Random(1), jitter=0.03, throttle_pod="p1", throttle_index=3)
    rng = random.Random(2)
    for _ in range(steps):
        computes = {f"p{i}": 10.0 * rng.uniform(0.98, 1.02) * (1 + slower if slow and i == 1 else 1) for i in range(4)}
        delay = max(computes.values())
        play.step([(p, f"node-{p}", 8, c) for p, c in computes.items()], delay, slow, slower)
    return play


def test_a_throttling_gpu_reads_apart_with_its_reasons_and_its_peers_wait() -> None:
    play = _play(slow=True)
    hot = play.truth()
    assert hot is not None and (hot.pod, hot.index, hot.node) == ("p1", 3, "node-p1")
    assert hot.reasons & HW_THERMAL and abs(hot.sm_mhz - SM_MHZ / 1.25) < 0.02 * SM_MHZ
    others = [g for gs in play.pods.values() for g in gs if g is not hot]
    assert all(g.reasons == 0 and g.sm_mhz > 0.98 * SM_MHZ for g in others)
    assert hot.power_mw < 0.85 * statistics.median(g.power_mw for g in others)
    # the peers wait in the collective for it: busy, but less active than it
    assert all(g.util == 100 for g in others) and hot.gpm_sm > max(g.gpm_sm for g in others)


def test_healthy_gpus_agree_within_their_natural_spread_and_counters_grow() -> None:
    play = _play(slow=False)
    assert play.truth() is None
    gpus = [g for gs in play.pods.values() for g in gs]
    assert len(gpus) == 32 and len({g.uuid for g in gpus}) == 32
    watts = [g.power_mw / 1000 for g in gpus]
    assert max(watts) <= LIMIT_W and (max(watts) - min(watts)) / statistics.median(watts) < 0.25
    before = {g.uuid: (g.energy_mj, g.nvlink_tx_kib) for g in gpus}
    play.step([(f"p{i}", f"node-p{i}", 8, 10.0) for i in range(4)], 10.0, False, 0.0)
    for g in gpus:
        e, tx = before[g.uuid]
        assert g.energy_mj - e == g.power_mw * 10 and g.nvlink_tx_kib > tx
