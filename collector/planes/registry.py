"""Every evidence plane the controller can read, in one place, and the ones these settings enable.

Adding a plane is adding a module beside this one (an `EvidenceSource`, and `PerRun` if it reads
something per run) and one line in `PLANES`. Order matters only at start: the watched resources
first (discovery happens there), then the pollers in the order listed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from collector.planes.api_logs import ApiLogSource
from collector.planes.base import EvidenceSource, PerRun, SourceContext
from collector.planes.envcheck import EnvironmentSource
from collector.planes.expstore import CheckpointSource
from collector.planes.kube_watch import KubeWatch
from collector.planes.kueue_visibility import QueueSource
from collector.planes.multikueue import WorkerSource
from collector.planes.node_agents import AgentSource
from collector.planes.ray_heads import RaySource
from collector.sources.kube_api import Resource

__all__ = ["PLANES", "Plane", "Sources", "build_sources", "error_labels"]


@dataclass(frozen=True, slots=True)
class Plane:
    build: Callable[[SourceContext], EvidenceSource | None]  # None: off in these settings
    # `source` labels whose error counters exist from the start (at 0), whether or not it is enabled
    labels: tuple[str, ...] = ()


PLANES: tuple[Plane, ...] = (
    Plane(ApiLogSource.build, labels=("logs",)),
    Plane(CheckpointSource.build, labels=("expstore",)),
    Plane(RaySource.build, labels=("ray",)),
    Plane(AgentSource.build),
    Plane(QueueSource.build, labels=("kueue-visibility",)),
    Plane(WorkerSource.build),
    Plane(EnvironmentSource.build),
)


@dataclass(frozen=True, slots=True)
class Sources:
    """What the controller composes: the watched resources, and every source enabled (the watch first)."""

    watch: KubeWatch
    all: tuple[EvidenceSource, ...]

    @property
    def per_run(self) -> tuple[PerRun, ...]:
        return tuple(s for s in self.all if isinstance(s, PerRun))

    def by_name(self, name: str) -> EvidenceSource:
        return next(s for s in self.all if s.name == name)


def error_labels(resources: tuple[Resource, ...], workers: tuple[str, ...]) -> list[str]:
    """The `source` labels of taugrid_collector_errors_total that exist from the start: the watched
    resources, the sources' own, the controller's, and each MultiKueue worker."""
    return ([r.name for r in resources] + [label for p in PLANES for label in p.labels]
            + ["lease", "controller", "export"] + [f"worker:{w}" for w in workers])


def build_sources(ctx: SourceContext, wanted: tuple[Resource, ...]) -> Sources:
    watch = KubeWatch(ctx, wanted)
    built = [s for p in PLANES if (s := p.build(ctx)) is not None]
    return Sources(watch, (watch, *built))
