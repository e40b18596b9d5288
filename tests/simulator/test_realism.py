"""The simulator plays clusters as real ones behave: node Leases and status reports, a lost node noticed
only after the monitor grace period, graceful pod deletion, each controller's own way of replacing
pods, in-process restarts, resubmitted runs, sidecars that print, and skewed node clocks."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from kubesim import ManualClock, ScenarioEngine, Simulator, SimulatorSettings, write_kubeconfig
from kubesim.clock import parse_time
from kubesim.scenario import scenario_from_dict
from kubesim.truth import Tolerance
from tests.simulator.conftest import KUBECTL, T0

EVERY = 10


def _run(name: str, kind: str, nodes: list[str], extra: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    timeline = [
        {"at": "2s", "admit": {}},
        {"at": "4s", "schedule": {"pods": "workers", "nodes": nodes}},
        {"at": "4s", "schedule": {}},
        {"at": "5s", "pull": {}},
        {"at": "30s", "start": {}},
        {"at": "35s", "train": {"every": f"{EVERY}s", "pods": "workers", "startIteration": 100}},
        *extra,
    ]
    return {"name": name, "namespace": "ml", "kind": kind, "profile": "p", "at": "0s", "timeline": timeline,
            **fields}


def _scenario(runs: list[dict[str, Any]], skew: dict[str, str] | None = None) -> Any:
    nodes = [{"name": "sys", "cpu": "16"}]
    for r in runs:
        for n in r["timeline"][1]["schedule"]["nodes"]:
            skewed = {"clockSkew": skew[n]} if skew and n in skew else {}
            nodes.append({"name": n, "pool": "gpu", "gpus": 8, **skewed})
    doc = {"name": "realism", "seed": 4, "start": T0.isoformat(),
           "cluster": {"namespaces": ["ml"], "nodes": nodes, "flavors": ["a100"],
                       "clusterQueues": [{"name": "cq", "flavor": "a100", "gpus": 400}],
                       "localQueues": [{"name": "lq", "namespace": "ml", "clusterQueue": "cq"}],
                       "profiles": [{"name": "p", "localQueue": "lq", "clusterQueue": "cq", "workers": 2,
                                     "gpusPerWorker": 8}],
                       "kubeletHeartbeats": True},
           "runs": runs}
    return scenario_from_dict(doc)


class Played:
    def __init__(self, runs: list[dict[str, Any]], skew: dict[str, str] | None = None) -> None:
        self.clock = ManualClock(T0)
        self.sim = Simulator(clock=self.clock, settings=SimulatorSettings(seed=4))
        self.sim.start("127.0.0.1:0")
        self.engine = ScenarioEngine(_scenario(runs, skew), self.sim.base_url, self.clock)

    def to(self, t: float) -> None:
        self.engine.step_to(t)
        assert self.engine.errors == []

    def pods(self, prefix: str) -> list[dict[str, Any]]:
        items = self.sim.store.list_page(self.sim.resource("v1", "Pod"), "ml").items
        return [p for p in items if p["metadata"]["name"].startswith(prefix + "-")]

    def obj(self, api_version: str, kind: str, ns: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.sim.store.get(self.sim.resource(api_version, kind), ns, name)
        return out

    def log(self, pod: str, container: str, **kw: Any) -> str:
        data, _ = self.sim.store.pod_logs.read("ml", pod, container, **kw)
        return data.decode()

    def close(self) -> None:
        self.engine.stop()
        self.sim.close()


@pytest.fixture
def play() -> Iterator[Any]:
    made: list[Played] = []

    def make(runs: list[dict[str, Any]], skew: dict[str, str] | None = None) -> Played:
        p = Played(runs, skew)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def _steps(text: str) -> list[int]:
    return [int(line.split("iteration")[1].split("/")[0]) for line in text.splitlines() if "consumed samples" in line]


def test_kubelets_renew_their_leases_every_10s_and_report_status_every_5_minutes(play: Any) -> None:
    p = play([_run("a", "Job", ["n0", "n1"], [{"at": "300s", "nodeLoss": {"node": "n1"}}])])
    p.to(290)
    lease = p.obj("coordination.k8s.io/v1", "Lease", "kube-node-lease", "n0")
    assert lease["spec"]["leaseDurationSeconds"] == 40 and lease["spec"]["holderIdentity"] == "n0"
    renewed = parse_time(lease["spec"]["renewTime"])
    assert timedelta(0) <= T0 + timedelta(seconds=290) - renewed < timedelta(seconds=10)
    beat = next(c for c in p.obj("v1", "Node", "", "n0")["status"]["conditions"] if c["type"] == "Ready")
    assert timedelta(0) <= T0 + timedelta(seconds=290) - parse_time(beat["lastHeartbeatTime"]) < timedelta(minutes=5)
    # n1 goes silent at 300 s: its Lease stops, and the node controller notices only after 50 s.
    p.to(340)
    lost = p.obj("coordination.k8s.io/v1", "Lease", "kube-node-lease", "n1")
    assert parse_time(lost["spec"]["renewTime"]) <= T0 + timedelta(seconds=300)
    ready = next(c for c in p.obj("v1", "Node", "", "n1")["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"  # 40 s after: the API still says Ready
    truth = p.engine.truth()[("ml", "a")]
    assert not truth.running and truth.running_blockers == ("node-down",) and truth.down_for == pytest.approx(40)
    assert not truth.true_is_error("running", Tolerance())  # a collector cannot know yet
    p.to(400)
    ready = next(c for c in p.obj("v1", "Node", "", "n1")["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "Unknown" and ready["reason"] == "NodeStatusUnknown"
    assert p.engine.truth()[("ml", "a")].true_is_error("running", Tolerance())


def test_a_job_with_restart_policy_never_replaces_its_pods_and_keeps_the_failed_ones(play: Any) -> None:
    p = play([_run("j", "Job", ["n0", "n1"], [{"at": "300s", "restart": {"mode": "replace", "rewind": 5,
                                                                           "startAfter": "20s"}}])])
    p.to(299)
    before = {x["metadata"]["name"] for x in p.pods("j")}
    p.to(400)
    pods = p.pods("j")
    failed = [x for x in pods if x["status"]["phase"] == "Failed"]
    fresh = [x for x in pods if x["status"]["phase"] == "Running"]
    assert {x["metadata"]["name"] for x in failed} == before
    assert len(fresh) == 2 and not {x["metadata"]["name"] for x in fresh} & before
    index = "batch.kubernetes.io/job-completion-index"
    assert sorted(x["metadata"]["labels"][index] for x in fresh) == ["0", "1"]
    assert p.obj("batch/v1", "Job", "ml", "j")["status"]["failed"] == 2
    truth = p.engine.truth()[("ml", "j")]
    assert truth.restarts and truth.restarts[-1].mode == "replace-Job"
    assert {h[0] for h in truth.restarts[-1].holders} == before  # the failed pods' logs hold the mark


def test_a_jobset_recreates_its_child_job_with_the_next_restart_attempt(play: Any) -> None:
    p = play([_run("s", "JobSet", ["n0", "n1"], [{"at": "300s", "restart": {"mode": "replace", "rewind": 5}}],
                   terminationGracePeriodSeconds=600, exitAfter="30s")])
    p.to(310)
    terminating = p.pods("s")
    assert len(terminating) == 2 and all(x["metadata"].get("deletionTimestamp") for x in terminating)
    for x in terminating:  # a deadline in the future: now + grace
        assert parse_time(x["metadata"]["deletionTimestamp"]) == T0 + timedelta(seconds=300 + 600)
    p.to(400)
    pods = p.pods("s")
    assert len(pods) == 2 and not any(x["metadata"].get("deletionTimestamp") for x in pods)
    assert {x["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for x in pods} == {"1"}
    assert p.obj("jobset.x-k8s.io/v1alpha2", "JobSet", "ml", "s")["status"]["restarts"] == 1
    assert p.obj("batch/v1", "Job", "ml", "s-workers-0")["metadata"]["labels"][
        "jobset.sigs.k8s.io/restart-attempt"] == "1"


def test_a_pytorchjob_recreates_failed_pods_under_the_same_names(play: Any) -> None:
    p = play([_run("t", "PyTorchJob", ["n0", "n1"], [{"at": "300s", "restart": {"mode": "replace", "rewind": 5}}])])
    p.to(299)
    uids = {x["metadata"]["name"]: x["metadata"]["uid"] for x in p.pods("t")}
    assert set(uids) == {"t-master-0", "t-worker-0"}
    p.to(400)
    after = {x["metadata"]["name"]: x["metadata"]["uid"] for x in p.pods("t")}
    assert set(after) == set(uids) and not set(after.values()) & set(uids.values())
    assert p.pods("t")[0]["metadata"]["labels"]["training.kubeflow.org/operator-name"] == "pytorchjob-controller"


def test_ray_worker_recreation_starts_a_new_worker_while_the_old_one_terminates(play: Any) -> None:
    p = play([_run("r", "RayJob", ["n0", "n1"], [{"at": "300s", "restart": {"mode": "replace", "rewind": 5}}],
                   terminationGracePeriodSeconds=120, exitAfter="60s")])
    p.to(299)
    workers = {x["metadata"]["name"] for x in p.pods("r") if "worker" in x["metadata"]["name"]}
    p.to(330)
    now = {x["metadata"]["name"]: x for x in p.pods("r") if "worker" in x["metadata"]["name"]}
    assert len(now) == 4
    assert all(now[n]["metadata"]["deletionTimestamp"] for n in workers)
    assert all(not x["metadata"].get("deletionTimestamp") and x["status"]["phase"] == "Pending"
               for n, x in now.items() if n not in workers)  # waiting for the GPUs the old ones hold
    p.to(450)
    running = [x for x in p.pods("r") if "worker" in x["metadata"]["name"]]
    assert len(running) == 2 and all(x["status"]["phase"] == "Running" for x in running)


def test_an_in_process_restart_drops_the_step_inside_the_same_log(play: Any) -> None:
    p = play([_run("i", "Job", ["n0"], [{"at": "300s", "restart": {"mode": "inprocess", "rewind": 8,
                                                                      "resumeAfter": "20s"}}])])
    p.to(500)
    pod = p.pods("i")[0]
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    text = p.log(pod["metadata"]["name"], "main")
    assert "Worker group FAILED. 3/3 attempts left; will restart worker group" in text
    steps = _steps(text)
    drop = next(k for k in range(1, len(steps)) if steps[k] < steps[k - 1])
    assert steps[drop - 1] - steps[drop] == 7  # back to the checkpoint 8 steps below the mark, then the next
    assert "loading checkpoint from /mnt/checkpoints/i at iteration" in text
    truth = p.engine.truth()[("ml", "i")]
    assert truth.last_step == max(steps)


def test_a_resubmitted_run_is_a_new_run_while_the_old_pods_terminate(play: Any) -> None:
    extra = [{"at": "300s", "resubmit": {}}, {"at": "303s", "admit": {}},
             {"at": "305s", "schedule": {"pods": "workers", "nodes": ["n0"]}}, {"at": "306s", "pull": {}},
             {"at": "330s", "start": {}}, {"at": "335s", "train": {"every": "10s", "pods": "workers"}}]
    p = play([_run("u", "Job", ["n0"], extra, terminationGracePeriodSeconds=3600, exitAfter="3600s")])
    p.to(299)
    old_uid = p.obj("batch/v1", "Job", "ml", "u")["metadata"]["uid"]
    p.to(400)
    assert p.obj("batch/v1", "Job", "ml", "u")["metadata"]["uid"] != old_uid
    old = [x for x in p.pods("u") if x["metadata"].get("deletionTimestamp")]
    assert len(old) == 2  # the old run's pods, Terminating until their grace period ends
    assert all(parse_time(x["metadata"]["deletionTimestamp"]) == T0 + timedelta(seconds=3900) for x in old)
    truth = p.engine.truth()[("ml", "u")]
    assert truth.generation == 1 and truth.progressing and truth.last_step < 10  # its own steps, from 0


def test_a_sidecar_prints_its_own_step_counter_while_training_stalls(play: Any) -> None:
    p = play([_run("c", "Job", ["n0"], [{"at": "200s", "stall": {}}], sidecar="exporter")])
    p.to(800)
    pod = p.pods("c")[0]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["main", "metrics-exporter"]
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][1]["resources"]["requests"]
    tail = p.log(pod["metadata"]["name"], "metrics-exporter", tail_lines=1)
    assert "step=" in tail and int(tail.split("step=")[1].split()[0]) > 20
    assert not p.engine.truth()[("ml", "c")].progressing


def test_a_skewed_node_stamps_logs_and_its_lease_on_its_own_clock(play: Any) -> None:
    p = play([_run("k", "Job", ["n0"], [])], skew={"n0": "-90s"})
    p.to(300)
    pod = p.pods("k")[0]["metadata"]["name"]
    last = p.log(pod, "main", timestamps=True, tail_lines=1)
    stamp = parse_time(last.split()[0])
    assert T0 + timedelta(seconds=300 - 90 - EVERY) <= stamp <= T0 + timedelta(seconds=300 - 90)
    lease = p.obj("coordination.k8s.io/v1", "Lease", "kube-node-lease", "n0")
    assert parse_time(lease["spec"]["renewTime"]) < T0 + timedelta(seconds=300 - 80)


def test_truth_forgives_only_the_detection_latency(play: Any) -> None:
    p = play([_run("z", "Job", ["n0"], [{"at": "400s", "stall": {}}])])
    tol = Tolerance()
    edge = tol.progress_edge(EVERY)  # max(60, 100) + 15 + 2
    assert edge == 117
    p.to(400 + 60)
    t = p.engine.truth()[("ml", "z")]
    assert not t.progressing and t.in_tolerance("progressing", tol)
    p.to(400 + edge + 15)
    t = p.engine.truth()[("ml", "z")]
    assert t.since_advance is not None and t.since_advance > edge and t.true_is_error("progressing", tol)


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
def test_kubectl_logs_writes_the_api_answer_unchanged(play: Any, tmp_path: Path) -> None:
    """The accuracy harness reads per-container logs with the GET kubectl makes; kubectl writes it out as is."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from accuracy_dumps import Kubectl

    p = play([_run("l", "Job", ["n0"], [{"at": "200s", "restart": {"mode": "inplace", "rewind": 3}}])])
    p.to(300)
    pod = p.pods("l")[0]["metadata"]["name"]
    kc = Kubectl(p.sim.base_url, tmp_path)
    for previous in (False, True):
        args = ["logs", "--timestamps", "-n", "ml", pod, "-c", "main", *(["--previous"] if previous else [])]
        out = subprocess.run([str(KUBECTL), "--kubeconfig", str(write_kubeconfig(tmp_path / "kc", p.sim.base_url)),
                              *args], capture_output=True, check=True).stdout
        assert out and out == kc.logs("ml", pod, "main", previous, False)
    kc.close()
