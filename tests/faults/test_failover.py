"""Leader failover under load (issue 9): two `controller` processes with leader election against one
simulator, while the scenario engine plays at speed and a writer thread changes pods and events
about RATE (200) times a second. The leader is SIGKILLed mid-stream (it cannot release its Lease): the
standby takes over once the Lease expires. The killed replica comes back as a standby; the new
leader is then SIGTERMed (it releases its Lease): the standby takes over at once.

Processes, not in-process controllers: SIGKILL is the fault, and only a process can be killed with
no chance to release its Lease, flush its spool or close its store.

Asserted: (a) never two replicas saying they lead (`taugrid_collector_leader` on each /metrics,
sampled throughout); (b) after both handovers the leader's claims equal those of a controller
without election that ran uninterrupted beside them; (c) the claim transitions all replicas
exported, taken together (the killed one's spool delivered as its next start would), have no lost
and no duplicated transition and equal the uninterrupted controller's, by the rule written in
`tests/faults/streams.py`. In short: a new leader's republished state is not a new row. What the
old leader wrote, the new one writes again only under the same RowId (one row); what the old one
died before writing, the new one writes as the transition it was, with its previous verdict.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kubesim import ManualClock, ScenarioEngine, Simulator, SimulatorSettings
from kubesim.scenario import default_scenario_path, load_scenario
from tests.controller.test_controller import server_side, wait_until
from tests.dumpkit import event, pod, ts
from tests.faults.streams import claim_rows, deliver_leftovers, stream_problems
from tests.faults.test_process_faults import _free_port, _kubeconfig, _safe
from tests.test_explain_fixtures import taurun

ROOT = Path(__file__).resolve().parents[2]
LEASE_S, RENEW_S = 4.0, 0.5
STORY = [f"story-{i}" for i in range(4)]  # the writer's runs: one flips crash ↔ healthy every FLIP_S
FLIP_S = 0.8
RATE = 200  # the writer's pod and event changes per second (flips aside)
SPEED = 10  # scenario seconds per real second
CREATED = datetime.fromisoformat("2026-01-10T09:00:00+00:00")


def _config(path: Path, *, election: bool) -> Path:
    path.write_text(
        "controller:\n"
        f"  leader_election: {'true' if election else 'false'}\n"
        "  lease_namespace: default\n"
        f"  lease_duration: {LEASE_S}s\n  lease_renew: {RENEW_S}s\n"
        "  log_poll_interval: 0\n  ray_poll_interval: 0\n  checkpoint_poll_interval: 0\n"
        "  tick: 1s\n  watch_timeout_s: 30\n")
    return path


class Replica:
    """One `controller` process writing its own embedded store (its spool beside it)."""

    def __init__(self, tmp: Path, name: str, kubeconfig: Path, config: Path) -> None:
        self.name = name
        self.port = _free_port()
        self.store = tmp / f"{name}.duckdb"
        self.spool = tmp / f"{name}.spool"
        self.log = (tmp / f"{name}.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from collector.entry import main; main()", "controller",
             "--kubeconfig", str(kubeconfig), "--config", str(config), "--metrics-address", f"127.0.0.1:{self.port}",
             "--export-store", str(self.store), "--log-level", "WARNING"],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=ROOT)

    def metrics(self) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                return str(r.read().decode())
        except (OSError, http.client.HTTPException):  # a process killed mid-answer cuts it short
            return ""

    def leads(self) -> bool:
        try:
            for fam in text_string_to_metric_families(self.metrics()):
                if fam.name == "taugrid_collector_leader":
                    return any(s.value == 1.0 for s in fam.samples)
        except ValueError:  # an answer cut short: the sampler thread must live on
            return False
        return False

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Load:
    """The scenario engine playing at SPEED, and a writer: label churn on its runs' pods, events
    counting up, and one run flipping between crash-looping and healthy every FLIP_S.

    A crash-looping worker recovers as a new pod (the old one deleted): the collector evaluates on
    the simulator's scenario clock (its Date), where a container that restarted keeps the run's
    `running` false for `restart_window` (10 min, a minute of real time at SPEED); a pod restarting
    in place would flip once and never come back within the test, so no transition would follow
    the failovers."""

    def __init__(self, sim: Simulator, engine: ScenarioEngine, clock: ManualClock) -> None:
        self.sim, self.engine, self.clock = sim, engine, clock
        self.stop = threading.Event()
        self.crashed = dict.fromkeys(STORY, False)
        self.restarts = dict.fromkeys(STORY, 0)
        self.generation = dict.fromkeys(STORY, 0)  # the worker pod's incarnation
        self.changes = 0
        self.started = 0.0
        self.flips = 0
        self.errors: list[str] = []
        self._flipped_at = {n: ts(CREATED + timedelta(minutes=1)) for n in STORY}
        self._threads = [threading.Thread(target=self._play, daemon=True),
                         threading.Thread(target=self._write, daemon=True)]

    def start(self) -> None:
        self.started = time.monotonic()
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            if t.ident is not None:
                t.join(10)

    def pod(self, name: str, churn: int) -> dict[str, Any]:
        crashed, at = self.crashed[name], self.clock.now()
        state: dict[str, Any] = ({"waiting": {"reason": "CrashLoopBackOff"}} if crashed
                                 else {"running": {"startedAt": ts(at)}})
        container: dict[str, Any] = {"name": "main", "ready": not crashed, "restartCount": self.restarts[name],
                                     "state": state}
        if self.restarts[name]:
            container["lastState"] = {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                                     "finishedAt": self._flipped_at[name]}}
        status = {"phase": "Running", "containerStatuses": [container], "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(CREATED + timedelta(seconds=1))},
            {"type": "Ready", "status": "False" if crashed else "True", "lastTransitionTime": self._flipped_at[name]}]}
        return server_side(pod(self.pod_name(name), "research", CREATED, node="aks-a100-4", gpus=8,
                               labels={"taugrid.io/run": name, "load/churn": str(churn)}, status=status))

    def pod_name(self, name: str) -> str:
        return f"{name}-g{self.generation[name]}-w0"

    def setup(self) -> None:
        for name in STORY:
            self.sim.apply(server_side(taurun(name, "research", "Running", CREATED, workers=1, profile="a100-1x8")))
            self.sim.apply(self.pod(name, 0))

    def _play(self) -> None:
        t0, m0 = self.engine.elapsed, time.monotonic()
        while not self.stop.wait(0.1):
            try:
                self.engine.step_to(t0 + (time.monotonic() - m0) * SPEED)
            except Exception as e:  # noqa: BLE001 (reported by the test)
                self.errors.append(f"engine: {e}")

    def _write(self) -> None:
        i, next_flip = 0, time.monotonic() + FLIP_S
        regarding = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "story-0-w0", "uid": "uid-story-0-w0"}}
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                for _ in range(RATE // 20):
                    i += 1
                    if i % 2:
                        self.sim.apply(self.pod(STORY[i % len(STORY)], i))
                    else:
                        n = i % 400
                        self.sim.apply(server_side(event(f"load-{n}", "research", regarding, "Pulled", "present",
                                                         self.clock.now(), count=i // 400 + 1)))
                    self.changes += 1
                if began >= next_flip:
                    name = STORY[self.flips % len(STORY)]
                    self.flips += 1
                    self.crashed[name] = not self.crashed[name]
                    if self.crashed[name]:
                        self.restarts[name] += 1
                    else:  # replaced by a new pod
                        self.sim.store.delete(self.sim.resource("v1", "Pod"), "research", self.pod_name(name))
                        self.generation[name] += 1
                        self.restarts[name] = 0
                    self._flipped_at[name] = ts(self.clock.now())
                    self.sim.apply(self.pod(name, i))
                    next_flip += FLIP_S
            except Exception as e:  # noqa: BLE001 (reported by the test)
                self.errors.append(f"writer: {e}")
            self.stop.wait(max(0.0, 0.05 - (time.monotonic() - began)))


def test_leader_failover_under_load_loses_and_repeats_no_transition(tmp_path: Path) -> None:
    clock = ManualClock()
    sim = Simulator(clock=clock, settings=SimulatorSettings(watch_window=2000, bookmark_interval_s=0.5))
    sim.start("127.0.0.1:0")
    engine = ScenarioEngine(load_scenario(default_scenario_path()), sim.base_url, clock)
    engine.step_to(17 * 60)  # every scenario event has happened; from here it plays at SPEED
    sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    load = Load(sim, engine, clock)
    load.setup()
    kc = _kubeconfig(tmp_path, sim.base_url)
    elect = _config(tmp_path / "elect.yaml", election=True)
    replicas: list[Replica] = []
    samples: list[tuple[float, tuple[str, ...]]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.1):
            live = [r for r in replicas if r.proc.poll() is None]
            samples.append((time.monotonic(), tuple(r.name for r in live if r.leads())))

    def leader() -> str:
        return samples[-1][1][0] if samples and len(samples[-1][1]) == 1 else ""

    sampler = threading.Thread(target=sample, daemon=True)
    ref = Replica(tmp_path, "reference", kc, _config(tmp_path / "ref.yaml", election=False))
    try:
        replicas += [Replica(tmp_path, "a", kc, elect), Replica(tmp_path, "b", kc, elect)]
        sampler.start()
        wait_until(lambda: leader() != "" and all(r.ready() for r in (*replicas, ref)), timeout=60,
                   what="one leader, every controller ready")
        first, standby = sorted(replicas, key=lambda r: r.name != leader())
        load.start()  # from here the writer's runs move: every controller saw them still
        time.sleep(1.5)  # the standby follows a few transitions

        first.stop(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: leader() == standby.name, timeout=LEASE_S + 10, what="the standby takes over")
        took = next(t for t, who in samples if t > killed and who == (standby.name,)) - killed
        # The Lease was not released: the standby waited for it to expire, and not much longer.
        assert LEASE_S - RENEW_S - 0.5 <= took <= LEASE_S + RENEW_S + 2.0, f"took over {took:.2f} s after the kill"
        print(f"takeover after SIGKILL: {took:.2f} s (Lease {LEASE_S:g} s, renewed every {RENEW_S:g} s)")

        back = Replica(tmp_path, f"{first.name}2", kc, elect)  # the killed one comes back (a new pod, a new store)
        replicas.append(back)
        wait_until(back.ready, timeout=60, what="the killed replica back and ready")
        time.sleep(1.0)
        standby.proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        wait_until(lambda: leader() == back.name, timeout=LEASE_S + 10, what="the replica back takes over")
        took = next(t for t, who in samples if t > stopped and who == (back.name,)) - stopped
        # Well before the Lease could have expired: it was released.
        assert took <= LEASE_S - RENEW_S - 1.0, f"took over {took:.2f} s after the leader's SIGTERM"
        print(f"takeover after SIGTERM: {took:.2f} s")
        standby.stop()
        time.sleep(1.0)

        load.close()  # quiet: the leader must settle to the reference's claims
        rate = load.changes / (time.monotonic() - load.started)
        print(f"load: {load.changes} pod and event changes ({rate:.0f}/s), {load.flips} flips, scenario at "
              f"{engine.elapsed:.0f} s")
        wait_until(lambda: _safe(back.port) and _safe(back.port) == _safe(ref.port), timeout=30,
                   what="the new leader's claims equal the uninterrupted controller's")
        final = _safe(ref.port)
        assert {run for _, run, _ in final} >= set(STORY) | {"llm-pretrain", "bert-large"}
        sampling.set()
        sampler.join(5)
        assert not [s for s in samples if len(s[1]) > 1], "two replicas said they lead at once"
        assert load.flips >= 8 and load.changes >= 1500 and not load.errors, (load.flips, load.changes, load.errors)
    finally:
        load.close()
        sampling.set()
        for r in [*replicas, ref]:
            r.stop(signal.SIGTERM)
        engine.stop()
        sim.close()

    deliver_leftovers(first.store, first.spool)  # what the killed replica's next start would have delivered
    exported = [row for r in replicas for row in claim_rows(r.store)]
    reference = claim_rows(ref.store)
    assert {r["Run"] for r in reference} >= set(STORY)
    flips = [r for r in reference if r["Run"] in STORY and r["Claim"] == "running"]
    assert len(flips) >= 8, "the writer's runs moved while the replicas ran"
    assert stream_problems(reference) == []
    assert stream_problems(exported, reference) == []
    # Every replica that led wrote some of them.
    assert all(claim_rows(r.store) for r in replicas), [(r.name, len(claim_rows(r.store))) for r in replicas]
