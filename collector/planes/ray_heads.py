"""Each Ray head's Jobs, state and metrics APIs (collector/sources/ray.py): runtime state and a
progress counter, every `ray_poll_interval`, for the Ray clusters of the runs that are not finished."""

from __future__ import annotations

from collector.claims.memo import ByInputs
from collector.correlate import Key, RunEvidence
from collector.model import PodFacts, RayClusterFacts, RayJobFacts, Ref, RunClaims
from collector.planes.base import Change, PolledSource, SourceContext, SourceState, Targets, profile_of
from collector.settings import ControllerSettings
from collector.sources.ray import RayPoller, RayTarget
from collector.sources.ray_urls import dashboard_url_for, metrics_url_for, owned_by, worker_metrics_url
from exporters.prometheus_health import ErrorClass

__all__ = ["RaySource", "ray_targets_of"]


class RaySource(PolledSource):
    """The `ray` source: thread `ray-poller`. A head that cannot be read is counted here; its answer
    still goes to the loop, which withdraws the head's evidence."""

    name = "ray"
    thread = "ray-poller"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.settings.controller
        self.targets: Targets[tuple[Ref, RayTarget]] = Targets()  # (run root, head)
        self.state = SourceState(self.name, ctx.health)
        # per run, the targets and the records they were built from: every evaluation of a run tracks
        # it, and building them validates each worker pod's URL again; while those records stand (the
        # same objects: records are immutable, replaced on change), the targets do too
        self._built: ByInputs[Key, tuple[tuple[Ref, RayTarget], ...]] = ByInputs()

    @classmethod
    def build(cls, ctx: SourceContext) -> RaySource | None:
        return cls(ctx) if ctx.settings.controller.ray_poll_interval.total_seconds() > 0 else None

    def track(self, key: Key, ev: RunEvidence, rc: RunClaims) -> None:
        if rc.finished:
            self.forget(key)
            return
        read = (ev.root, ev.taurun, *ev.rayjobs, *ev.rayclusters, *ev.pods)  # all ray_targets_of reads
        kept = self._built.get(key, read)
        if kept is None:
            kept = (tuple(ray_targets_of(ev, self.cfg)),)
            self._built.put(key, read, kept[0])
        self.targets.set(key, kept[0])

    def forget(self, key: Key) -> None:
        self._built.forget(key)
        self.targets.set(key, ())

    def publish(self) -> None:
        self.targets.publish()

    def run(self) -> None:
        poller = RayPoller()
        interval = self.cfg.ray_poll_interval.total_seconds()
        while not self.ctx.stop.wait(interval if self.targets.current else min(interval, 1.0)):
            pairs = list(self.targets.current)
            roots = {t.cluster.key: root for root, t in pairs}
            for cluster, runtime, sig in poller.poll_each([t for _, t in pairs], self.ctx.now()):  # each as read
                root = roots[cluster.key]
                if runtime.error:
                    self.state.error(ErrorClass.RETRYABLE, runtime.error)
                self.ctx.loop.put(Change("ray", None, (root, cluster, runtime, sig)))


def ray_targets_of(ev: RunEvidence, cfg: ControllerSettings) -> list[tuple[Ref, RayTarget]]:
    """The run's Ray heads, with the URLs to read (configured overrides first; validated parts only)."""
    ns = ev.root.ref.namespace
    clusters: dict[str, dict[str, str]] = {}
    cluster_uids = {rcl.ref.name: rcl.ref.uid for rcl in ev.rayclusters}
    for rj in ev.rayjobs:
        jf = rj.facts
        if isinstance(jf, RayJobFacts) and jf.cluster_name:
            clusters.setdefault(jf.cluster_name, {}).update(job_id=jf.job_id, dashboard=jf.dashboard_url)
    for rcl in ev.rayclusters:
        cf = rcl.facts
        if isinstance(cf, RayClusterFacts):
            clusters.setdefault(rcl.ref.name, {}).update(service=cf.head_service, dport=cf.dashboard_port,
                                                         mport=cf.metrics_port)
    out = []
    for name, info in sorted(clusters.items()):
        dash = dashboard_url_for(ns, name, overrides=cfg.ray_dashboards,
                                 rayjob_dashboard_url=info.get("dashboard"), head_service=info.get("service"),
                                 dashboard_port=info.get("dport") or None, cluster_domain=cfg.cluster_domain)
        if dash is None:
            continue
        metrics = metrics_url_for(ns, name, overrides=cfg.ray_metrics, head_service=info.get("service"),
                                  metrics_port=info.get("mport") or None, cluster_domain=cfg.cluster_domain)
        counter = cfg.ray_counter_by_profile.get(profile_of(ev), cfg.ray_progress_counter)
        workers = tuple(
            url for pod in ev.pods
            if isinstance(pf := pod.facts, PodFacts) and pf.ray_node_type == "worker" and pf.pod_ip
            and pf.phase == "Running" and name in cluster_uids  # owned, not just labelled: labels are tenant's
            and owned_by(pod.owners, "RayCluster", name, cluster_uids[name])
            and (url := worker_metrics_url(pf.pod_ip, info.get("mport") or None))  # validated parts only
        ) if cfg.ray_scrape_workers else ()
        target = RayTarget(Ref("RayCluster", ns, name), dash, metrics, info.get("job_id") or None,
                           counter=counter, worker_metrics_urls=workers)
        out.append((ev.root.ref, target))
    return out
