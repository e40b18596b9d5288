"""Which evaluations make the capture hook write a bundle: incidents once, history never, bounded rate."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from collector.capture import EvidenceCapture
from collector.claims import evaluate
from collector.correlate import build_index
from collector.kube import normalize
from collector.settings import BundleSettings, Settings
from exporters.bundles.storage import LocalStore
from kubesim.clock import ManualClock
from tests.bundles.scenario import NOW, RUN, objects


def feed(cap: EvidenceCapture, objs: list[dict[str, Any]], clock: ManualClock) -> None:
    recs = [r for o in objs if (r := normalize(o).record) is not None]
    index = build_index(recs)
    index.synced.update(dict.fromkeys(("Pod", "Node", "Event", "TauRun"), clock.now()))
    for ev in index.all_evidence():
        cap.evaluated(ev, evaluate(ev, clock.now(), Settings().claims), clock.now())


def wait_written(cap: EvidenceCapture, n: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while len(cap.written) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)


def phase(objs: list[dict[str, Any]], value: str) -> list[dict[str, Any]]:
    out = [dict(o) for o in objs]
    out[0] = {**out[0], "status": {**out[0]["status"], "phase": value}}
    return out


def test_run_failure_is_an_incident_once_but_an_old_failure_is_history(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    cfg = BundleSettings(directory=str(tmp_path), min_interval_per_run=timedelta(0))
    cap = EvidenceCapture(cfg, None, clock.now, store=LocalStore(tmp_path / "store"))
    cap.open()
    try:
        objs = objects(workers=1)
        feed(cap, objs, clock)
        clock.advance(10)
        feed(cap, phase(objs, "Failed"), clock)
        wait_written(cap, 1)
        assert len(cap.written) == 1 and ".tar.gz" not in cap.written[0]
        clock.advance(10)
        feed(cap, phase(objs, "Failed"), clock)  # the same failure again: no second bundle
        # A second controller that first sees the run already failed: nothing to capture.
        other = EvidenceCapture(cfg, None, clock.now, store=LocalStore(tmp_path / "store2"))
        other.open()
        try:
            feed(other, phase(objs, "Failed"), clock)
            time.sleep(0.5)
            assert other.written == []
        finally:
            other.close()
        wait_written(cap, 2, timeout=1.5)  # would a second one come?
        assert len(cap.written) == 1
    finally:
        cap.close()
    m = json.loads((Path(cap.written[0]) / "manifest.json").read_text())
    assert m["trigger"] == "run failed" and m["run"]["name"] == RUN


def test_rate_limit_per_run(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    cfg = BundleSettings(directory=str(tmp_path), min_interval_per_run=timedelta(minutes=10))
    cap = EvidenceCapture(cfg, None, clock.now, store=LocalStore(tmp_path / "store"))
    cap.open()
    try:
        objs = objects(workers=1)
        feed(cap, objs, clock)
        for value in ("Failed", "Running", "Failed"):
            clock.advance(60)
            o = phase(objs, value)
            if value == "Running":  # the pod restarts: running contradicted, a new incident
                o[1] = {**o[1], "status": {**o[1]["status"], "phase": "Pending"}}
            feed(cap, o, clock)
        wait_written(cap, 2, timeout=1.5)
        assert len(cap.written) == 1 and cap.skipped >= 1  # one bundle per run per 10 minutes
    finally:
        cap.close()
