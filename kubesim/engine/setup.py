"""What users and TauGrid create: the cluster's namespaces, nodes, priority classes, Kueue queues,
TauWorkspaces and TauCluster at time zero, and for each run its TauRun, suspended RayJob or Job,
and Kueue Workload at its submission time.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from kubesim.clock import rfc3339
from kubesim.engine.kueue import Kueue
from kubesim.engine.nodes import Nodes
from kubesim.engine.state import (
    JOBSET_GV,
    KUEUE_GV,
    PYTORCH_GV,
    QUEUE_LABEL,
    RAY_GV,
    RUN_LABEL,
    TAU_GV,
    Obj,
    Ref,
    RunState,
)
from kubesim.errors import ApiError
from kubesim.scenario import RunSpec


class Submission(Nodes, Kueue):
    """The cluster at time zero and each run's submission."""

    def _setup(self) -> None:
        sc = self.scenario
        self._at(0.0, self._setup_cluster)
        for run in sc.runs:
            state = RunState(run)
            self.runs[(run.namespace, run.name)] = state
            self._queues.track(state)
            self._at(run.at, functools.partial(self._submit, state))
            for step in run.timeline:
                self._at(run.at + step.at, functools.partial(self._run_action, state, step))
        for step in sc.actions:
            self._at(step.at, functools.partial(self._cluster_action, step))

    def _setup_cluster(self) -> None:
        sc = self.scenario
        for ns in sc.namespaces:
            try:
                self._create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            except ApiError as exc:
                if exc.code != 409:
                    raise
        for node in sc.nodes:
            self._add_node(node)
        pcs = sorted({p.priority_class for p in sc.profiles if p.priority_class})
        for i, pc in enumerate(pcs):
            self._create(
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": pc},
                    "value": 1000 * (i + 1),
                    "globalDefault": False,
                    "preemptionPolicy": "PreemptLowerPriority",
                    "description": f"TauGrid training priority {pc}",
                }
            )
        pools = {n.gpu_product: n.pool for n in sc.nodes if n.gpus}
        for flavor in sc.flavors:
            labels = {"agentpool": next((p for g, p in pools.items() if flavor in g.lower()), flavor)}
            self._create(
                {
                    "apiVersion": KUEUE_GV,
                    "kind": "ResourceFlavor",
                    "metadata": {"name": flavor},
                    "spec": {"nodeLabels": labels},
                }
            )
        for cq in sc.cluster_queues:
            spec: Obj = {
                "namespaceSelector": {},
                "queueingStrategy": "BestEffortFIFO",
                "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": cq.flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": 1000},
                                    {"name": "memory", "nominalQuota": "8Ti"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": cq.gpus},
                                ],
                            }
                        ],
                    }
                ],
            }
            if cq.cohort:
                spec["cohort"] = cq.cohort
            self._create({"apiVersion": KUEUE_GV, "kind": "ClusterQueue", "metadata": {"name": cq.name}, "spec": spec})
        for lq in sc.local_queues:
            self._create(
                {
                    "apiVersion": KUEUE_GV,
                    "kind": "LocalQueue",
                    "metadata": {"name": lq.name, "namespace": lq.namespace},
                    "spec": {"clusterQueue": lq.cluster_queue},
                }
            )
        self._sync_queues()
        for ns in sc.namespaces:
            sa = f"{ns}-runner"
            self._create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}})
            ws = self._create(
                {
                    "apiVersion": TAU_GV,
                    "kind": "TauWorkspace",
                    "metadata": {"name": ns, "namespace": ns},
                    "spec": {"serviceAccounts": [sa]},
                }
            )
            self._status(
                ws,
                {
                    "observedGeneration": 1,
                    "serviceAccounts": [sa],
                    "conditions": [self._cond("Ready", True, "Reconciled", "workspace reconciled")],
                },
            )
        if sc.profiles:
            stale = sc.taucluster_stale

            def profiles(current: bool) -> list[Obj]:
                return [
                    {
                        "name": p.name,
                        "workers": p.workers if current or not p.resolved_workers else p.resolved_workers,
                        "gpusPerWorker": p.gpus_per_worker,
                        "queue": p.local_queue,
                        "priorityClassName": p.priority_class,
                    }
                    for p in sc.profiles
                ]

            tc = self._create(
                {
                    "apiVersion": TAU_GV,
                    "kind": "TauCluster",
                    "metadata": {"name": "cluster"},
                    "spec": {"workloadProfiles": profiles(not stale)},
                }
            )
            self._taucluster = tc
            self._status(
                tc,
                {
                    "observedGeneration": 1,
                    "conditions": [self._cond("Ready", True, "Resolved", "all workload profiles resolved")],
                    "resolvedProfiles": [
                        {
                            "name": p.name,
                            "localQueue": p.local_queue,
                            "clusterQueue": p.cluster_queue,
                            "resourceFlavors": list(p.flavors),
                            "priorityClassName": p.priority_class,
                            "workers": p.resolved_workers or p.workers,
                            "gpusPerWorker": p.gpus_per_worker,
                        }
                        for p in sc.profiles
                        if p.resolved
                    ],
                    "lastResolvedTime": self._resolved_time(),
                },
            )
            if stale:  # the spec moves on (generation 2); the stuck controller never resolves it
                self._patch(tc, {"spec": {"workloadProfiles": profiles(True)}})
            else:
                self._after(sc.taucluster_refresh, self._refresh_taucluster)

    def _resolved_time(self) -> str:
        """lastResolvedTime as TauGrid writes it (`tauClusterFuture`: a stamp from the future)."""
        return rfc3339(self.clock.now() + timedelta(seconds=self.scenario.taucluster_future))

    def _refresh_taucluster(self) -> None:
        if self._taucluster is not None:
            self._status(self._taucluster, {"lastResolvedTime": self._resolved_time()})
            self._after(self.scenario.taucluster_refresh, self._refresh_taucluster)

    def _profile(self, run: RunSpec) -> Any:
        return next((p for p in self.scenario.profiles if p.name == run.profile), None)

    def _submit(self, r: RunState) -> None:
        spec = r.spec
        ns = spec.namespace
        profile = self._profile(spec)
        priority = profile.priority_class if profile else ""
        labels = {RUN_LABEL: spec.name} if spec.tau_run else {}
        if spec.tau_run:
            r.taurun = self._create(
                {
                    "apiVersion": TAU_GV,
                    "kind": "TauRun",
                    "metadata": {"name": spec.name, "namespace": ns, "labels": {RUN_LABEL: spec.name}},
                    "spec": {
                        "profile": spec.profile,
                        "workers": spec.workers,
                        "gpusPerWorker": spec.gpus_per_worker,
                        "image": spec.image,
                        "entrypoint": "python -m train --config /config/run.yaml",
                        "workspace": ns,
                    },
                }
            )
        if profile is not None and not profile.resolved and r.taurun is not None:
            # TauGrid cannot resolve the profile: it creates nothing below the TauRun.
            r.wait_stage = "target-resolution"
            r.submitted = True
            self._set_cond(
                r.conditions,
                self._cond("Admitted", False, "ProfileNotResolved", f"workload profile {spec.profile} is not resolved"),
            )
            self._tau_status(r, "Pending")
            return
        owner = [r.taurun.owner()] if r.taurun else []
        gpu_limits = {"nvidia.com/gpu": str(spec.gpus_per_worker)} if spec.gpus_per_worker else {}
        worker_resources = {
            "requests": {"cpu": "32", "memory": "256Gi", **gpu_limits},
            "limits": {"cpu": "32", "memory": "256Gi", **gpu_limits},
        }
        tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        if spec.kind == "RayJob":
            head_res = {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}}
            r.root = self._create(
                {
                    "apiVersion": RAY_GV,
                    "kind": "RayJob",
                    "metadata": {
                        "name": spec.name,
                        "namespace": ns,
                        "labels": {**labels, QUEUE_LABEL: spec.queue},
                        "ownerReferences": owner,
                    },
                    "spec": {
                        "entrypoint": "python -m train --config /config/run.yaml",
                        "suspend": True,
                        "submissionMode": "K8sJobMode",
                        "shutdownAfterJobFinishes": True,
                        "backoffLimit": 0,
                        "rayClusterSpec": {
                            "rayVersion": "2.40.0",
                            "headGroupSpec": {
                                "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
                                "template": {
                                    "metadata": {"labels": labels},
                                    "spec": {
                                        "containers": [{"name": "ray-head", "image": spec.image, "resources": head_res}]
                                    },
                                },
                            },
                            "workerGroupSpecs": [
                                {
                                    "groupName": "gpu-workers",
                                    "replicas": spec.workers,
                                    "minReplicas": spec.workers,
                                    "maxReplicas": spec.workers,
                                    "numOfHosts": 1,
                                    "rayStartParams": {},
                                    "template": {
                                        "metadata": {"labels": labels},
                                        "spec": {
                                            "tolerations": tolerations,
                                            "priorityClassName": priority,
                                            "containers": [
                                                {
                                                    "name": "ray-worker",
                                                    "image": spec.image,
                                                    "resources": worker_resources,
                                                }
                                            ],
                                        },
                                    },
                                }
                            ],
                        },
                    },
                },
                status={"jobDeploymentStatus": "Suspended", "jobStatus": ""},
            )
            podsets = [
                {
                    "name": "head",
                    "count": 1,
                    "template": {
                        "spec": {"containers": [{"name": "ray-head", "image": spec.image, "resources": head_res}]}
                    },
                },
                {
                    "name": "gpu-workers",
                    "count": spec.workers,
                    "template": {
                        "spec": {
                            "containers": [{"name": "ray-worker", "image": spec.image, "resources": worker_resources}]
                        }
                    },
                },
            ]
            wl_prefix = "rayjob"
        elif spec.kind in ("JobSet", "PyTorchJob"):
            r.root, podsets, wl_prefix = self._submit_operator_job(r, labels, owner, worker_resources, tolerations,
                                                                   priority)
        else:
            r.root = self._create(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": spec.name,
                        "namespace": ns,
                        "labels": {**labels, QUEUE_LABEL: spec.queue},
                        "ownerReferences": owner,
                    },
                    "spec": {
                        "suspend": True,
                        "parallelism": spec.workers,
                        "completions": spec.workers,
                        "completionMode": "Indexed",
                        "backoffLimit": 6,  # the Kubernetes default: failed pods are replaced
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {
                                "restartPolicy": "Never",
                                "tolerations": tolerations,
                                "priorityClassName": priority,
                                "containers": [{"name": "main", "image": spec.image, "resources": worker_resources}],
                            },
                        },
                    },
                },
                status={"conditions": [self._cond("Suspended", True, "JobSuspended", "Job suspended")]},
            )
            podsets = [
                {
                    "name": "main",
                    "count": spec.workers,
                    "template": {
                        "spec": {"containers": [{"name": "main", "image": spec.image, "resources": worker_resources}]}
                    },
                }
            ]
            wl_prefix = "job"
        r.workload = self._create(
            {
                "apiVersion": KUEUE_GV,
                "kind": "Workload",
                "metadata": {
                    "name": f"{wl_prefix}-{spec.name}-{self._hex(5)}",
                    "namespace": ns,
                    "labels": {**labels, "kueue.x-k8s.io/job-uid": r.root.uid},
                    "ownerReferences": [r.root.owner()],
                },
                "spec": {
                    "queueName": spec.queue,
                    "priorityClassName": priority,
                    "priority": 0,
                    "active": True,
                    "podSets": podsets,
                },
            }
        )
        self.event(
            r.root, "Normal", "CreatedWorkload", f"Created Workload: {ns}/{r.workload.name}", "kueue-job-controller"
        )
        r.submitted = True
        if r.taurun is not None:
            self._set_cond(
                r.conditions,
                self._cond("Admitted", False, "Queued", f"waiting for admission in LocalQueue {spec.queue}"),
            )
            self._tau_status(
                r,
                "Pending",
                extra={"rayJobName": r.root.name if spec.kind == "RayJob" else "", "workloadName": r.workload.name},
            )
        self._sync_queues()

    def _submit_operator_job(
        self, r: RunState, labels: Obj, owner: list[Obj], resources: Obj, tolerations: list[Obj], priority: str
    ) -> tuple[Ref, list[Obj], str]:
        """A suspended JobSet (one replicated job of `workers` indexed pods, maxRestarts 3) or PyTorchJob
        (a Master and workers-1 Workers, restartPolicy ExitCode), and the Workload's pod sets for it."""
        spec = r.spec
        meta = {"name": spec.name, "namespace": spec.namespace, "labels": {**labels, QUEUE_LABEL: spec.queue},
                "ownerReferences": owner}
        pod_spec = {"tolerations": tolerations, "priorityClassName": priority, "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": spec.grace}
        if spec.kind == "JobSet":
            container = {"name": "trainer", "image": spec.image, "resources": resources}
            root = self._create(
                {
                    "apiVersion": JOBSET_GV,
                    "kind": "JobSet",
                    "metadata": meta,
                    "spec": {
                        "suspend": True,
                        "failurePolicy": {"maxRestarts": 3},
                        "replicatedJobs": [
                            {
                                "name": "workers",
                                "replicas": 1,
                                "template": {
                                    "spec": {
                                        "parallelism": spec.workers,
                                        "completions": spec.workers,
                                        "completionMode": "Indexed",
                                        "backoffLimit": 0,
                                        "template": {"metadata": {"labels": labels},
                                                     "spec": {**pod_spec, "containers": [container]}},
                                    }
                                },
                            }
                        ],
                    },
                },
                status={"restarts": 0, "replicatedJobsStatus": [{"name": "workers", "ready": 0, "active": 0,
                                                                 "succeeded": 0, "failed": 0, "suspended": 1}]},
            )
            podsets = [{"name": "workers", "count": spec.workers,
                        "template": {"spec": {"containers": [container]}}}]
            return root, podsets, "jobset"
        container = {"name": "pytorch", "image": spec.image, "resources": resources}
        replica_specs: Obj = {
            "Master": {"replicas": 1, "restartPolicy": "ExitCode",
                       "template": {"metadata": {"labels": labels}, "spec": {**pod_spec, "containers": [container]}}}
        }
        if spec.workers > 1:
            replica_specs["Worker"] = {
                "replicas": spec.workers - 1,
                "restartPolicy": "ExitCode",
                "template": {"metadata": {"labels": labels}, "spec": {**pod_spec, "containers": [container]}},
            }
        r.root_conditions = {}
        self._set_cond(r.root_conditions, {**self._cond("Created", True, "PyTorchJobCreated",
                                                        f"PyTorchJob {spec.name} is created."),
                                           "lastUpdateTime": self._now()})
        root = self._create(
            {
                "apiVersion": PYTORCH_GV,
                "kind": "PyTorchJob",
                "metadata": meta,
                "spec": {
                    "runPolicy": {"suspend": True, "cleanPodPolicy": "None"},
                    "pytorchReplicaSpecs": replica_specs,
                },
            },
            status={"conditions": list(r.root_conditions.values()), "replicaStatuses": {}},
        )
        podsets = [{"name": "master", "count": 1, "template": {"spec": {"containers": [container]}}}]
        if spec.workers > 1:
            podsets.append({"name": "worker", "count": spec.workers - 1,
                            "template": {"spec": {"containers": [container]}}})
        return root, podsets, "pytorchjob"
