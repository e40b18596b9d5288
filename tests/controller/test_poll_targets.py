"""What the controller lists for its pollers: nothing for a poller that is off (no tuple per pod)."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

import pytest

from collector.controller import Controller
from collector.settings import Settings
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.run import start_simulation


def _targets(**off: timedelta) -> tuple[int, int, int, int, list[set[int]]]:
    """(runs, log targets, checkpoint targets, Ray targets, each run's log rotation slots) once the
    default scenario's pods run."""
    session = start_simulation(None, "127.0.0.1:0", 20.0)
    base = Settings()
    cfg = replace(base.controller, leader_election=False, tick=timedelta(seconds=1), **off)
    ctl = Controller(KubeApi(api_client_for(session.base_url)), replace(base, controller=cfg),
                     session.engine.clock.now)
    try:
        ctl.open()
        deadline = time.monotonic() + 40
        while not (ctl.ready.is_set() and any(rc.running.observed.value == "true" for rc in ctl.claims.values())):
            assert time.monotonic() < deadline, "no run ever ran"
            time.sleep(0.2)
        time.sleep(1.5)  # a tick after: every run evaluated with its pods running
        logs = ctl.sources.get("logs")
        slots = [{t[4] for t in ts} for ts in logs.targets._by_run.values()] if logs is not None else []
        return (len(ctl.claims), *(len(s.targets.current) if (s := ctl.sources.get(name)) is not None else 0
                                   for name in ("logs", "expstore", "ray")), slots)
    finally:
        ctl.close()
        session.close()


@pytest.mark.parametrize("poll", [False, True], ids=["pollers-off", "pollers-on"])
def test_targets_are_listed_only_for_pollers_that_run(poll: bool) -> None:
    # On: intervals long enough that no pass runs in the test (the lists are what is checked).
    interval = timedelta(hours=1) if poll else timedelta(0)
    runs, logs, checkpoints, ray, slots = _targets(log_poll_interval=interval, checkpoint_poll_interval=interval,
                                                   ray_poll_interval=interval)
    assert runs > 0
    if poll:
        assert logs > 0 and ray > 0, (logs, checkpoints, ray)
        # one rotation slot per run (its quiet containers are read in one pass), runs apart
        assert len(slots) > 1 and all(len(s) == 1 for s in slots), slots
        assert len(set.union(*slots)) == len(slots), slots
    else:
        assert (logs, checkpoints, ray) == (0, 0, 0)
