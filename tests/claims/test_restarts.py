"""Restarts of every kind, judged on what a dump really holds (issue: claims fail closed by construction).

A rank restarts in place (the kubelet), by replacement (a Job with `restartPolicy: Never`, JobSet,
a recreated Ray worker: a new pod), or inside one process (torchrun elastic). After it, the trainer
replays steps from a checkpoint: not progress until it passes its pre-restart high-water mark, and
not "stalled" either. Where that mark cannot be seen, progress is `unknown`, never `true`.

Lines are the real Megatron iteration format (tests/fixtures/training_logs) and the real torchelastic
agent's restart lines, stamped as `kubectl logs --timestamps` writes them.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from collector.cli import main
from tests.dumpkit import event, fixture_path, meta, owner_of, pod, ts, write_dump
from tests.test_explain_fixtures import NOW

T0 = NOW - timedelta(hours=2)
NS = "research"


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


def megatron(step: int) -> str:
    return (f" iteration {step:>8}/  250000 | consumed samples: {step * 1024:>12} | elapsed time per iteration (ms): "
            f"10012.2 | learning rate: 9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 | loss scale: 1.0 |"
            " number of skipped iterations:   0 | number of nan iterations:   0 |")


def steps(first: int, last: int, start: datetime, every_s: float = 10.0) -> list[tuple[datetime, str]]:
    return [(start + timedelta(seconds=every_s * i), megatron(s)) for i, s in enumerate(range(first, last + 1))]


def text(lines: list[tuple[datetime, str]]) -> str:
    return "".join(f"{stamp(t)} {line}\n" for t, line in lines)


def explain(dump: Path) -> dict[str, Any]:
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "-o", "json"])
    assert r.exit_code in (0, 3), r.output
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def run_of(out: dict[str, Any], name: str) -> dict[str, Any]:
    run: dict[str, Any] = next(r for r in out["runs"] if r["name"] == name)
    return run


def indexed_job(name: str, created: datetime, *, failed: int = 0) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {**meta(name, NS, f"uid-{name}", created),
                         "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
            "spec": {"parallelism": 1, "completions": 1, "completionMode": "Indexed", "backoffLimit": 4,
                     "template": {"spec": {"restartPolicy": "Never"}}},
            "status": {"active": 1, "ready": 1, "failed": failed, "startTime": ts(created)}}


def job_pod(job: dict[str, Any], name: str, created: datetime, *, phase: str = "Running",
            index: str = "0") -> dict[str, Any]:
    labels = {"batch.kubernetes.io/job-name": job["metadata"]["name"], "job-name": job["metadata"]["name"],
              "batch.kubernetes.io/job-completion-index": index, "kueue.x-k8s.io/queue-name": "team-a"}
    if phase == "Failed":
        containers = [{"name": "main", "ready": False, "restartCount": 0,
                       "state": {"terminated": {"reason": "Error", "exitCode": 1,
                                                "finishedAt": ts(created + timedelta(minutes=40))}}}]
        return pod(name, NS, created, node="gpu-1", phase="Failed", ready=False, gpus=8, labels=labels,
                   owner=owner_of(job), containers=containers)
    return pod(name, NS, created, node="gpu-2", gpus=8, labels=labels, owner=owner_of(job))


# --- in-process restart: the step drops inside one log ---------------------------------------------


def test_an_in_process_restart_is_replaying_not_stalled(tmp_path: Path) -> None:
    """torchrun elastic restarts its worker group: the same container's log goes back to the
    checkpoint's step. Replaying, not progress, and not a stall either (no stall page per restart)."""
    job = indexed_job("train", T0)
    p = job_pod(job, "train-0-x7k2p", T0)
    restart_at = NOW - timedelta(minutes=3)
    before = steps(100, 217, restart_at - timedelta(seconds=10 * 118))
    elastic = [(restart_at + timedelta(seconds=i), line)
               for i, line in enumerate(fixture_path("training_logs/torchelastic_worker_group_restart_doc2edag_24.txt")
                                        .read_text().splitlines()) if line.strip()]
    after = steps(180, 196, restart_at + timedelta(seconds=20))  # resumed from the step-180 checkpoint
    captured = after[-1][0] + timedelta(seconds=5)
    dump = write_dump(tmp_path / "d", [job, p], logs={(NS, p["metadata"]["name"]): text(before + elastic + after)},
                      captured=captured)
    run = run_of(explain(dump), "train")
    prog = run["claims"]["progressing"]
    assert prog["observed"] == "false" and prog["cause"] == "replaying", prog
    assert prog["reason"].startswith("REPLAYING") and "high-water mark 217" in prog["reason"], prog["reason"]
    assert "torchelastic restarted its worker group" in prog["reason"]
    assert run["goodput"]["badput_seconds"]["replaying"] > 0
    # past the mark, it progresses again
    done = steps(197, 225, after[-1][0] + timedelta(seconds=10))
    dump = write_dump(tmp_path / "e", [job, p],
                      logs={(NS, p["metadata"]["name"]): text(before + elastic + after + done)},
                      captured=done[-1][0] + timedelta(seconds=5))
    assert run_of(explain(dump), "train")["claims"]["progressing"]["observed"] == "true"
    # The drop alone (an in-process restart that prints nothing) says the same.
    dump = write_dump(tmp_path / "f", [job, p], logs={(NS, p["metadata"]["name"]): text(before + after)},
                      captured=captured)
    prog = run_of(explain(dump), "train")["claims"]["progressing"]
    assert prog["cause"] == "replaying" and "in-process restart" in prog["reason"], prog


def test_activity_without_step_numbers_after_an_in_process_restart_proves_nothing(tmp_path: Path) -> None:
    """Hugging Face loss dicts carry no step: after torchelastic restarted the workers, nothing says
    whether they replay or progress."""
    job = indexed_job("train", T0)
    p = job_pod(job, "train-0-x7k2p", T0)
    restart_at = NOW - timedelta(minutes=3)
    loss = "{'loss': 1.8234, 'grad_norm': 0.5121, 'learning_rate': 4.9e-05, 'epoch': 0.12}"
    before = [(restart_at - timedelta(seconds=10 * (60 - i)), loss) for i in range(60)]
    elastic = [(restart_at + timedelta(seconds=i), line)
               for i, line in enumerate(fixture_path("training_logs/torchelastic_worker_group_restart_doc2edag_24.txt")
                                        .read_text().splitlines()) if line.strip()]
    after = [(restart_at + timedelta(seconds=30 + 10 * i), loss) for i in range(14)]
    dump = write_dump(tmp_path / "d", [job, p], logs={(NS, p["metadata"]["name"]): text(before + elastic + after)},
                      captured=after[-1][0] + timedelta(seconds=5))
    prog = run_of(explain(dump), "train")["claims"]["progressing"]
    assert prog["observed"] == "unknown" and "torchelastic restarted its worker group" in prog["reason"], prog
    # A step seen before the restart gives a mark, but activity without steps cannot show it passed.
    stepped = before[:-1] + [(before[-1][0], megatron(4000))]
    dump = write_dump(tmp_path / "e", [job, p], logs={(NS, p["metadata"]["name"]): text(stepped + elastic + after)},
                      captured=after[-1][0] + timedelta(seconds=5))
    prog = run_of(explain(dump), "train")["claims"]["progressing"]
    assert prog["observed"] == "unknown" and "torchelastic restarted its worker group" in prog["reason"], prog


# --- replacement: a new pod for the same rank ------------------------------------------------------


def replaced(tmp_path: Path, name: str, *, old_log: bool, new_steps: tuple[int, int]) -> dict[str, Any]:
    """The replacement came 20 minutes before capture: past the restart window, so running is true and
    the progress claim says what its steps are."""
    job = indexed_job("train", T0, failed=1)
    old = job_pod(job, "train-0-x7k2p", T0, phase="Failed")
    born = NOW - timedelta(minutes=20)
    new = job_pod(job, "train-0-9qzmd", born)
    logs = {(NS, "train-0-9qzmd"): text(steps(*new_steps, born + timedelta(minutes=1)))}
    if old_log:
        logs[(NS, "train-0-x7k2p")] = text(steps(100, 339, T0 + timedelta(seconds=60)))
    return run_of(explain(write_dump(tmp_path / name, [job, old, new], logs=logs, captured=NOW)), "train")


def test_a_replacement_pod_replaying_its_predecessors_steps_is_replaying(tmp_path: Path) -> None:
    """restartPolicy Never: the failed pod stays, a new pod takes its completion index and resumes from
    a checkpoint. Its steps below the failed pod's last one are replays, however they advance."""
    run = replaced(tmp_path, "d", old_log=True, new_steps=(220, 330))
    assert run["claims"]["running"]["observed"] == "true", run["claims"]["running"]
    prog = run["claims"]["progressing"]
    assert prog["observed"] == "false" and prog["cause"] == "replaying", prog
    assert "high-water mark 339" in prog["reason"] and "replaces pod train-0-x7k2p" in prog["reason"]
    assert "1 pod(s) replaced" in run["claims"]["running"]["reason"]
    # once past the failed pod's mark: progress
    run = replaced(tmp_path, "e", old_log=True, new_steps=(250, 364))
    assert run["claims"]["progressing"]["observed"] == "true", run["claims"]["progressing"]


def test_a_replacement_whose_predecessors_log_is_gone_is_unknown(tmp_path: Path) -> None:
    """The failed pod's log is not in the dump: nothing says where the rank was before. Its steps may
    be replays: unknown, never true."""
    run = replaced(tmp_path, "d", old_log=False, new_steps=(250, 360))
    prog = run["claims"]["progressing"]
    assert prog["observed"] == "unknown", prog
    assert "replaces pod train-0-x7k2p" in prog["reason"] and "may be replays" in prog["reason"]


def test_a_jobset_restart_leaves_progress_unknown_without_the_old_logs(tmp_path: Path) -> None:
    """JobSet recreates every child Job on a restart; the old pods are gone, the new ones carry
    jobset.sigs.k8s.io/restart-attempt. From step 300 on, nothing says the run was not at 400."""
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
          "metadata": {**meta("pretrain", NS, "uid-js", T0), "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
          "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2,
                                       "template": {"spec": {"parallelism": 1, "completions": 1}}}]},
          "status": {"restarts": 1}}
    objs: list[dict[str, Any]] = [js]
    logs = {}
    born = NOW - timedelta(minutes=20)
    for i in range(2):
        child = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            **meta(f"pretrain-workers-{i}", NS, f"uid-j{i}", born, owner=owner_of(js)),
            "labels": {"jobset.sigs.k8s.io/jobset-name": "pretrain"}},
            "spec": {"parallelism": 1, "completions": 1}, "status": {"active": 1, "ready": 1}}
        labels = {"jobset.sigs.k8s.io/jobset-name": "pretrain", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                  "jobset.sigs.k8s.io/job-index": str(i), "jobset.sigs.k8s.io/restart-attempt": "1",
                  "batch.kubernetes.io/job-name": f"pretrain-workers-{i}",
                  "batch.kubernetes.io/job-completion-index": "0"}
        p = pod(f"pretrain-workers-{i}-0-abcde", NS, born, node=f"gpu-{i}", gpus=8, labels=labels,
                owner=owner_of(child))
        objs += [child, p]
        logs[(NS, p["metadata"]["name"])] = text(steps(300, 410, born + timedelta(minutes=1)))
    out = explain(write_dump(tmp_path / "d", objs, logs=logs, captured=NOW))
    prog = run_of(out, "pretrain")["claims"]["progressing"]
    assert prog["observed"] == "unknown" and "JobSet restart attempt 1" in prog["reason"], prog


def test_a_replacement_on_a_node_whose_clock_runs_behind_replays_nothing_into_a_mark(tmp_path: Path) -> None:
    """The new pods' nodes run 90 s behind, unmeasured (a clock behind is no Lease past the others'):
    their first lines are stamped before the pods were created (the API server's clock). Those lines
    are the replacement's own replay, not a mark before its restart that later steps pass."""
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
          "metadata": {**meta("pretrain", NS, "uid-js", T0), "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
          "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1,
                                       "template": {"spec": {"parallelism": 1, "completions": 1}}}]},
          "status": {"restarts": 1}}
    born = NOW - timedelta(seconds=1125)  # its last step (at 10 s a step) 10 s before the capture
    child = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        **meta("pretrain-workers-0", NS, "uid-j0", born, owner=owner_of(js)),
        "labels": {"jobset.sigs.k8s.io/jobset-name": "pretrain"}},
        "spec": {"parallelism": 1, "completions": 1}, "status": {"active": 1, "ready": 1}}
    labels = {"jobset.sigs.k8s.io/jobset-name": "pretrain", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
              "jobset.sigs.k8s.io/job-index": "0", "jobset.sigs.k8s.io/restart-attempt": "1",
              "batch.kubernetes.io/job-name": "pretrain-workers-0", "batch.kubernetes.io/job-completion-index": "0"}
    p = pod("pretrain-workers-0-0-abcde", NS, born, node="gpu-0", gpus=8, labels=labels, owner=owner_of(child))
    # replayed 300..330 stamped before `born` by the slow clock, then on past 330 (the old mark unknown)
    lines = steps(300, 420, born - timedelta(seconds=90) + timedelta(seconds=5))
    out = explain(write_dump(tmp_path / "d", [js, child, p], logs={(NS, p["metadata"]["name"]): text(lines)},
                             captured=NOW))
    prog = run_of(out, "pretrain")["claims"]["progressing"]
    assert prog["observed"] == "unknown" and "JobSet restart attempt 1" in prog["reason"], prog


def test_a_recreated_ray_worker_is_not_a_fresh_start(tmp_path: Path) -> None:
    """KubeRay recreates a lost worker under a new name, 40 minutes after the cluster came up: its
    steps resume from a checkpoint. With its group's other worker still in view (lockstep, 4,000
    steps in), the recreated one may replay: its own mark is not in view."""
    rc = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
          "metadata": {**meta("llm-raycluster", NS, "uid-rc", T0), "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
          "spec": {"workerGroupSpecs": [{"groupName": "gpu", "replicas": 2}]},
          "status": {"state": "ready", "readyWorkerReplicas": 2, "desiredWorkerReplicas": 2}}
    owner = owner_of(rc)

    def ray_pod(name: str, kind: str, created: datetime, node: str) -> dict[str, Any]:
        labels = {"ray.io/cluster": "llm-raycluster", "ray.io/node-type": kind, "ray.io/group": "gpu"
                  if kind == "worker" else "headgroup"}
        return pod(name, NS, created, node=node, gpus=8 if kind == "worker" else 0, labels=labels, owner=owner)

    head = ray_pod("llm-raycluster-head-x2x9q", "head", T0, "cpu-1")
    w0 = ray_pod("llm-raycluster-gpu-worker-a1b2c", "worker", T0, "gpu-1")
    born = T0 + timedelta(minutes=40)
    w1 = ray_pod("llm-raycluster-gpu-worker-z9y8x", "worker", born, "gpu-2")
    # w0 reached 1,239 when its peer was lost; Ray Train restarted both workers from the step-1,150
    # checkpoint: w0 inside its pod (its step drops), w1 in the recreated pod.
    w1_steps = steps(1150, 1230, born + timedelta(minutes=1))  # 13 minutes, still below 1,239
    w0_steps = steps(1000, 1239, born - timedelta(seconds=60 + 10 * 239)) + w1_steps
    captured = w1_steps[-1][0] + timedelta(seconds=5)
    out = explain(write_dump(tmp_path / "d", [rc, head, w0, w1], captured=captured,
                             logs={(NS, w0["metadata"]["name"]): text(w0_steps),
                                   (NS, w1["metadata"]["name"]): text(w1_steps)}))
    run = run_of(out, "llm-raycluster")
    prog = run["claims"]["progressing"]
    # w0 replays below its own 1,239; w1's own mark is out of view (another worker's does not stand
    # for it): nothing says the run is past where it was.
    assert prog["observed"] == "unknown", prog
    assert "created 40m after" in prog["reason"], prog["reason"]
    assert "1 pod(s) replaced" in run["claims"]["running"]["reason"]


def test_a_worker_of_a_fixed_size_ray_cluster_born_late_is_a_replacement(tmp_path: Path) -> None:
    """KubeRay creates a cluster's workers with its head; one born 3 minutes later, in a cluster that
    does not autoscale, replaced a lost worker (its Events aged out, the lost pod is gone). Its loss
    dicts carry no step: activity that proves nothing after a restart. With the autoscaler on, a
    late worker may just be a new one: no restart is inferred."""
    def run(autoscaling: bool) -> dict[str, Any]:
        rc = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
              "metadata": {**meta("sft", NS, "uid-rc", T0), "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
              "spec": {"enableInTreeAutoscaling": autoscaling,
                       "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 1}]},
              "status": {"state": "ready", "readyWorkerReplicas": 1, "desiredWorkerReplicas": 1}}

        def ray_pod(name: str, kind: str, created: datetime) -> dict[str, Any]:
            labels = {"ray.io/cluster": "sft", "ray.io/node-type": kind,
                      "ray.io/group": "gpu" if kind == "worker" else "headgroup"}
            return pod(name, NS, created, node=f"n-{kind}", gpus=8 if kind == "worker" else 0, labels=labels,
                       owner=owner_of(rc))
        head = ray_pod("sft-head-x2x9q", "head", T0)
        born = T0 + timedelta(minutes=3)
        worker = ray_pod("sft-gpu-worker-z9y8x", "worker", born)
        loss = "{'loss': 1.8234, 'grad_norm': 0.5121, 'learning_rate': 4.9e-05, 'epoch': 0.12}"
        lines = [(born + timedelta(seconds=30 + 5 * i), loss) for i in range(300)]  # 25 minutes on
        out = explain(write_dump(tmp_path / f"d{autoscaling}", [rc, head, worker], captured=lines[-1][0]
                                 + timedelta(seconds=2), logs={(NS, worker["metadata"]["name"]): text(lines)}))
        return run_of(out, "sft")

    fixed = run(False)
    assert fixed["claims"]["progressing"]["observed"] == "unknown", fixed["claims"]["progressing"]
    assert "does not autoscale" in fixed["claims"]["progressing"]["reason"]
    assert "1 pod(s) replaced" in fixed["claims"]["running"]["reason"]
    scaling = run(True)
    assert "replaced" not in scaling["claims"]["running"]["reason"], scaling["claims"]["running"]


# --- in place: the kubelet restarted the container ----------------------------------------------------


def restarted_in_place(tmp_path: Path, name: str, *, previous: bool) -> dict[str, Any]:
    job = indexed_job("train", T0)
    died = NOW - timedelta(minutes=15)  # past the restart window: running is true again
    p = job_pod(job, "train-0-x7k2p", T0)
    p["status"]["containerStatuses"] = [{
        "name": "main", "ready": True, "restartCount": 1,
        "state": {"running": {"startedAt": ts(died + timedelta(seconds=30))}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "finishedAt": ts(died)}}}]
    now_steps = steps(200, 280, died + timedelta(minutes=1))
    extra = {}
    if previous:  # `kubectl logs --previous --timestamps`, as the README asks for
        extra[f"{NS}/train-0-x7k2p/main-previous.txt"] = text(steps(100, 300, died - timedelta(seconds=2010)))
    dump = write_dump(tmp_path / name, [job, p], logs={(NS, "train-0-x7k2p"): text(now_steps)}, extra_files=extra,
                      captured=NOW)
    return run_of(explain(dump), "train")


def test_an_in_place_restart_without_its_previous_log_is_unknown(tmp_path: Path) -> None:
    run = restarted_in_place(tmp_path, "d", previous=False)
    prog = run["claims"]["progressing"]
    assert prog["observed"] == "unknown" and "container main of pod train-0-x7k2p restarted" in prog["reason"], prog
    assert "kubectl logs --previous" in prog["reason"]
    with_previous = restarted_in_place(tmp_path, "e", previous=True)["claims"]["progressing"]
    assert with_previous["observed"] == "false" and with_previous["cause"] == "replaying", with_previous
    assert "high-water mark 300" in with_previous["reason"]


def test_another_logs_earlier_start_does_not_prove_a_restarted_rank_recovered(tmp_path: Path) -> None:
    """Rank 1 restarted in place 4 minutes ago and its previous log is gone; rank 0's log reaches back
    an hour and advanced since. That says nothing about rank 1: its restart is still recent."""
    job = indexed_job("train", T0)
    job["spec"].update(parallelism=2, completions=2)
    r0 = job_pod(job, "train-0-aaaaa", T0, index="0")
    r1 = job_pod(job, "train-1-bbbbb", T0, index="1")
    died = NOW - timedelta(minutes=4)
    r1["status"]["containerStatuses"] = [{
        "name": "main", "ready": True, "restartCount": 1,
        "state": {"running": {"startedAt": ts(died + timedelta(seconds=30))}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "finishedAt": ts(died)}}}]
    r0_steps = steps(100, 460, NOW - timedelta(hours=1))
    r1_steps = steps(440, 462, died + timedelta(minutes=1))
    captured = max(r0_steps[-1][0], r1_steps[-1][0]) + timedelta(seconds=5)
    out = explain(write_dump(tmp_path / "d", [job, r0, r1], captured=captured,
                             logs={(NS, "train-0-aaaaa"): text(r0_steps), (NS, "train-1-bbbbb"): text(r1_steps)}))
    running = run_of(out, "train")["claims"]["running"]
    assert running["observed"] == "false" and "train-1-bbbbb container main restarted" in running["reason"], running


def test_the_live_index_keeps_a_deleted_pods_mark_for_its_replacement() -> None:
    """JobSet deletes a rank's pod and creates it anew: the controller's index keeps the deleted pod's
    last read, so the replacement's steps are judged against its mark (replaying), not unknown."""
    from collector.claims import evaluate
    from collector.correlate import RunIndex, Signal
    from collector.kube import normalize
    from collector.progress import scan_text
    from collector.settings import ClaimSettings

    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
          "metadata": {**meta("pretrain", NS, "uid-js", T0), "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
          "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1}]}, "status": {}}

    def rank_pod(name: str, created: datetime, attempt: str) -> dict[str, Any]:
        labels = {"jobset.sigs.k8s.io/jobset-name": "pretrain", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                  "jobset.sigs.k8s.io/job-index": "0", "jobset.sigs.k8s.io/restart-attempt": attempt,
                  "batch.kubernetes.io/job-completion-index": "0", "jobset.sigs.k8s.io/jobset-uid": "uid-js"}
        return pod(name, NS, created, node="gpu-1", gpus=8, labels=labels, owner=owner_of(js))

    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    old = rank_pod("pretrain-workers-0-0-aaaaa", T0, "0")
    born = NOW - timedelta(minutes=20)
    new = rank_pod("pretrain-workers-0-0-bbbbb", born, "1")

    def index(with_old: bool) -> RunIndex:
        idx = RunIndex()
        for o in (js, node, old):
            rec = normalize(o).record
            assert rec is not None
            idx.upsert(rec)
        idx.synced.update(dict.fromkeys(("Pod", "Node", "JobSet", "Event"), NOW))
        old_ref = normalize(old).record.ref  # type: ignore[union-attr]
        if with_old:
            idx.set_signal(Signal(old_ref, "main", scan_text(text(steps(100, 400, T0 + timedelta(minutes=1))),
                                                             source="o"), born - timedelta(minutes=1)))
        idx.delete(old_ref)  # JobSet's restart deletes it
        rec = normalize(new).record
        assert rec is not None
        idx.upsert(rec)
        replay = steps(300, 395, NOW - timedelta(seconds=10 * 95 + 5))  # still below 400 at NOW
        idx.set_signal(Signal(rec.ref, "main", scan_text(text(replay), source="n"), NOW))
        return idx

    root = next(r for r in index(True).roots() if r.name == "pretrain")
    with_mark = evaluate(index(True).evidence(root), NOW, ClaimSettings()).progressing
    assert with_mark.cause == "replaying" and "high-water mark 400" in with_mark.reason, with_mark.reason
    without = evaluate(index(False).evidence(root), NOW, ClaimSettings()).progressing
    assert without.observed.value == "unknown", without.reason


def test_a_node_clock_not_measured_yet_leaves_progress_unknown() -> None:
    """The live controller has just started: gpu-1's heartbeat (minutes old, perhaps) said nothing sure
    about its clock yet, and no node Lease measured it. Its clock may run ahead by any amount, so pod
    b's fresh-looking steps may be minutes old. Unknown until a Lease renewal or the kubelet's next
    heartbeat measures it. Measured, only the line from the future is distrusted (a clock ahead, or a
    trainer's own forged time), and pod b's steps count."""
    from collector.claims import evaluate
    from collector.correlate import Signal, build_index
    from collector.kube import normalize
    from collector.progress import scan_text
    from collector.settings import ClaimSettings

    job = indexed_job("train", T0)
    job["spec"].update(parallelism=2, completions=2)
    pods = [job_pod(job, f"train-{i}-x7k2p", T0, index=str(i)) for i in range(2)]
    for p in pods:
        p["spec"]["nodeName"] = "gpu-1"
    n = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"},
         "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    idx = build_index(r for o in (job, *pods, n) if (r := normalize(o).record) is not None)
    idx.synced.update(dict.fromkeys(("Pod", "Node", "Job"), NOW))
    refs = sorted((r.ref for r in idx.objects() if r.ref.kind == "Pod"), key=lambda r: r.name)
    ahead = text(steps(100, 160, NOW - timedelta(seconds=10 * 60) + timedelta(minutes=1)))  # last: NOW + 1 min
    normal = text(steps(100, 160, NOW - timedelta(seconds=10 * 60 + 5)))
    idx.set_signal(Signal(refs[0], "main", scan_text(ahead, source="a"), NOW))
    idx.set_signal(Signal(refs[1], "main", scan_text(normal, source="b"), NOW))
    root = next(r for r in idx.roots() if r.name == "train")
    measured = evaluate(idx.evidence(root), NOW, ClaimSettings()).progressing
    assert measured.observed.value == "true" and "train-1-x7k2p" in measured.evidence[1].ref, measured
    idx.node_clock_unsure.add("gpu-1")
    unsure = evaluate(idx.evidence(root), NOW, ClaimSettings()).progressing
    assert unsure.observed.value == "unknown" and "gpu-1's clock is not measured yet" in unsure.reason, unsure.reason


def test_a_pytorchjob_that_recreated_its_workers_under_their_names_is_known_to_have_restarted(
        tmp_path: Path) -> None:
    """training-operator deletes failed replicas and creates them again under the same names; its
    Restarting condition is gone once the job runs again. Its Warning Event (the message the operator
    writes, kubeflow/training-operator's JobRestartingReason) is what is left: the workers' steps
    since may be replays of steps made before it."""
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {**meta("train", NS, "uid-ptj", T0), "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
           "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "restartPolicy": "ExitCode"}}},
           "status": {"conditions": [
               {"type": "Created", "status": "True", "lastTransitionTime": ts(T0)},
               {"type": "Running", "status": "True", "lastTransitionTime": ts(NOW - timedelta(minutes=19))}]}}
    restarted = NOW - timedelta(minutes=20)
    labels = {"training.kubeflow.org/job-name": "train", "training.kubeflow.org/operator-name": "pytorchjob-controller",
              "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"}
    w0 = pod("train-worker-0", NS, restarted + timedelta(seconds=2), node="gpu-1", gpus=8, labels=labels,
             owner=owner_of(job))
    warning = event("train.restart", NS, job, "PyTorchJobRestarting",
                    "PyTorchJob train is restarting because 1 Worker replica(s) failed.", restarted, type_="Warning",
                    component="pytorchjob-controller")
    logs = {(NS, "train-worker-0"): text(steps(900, 1010, NOW - timedelta(seconds=10 * 110 + 5)))}
    out = explain(write_dump(tmp_path / "d", [job, w0, warning], logs=logs, captured=NOW))
    prog = run_of(out, "train")["claims"]["progressing"]
    assert prog["observed"] == "unknown" and "PyTorchJobRestarting" in prog["reason"], prog
    # The Event aged out: the job's startTime (set when it started, again when it resumes) is left, and
    # its worker was created 20 minutes after it.
    job["status"]["startTime"] = ts(T0 + timedelta(minutes=1))
    out = explain(write_dump(tmp_path / "e", [job, w0], logs=logs, captured=NOW))
    prog = run_of(out, "train")["claims"]["progressing"]
    assert prog["observed"] == "unknown" and "after PyTorchJob train started" in prog["reason"], prog


def test_a_pod_its_controller_created_after_one_that_is_gone_replaces_it(tmp_path: Path) -> None:
    """KubeRay recreated a lost worker, or a Job brought back a pod of its index, four minutes into the
    run (under the 5-minute mark that a late pod alone would show): the lost pod's record and log are
    gone, its controller's "created" Event is not. The new pod resumes from a checkpoint; how far the
    lost one had got is unknown, so its steps prove nothing. A sibling created by the same Event batch
    (still present) or a pod of another index is no such evidence."""
    job = indexed_job("train", T0)
    born = T0 + timedelta(minutes=4)
    p = job_pod(job, "train-0-9qzmd", born)
    created = [event("train.c1", NS, job, "SuccessfulCreate", "Created pod: train-0-x7k2p", T0,
                     component="job-controller"),
               event("train.c2", NS, job, "SuccessfulCreate", "Created pod: train-0-9qzmd", born,
                     component="job-controller")]
    logs = {(NS, "train-0-9qzmd"): text(steps(300, 400, NOW - timedelta(seconds=1000)))}
    run = run_of(explain(write_dump(tmp_path / "d", [job, p, *created], logs=logs, captured=NOW)), "train")
    prog = run["claims"]["progressing"]
    assert prog["observed"] == "unknown" and "train-0-x7k2p is gone" in prog["reason"], prog
    # only the Event for itself, or for another index's pod: nothing says it replaced one
    other = event("train.c1", NS, job, "SuccessfulCreate", "Created pod: train-1-x7k2p", T0, component="job-controller")
    run = run_of(explain(write_dump(tmp_path / "e", [job, p, other, created[1]], logs=logs, captured=NOW)), "train")
    assert run["claims"]["progressing"]["observed"] == "true", run["claims"]["progressing"]
    # the run deleted and submitted again under its name: the Event is the earlier Job's (older than this one)
    again = indexed_job("train", T0 + timedelta(minutes=3))
    p2 = job_pod(again, "train-0-9qzmd", born)
    run = run_of(explain(write_dump(tmp_path / "f", [again, p2, *created], logs=logs, captured=NOW)), "train")
    assert run["claims"]["progressing"]["observed"] == "true", run["claims"]["progressing"]


def test_a_restart_on_a_node_whose_clock_runs_ahead_is_placed_on_the_same_clock_as_its_steps() -> None:
    """The kubelet stamps a container's finishedAt on its node's clock, as it stamps the log lines. On
    a node 60 s ahead the lines are read 60 s earlier: the restart must move with them, or the first
    steps after it fall before it and pass for the pre-restart mark (a replay read as progress)."""
    from collector.claims import evaluate
    from collector.correlate import Signal, build_index
    from collector.kube import normalize
    from collector.progress import scan_text
    from collector.settings import ClaimSettings

    job = indexed_job("train", T0)
    restarted = NOW - timedelta(minutes=20)  # on the API server's clock; gpu-2 stamps everything 60 s later
    ahead = timedelta(seconds=60)
    container = [{"name": "main", "ready": True, "restartCount": 1,
                  "state": {"running": {"startedAt": ts(restarted + ahead + timedelta(seconds=10))}},
                  "lastState": {"terminated": {"reason": "Error", "exitCode": 1,
                                               "finishedAt": ts(restarted + ahead)}}}]
    p = pod("train-0-x7k2p", NS, T0, node="gpu-2", gpus=8, owner=owner_of(job), containers=container,
            labels={"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/job-completion-index": "0"})
    n = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-2"},
         "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    idx = build_index(r for o in (job, p, n) if (r := normalize(o).record) is not None)
    idx.synced.update(dict.fromkeys(("Pod", "Node", "Job"), NOW))
    # the replay after the restart, steps 300.. from 20 s after it, to 40 s ago (stamped 20 s ahead)
    after = text(steps(300, 414, restarted + ahead + timedelta(seconds=20), every_s=10.0))
    ref = next(r.ref for r in idx.objects() if r.ref.kind == "Pod")
    idx.set_signal(Signal(ref, "main", scan_text(after, source="main"), NOW))
    idx.node_skew["gpu-2"] = ahead
    root = next(r for r in idx.roots() if r.name == "train")
    prog = evaluate(idx.evidence(root), NOW, ClaimSettings()).progressing
    assert prog.observed.value == "unknown" and "restarted" in prog.reason, prog.reason


def test_a_restart_after_the_last_step_leaves_progress_unknown_inside_the_window(tmp_path: Path) -> None:
    """torchelastic restarted the worker group 10 s after the last step; the capture is 20 s later.
    That step was the process before the restart: it shows nothing about the one after it. Unknown,
    not true; once the window has passed with no step, stalled as any run."""
    job = indexed_job("train", T0)
    p = job_pod(job, "train-0-x7k2p", T0)
    last = NOW - timedelta(seconds=30)
    before = steps(100, 160, last - timedelta(seconds=600))
    elastic = [(last + timedelta(seconds=10), line)
               for line in fixture_path("training_logs/torchelastic_worker_group_restart_doc2edag_24.txt")
               .read_text().splitlines() if line.strip()]
    logs = {(NS, p["metadata"]["name"]): text(before + elastic)}
    dump = write_dump(tmp_path / "d", [job, p], logs=logs, captured=NOW)
    prog = run_of(explain(dump), "train")["claims"]["progressing"]
    assert prog["observed"] == "unknown" and "no step since" in prog["reason"], prog
    # without the restart lines, the same step is progress
    dump = write_dump(tmp_path / "e", [job, p], logs={(NS, p["metadata"]["name"]): text(before)}, captured=NOW)
    assert run_of(explain(dump), "train")["claims"]["progressing"]["observed"] == "true"
    # ten minutes on, nothing since: stalled
    late = write_dump(tmp_path / "f", [job, p], logs=logs, captured=NOW + timedelta(minutes=10))
    prog = run_of(explain(late), "train")["claims"]["progressing"]
    assert prog["observed"] == "false" and prog["cause"] == "stalled", prog
