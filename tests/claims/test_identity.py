"""Identity: what belongs to which run (issue: claims fail closed by construction, "Identity").

A run submitted again under the same name is a new object with a new uid; the pods of the one that
was deleted (terminating, or kept Failed) still carry the old owner's uid and the run's labels. They
are not the new run's: not its pods, not its progress. A MultiKueue manager's dump holds Kueue's
configuration kinds: they are no input error.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from collector.cli import main
from tests.claims.test_restarts import NS, steps, text
from tests.dumpkit import meta, pod, ts, write_dump
from tests.test_explain_fixtures import NOW


def rayjob(uid: str, created: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {**meta("llm", NS, uid, created), "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
            "spec": {"entrypoint": "python train.py"},
            "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": f"llm-{uid}"}}


def raycluster(name: str, uid: str, owner: dict[str, Any], created: Any, workers: int = 1) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {**meta(name, NS, uid, created), "ownerReferences": [
                {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "llm", "uid": owner["metadata"]["uid"],
                 "controller": True}]},
            "spec": {"workerGroupSpecs": [{"groupName": "gpu", "replicas": workers}]},
            "status": {"state": "ready", "readyWorkerReplicas": workers, "desiredWorkerReplicas": workers}}


def ray_pod(name: str, cluster: dict[str, Any], kind: str, created: Any, node: str) -> dict[str, Any]:
    owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster["metadata"]["name"],
             "uid": cluster["metadata"]["uid"]}
    return pod(name, NS, created, node=node, gpus=8 if kind == "worker" else 0, owner=owner,
               labels={"ray.io/cluster": cluster["metadata"]["name"], "ray.io/node-type": kind,
                       "ray.io/group": "gpu" if kind == "worker" else "headgroup"})


def test_pods_of_a_deleted_owner_do_not_join_a_new_run_of_the_same_name(tmp_path: Path) -> None:
    """RayJob llm was deleted and submitted again: the old RayCluster (same name: the user named it)
    is terminating with its pods, owned by the old RayJob's uid. The new run's claims rest on its own
    cluster only: the old pods' Running state and their log's steps are not its own."""
    new_at = NOW - timedelta(minutes=3)
    old_job_uid = "uid-llm-old"
    new_job = rayjob("uid-llm-new", new_at)
    old_rc = raycluster("llm-cluster", "uid-rc-old", {"metadata": {"uid": old_job_uid}}, NOW - timedelta(hours=3))
    old_rc["metadata"]["deletionTimestamp"] = ts(NOW + timedelta(seconds=20))
    new_rc = raycluster("llm-cluster-2", "uid-rc-new", new_job, new_at)
    old_head = ray_pod("llm-cluster-head-aaaaa", old_rc, "head", NOW - timedelta(hours=3), "cpu-1")
    old_worker = ray_pod("llm-cluster-gpu-worker-bbbbb", old_rc, "worker", NOW - timedelta(hours=3), "gpu-1")
    # the new cluster is up but has printed no step yet; the old worker's log runs to a second ago
    new_head = ray_pod("llm-cluster-2-head-ccccc", new_rc, "head", new_at, "cpu-2")
    new_worker = ray_pod("llm-cluster-2-gpu-worker-ddddd", new_rc, "worker", new_at, "gpu-2")
    logs = {(NS, old_worker["metadata"]["name"]): text(steps(5000, 5100, NOW - timedelta(seconds=1005)))}
    out = CliRunner().invoke(main, ["explain", "--from-dump", str(write_dump(
        tmp_path / "d", [new_job, old_rc, new_rc, old_head, old_worker, new_head, new_worker], logs=logs,
        captured=NOW)), "-o", "json"])
    assert out.exit_code in (0, 3), out.output
    runs = {r["name"]: r for r in json.loads(out.stdout)["runs"]}
    run = runs["llm"]
    assert "2/2 bound" in json.dumps(run["claims"]["scheduled"]["evidence"])  # its own head and worker
    assert run["claims"]["progressing"]["observed"] != "true", run["claims"]["progressing"]
    assert "5,100" not in json.dumps(run)  # the old run's steps are not the new run's
    assert "llm-cluster" not in runs  # the old cluster is no run of its own either


def test_a_multikueue_managers_dump_is_read_without_errors(tmp_path: Path) -> None:
    config = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "MultiKueueConfig",
              "metadata": {"name": "multikueue-config"}, "spec": {"clusters": ["worker-1"]}}
    cluster = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "MultiKueueCluster",
               "metadata": {"name": "worker-1"},
               "spec": {"kubeConfig": {"locationType": "Secret", "location": "worker-1-secret"}},
               "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Active"}]}}
    p = pod("x", NS, NOW - timedelta(hours=1), node="gpu-1")
    r = CliRunner().invoke(main, ["explain", "--from-dump", str(write_dump(tmp_path / "d", [config, cluster, p],
                                                                           captured=NOW)), "-o", "json"])
    assert r.exit_code == 0, r.output
    assert "unknown kind" not in r.stderr


