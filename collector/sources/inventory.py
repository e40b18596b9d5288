"""Reads what the supported-environment check needs from one cluster, read-only.

`/version`, CustomResourceDefinitions (served and stored versions) and Deployments (controller
image tags and the TauGrid chart label). A read that fails is named in `errors` and leaves that part
empty, which the check reports as `unknown`: never a guess.

Deployments are read cluster-wide, or, given `deployment_namespaces` (the namespaces Kueue, KubeRay
and TauGrid run in), only there: the chart then grants the read in those namespaces alone.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from collector.envcontract import ClusterInventory, EnvironmentReport, check, inventory
from collector.settings import ControllerSettings
from collector.sources.kube_api import JSON, KubeApi, Resource, SourceError

__all__ = ["CRDS", "DEPLOYMENTS", "ENVIRONMENT_READS", "ClusterRead", "read_cluster", "read_environment"]

CRDS = Resource("CustomResourceDefinition", "apiextensions.k8s.io", "v1", "customresourcedefinitions",
                namespaced=False)
DEPLOYMENTS = Resource("Deployment", "apps", "v1", "deployments")
# (group, resource, verb) the check needs beyond the watched resources; tests/chart holds the
# chart's ClusterRole to it. /version is a non-resource URL every authenticated client may read.
ENVIRONMENT_READS: frozenset[tuple[str, str, str]] = frozenset(
    {
        (CRDS.group, CRDS.plural, "get"),
        (CRDS.group, CRDS.plural, "list"),
        (DEPLOYMENTS.group, DEPLOYMENTS.plural, "list"),
    }
)


@dataclass(frozen=True, slots=True)
class ClusterRead:
    inventory: ClusterInventory
    errors: tuple[str, ...]


def read_cluster(name: str, api: KubeApi,
                 deployment_namespaces: Collection[str] = ControllerSettings().environment_namespaces,
                 ) -> ClusterRead:
    """One cluster's inventory. With `deployment_namespaces`, Deployments are listed there and only
    those count (a tenant's Deployment with Kueue's image is not Kueue); empty: cluster-wide, all count."""
    errors: list[str] = []
    version: JSON | None = None
    try:
        version = api.get_json("/version")
    except SourceError as e:
        errors.append(f"{name}: /version: {e}")
    objects: list[JSON] = []
    deployments: list[Resource] = [DEPLOYMENTS] if not deployment_namespaces else [
        replace(DEPLOYMENTS, namespace=ns) for ns in sorted(deployment_namespaces)]
    for res in (CRDS, *deployments):
        where = f" in {res.namespace}" if res.namespace else ""
        try:
            objects += api.list_pages(res)[0]
        except SourceError as e:
            errors.append(f"{name}: {res.name}{where}: {e}")
    return ClusterRead(inventory(name, version, objects, deployment_namespaces or None), tuple(errors))


def read_environment(clusters: Sequence[tuple[str, KubeApi]], *, deployment_namespaces: Collection[str] = (),
                     ) -> tuple[EnvironmentReport, tuple[str, ...]]:
    """Read the manager (first) and every configured worker, then check them together."""
    reads = [read_cluster(name, api, deployment_namespaces) for name, api in clusters]
    return check([r.inventory for r in reads]), tuple(e for r in reads for e in r.errors)
