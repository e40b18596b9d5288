"""Raw objects shaped as a cluster returns them: /version, CustomResourceDefinitions, Deployments."""

from __future__ import annotations

from typing import Any


def version(git: str = "v1.31.4") -> dict[str, Any]:
    major, minor = git.lstrip("v").split(".")[:2]
    return {"major": major, "minor": minor, "gitVersion": git, "platform": "linux/amd64"}


def crd(plural: str, group: str, versions: tuple[str, ...] = ("v1beta1",), storage: str = "v1beta1") -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"plural": plural, "kind": plural.capitalize().rstrip("s"), "singular": plural.rstrip("s")},
            "scope": "Namespaced",
            "versions": [{"name": v, "served": True, "storage": v == storage} for v in versions],
        },
    }


def deployment(name: str, namespace: str, image: str, chart: str | None = None) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name}
    if chart:
        labels["helm.sh/chart"] = chart
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "manager", "image": image}]},
            },
        },
    }


def supported_objects(
    kueue: str = "v0.18.2", kuberay: str = "v1.6.2", taugrid: str = "0.3.1", chart: str = "taugrid-0.3.1",
    workload_versions: tuple[str, ...] = ("v1beta1",),
) -> list[dict[str, Any]]:
    return [
        crd("workloads", "kueue.x-k8s.io", workload_versions, workload_versions[-1]),
        crd("rayjobs", "ray.io", ("v1",), "v1"),
        crd("tauruns", "taugrid.io", ("v1alpha1",), "v1alpha1"),
        deployment("kueue-controller-manager", "kueue-system", f"registry.k8s.io/kueue/kueue:{kueue}"),
        deployment("kuberay-operator", "ray-system", f"quay.io/kuberay/operator:{kuberay}"),
        deployment("taugrid-controller", "taugrid-system", f"example.azurecr.io/taugrid/controller:{taugrid}", chart),
        deployment("taugrid-evidence-controller", "taugrid-system", "ghcr.io/x/taugrid-evidence:9.9.9"),
    ]
