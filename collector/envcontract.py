"""The supported-environment contract (the admin guide's multi-cluster table), checked as pure code.

Contract, per the guide: TauGrid chart and images 0.3.x from one release; Kubernetes 1.30 or newer;
Kueue 0.18.2; KubeRay 1.6.2; and the same Kubernetes, Kueue, KubeRay and workload CRD minor versions
on the manager and every worker. Inputs are what a reader can fetch with read-only verbs: the
`/version` document, CustomResourceDefinitions (served and stored versions) and controller
Deployments (image tags). `inventory` turns those raw objects into a `ClusterInventory`; `check`
judges a set of them. A version that cannot be read is a violation (`unknown`): the contract is
claimed only when every row is seen to hold.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "KUBERAY_VERSION",
    "KUEUE_VERSION",
    "MIN_KUBERNETES",
    "TAUGRID_MINOR",
    "WORKLOAD_CRD_GROUPS",
    "Check",
    "ClusterInventory",
    "CrdVersions",
    "EnvironmentReport",
    "Reason",
    "Violation",
    "check",
    "inventory",
    "single_cluster",
]

MIN_KUBERNETES = (1, 30)
KUEUE_VERSION = (0, 18, 2)
KUBERAY_VERSION = (1, 6, 2)
TAUGRID_MINOR = (0, 3)
# CRDs whose served/stored versions must agree across clusters (the workload CRDs and their queues).
WORKLOAD_CRD_GROUPS = ("kueue.x-k8s.io", "ray.io", "taugrid.io")


class Check(StrEnum):
    """Which row of the contract; a bounded metric label."""

    TAUGRID = "taugrid"
    KUBERNETES = "kubernetes"
    KUEUE = "kueue"
    KUBERAY = "kuberay"
    CRD = "crd"


class Reason(StrEnum):
    """Why a row fails; a bounded metric label."""

    UNSUPPORTED = "unsupported"  # a version outside the contract
    UNKNOWN = "unknown"  # the version could not be read
    RELEASE_MISMATCH = "release-mismatch"  # TauGrid chart and images from different releases
    SKEW = "skew"  # a worker differs from the manager


@dataclass(frozen=True, slots=True)
class CrdVersions:
    served: tuple[str, ...]
    storage: str | None


@dataclass(frozen=True, slots=True)
class ClusterInventory:
    """What one cluster runs. `images` maps a component (kueue, kuberay, taugrid) to its image tags."""

    cluster: str
    kubernetes: str | None = None
    crds: Mapping[str, CrdVersions] = field(default_factory=dict)
    images: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    taugrid_charts: tuple[str, ...] = ()  # chart versions from `helm.sh/chart` labels of TauGrid Deployments


@dataclass(frozen=True, slots=True)
class Violation:
    cluster: str
    check: Check
    reason: Reason
    detail: str

    def __str__(self) -> str:
        return f"{self.cluster}: {self.check.value} {self.reason.value}: {self.detail}"


@dataclass(frozen=True, slots=True)
class EnvironmentReport:
    clusters: tuple[ClusterInventory, ...]
    violations: tuple[Violation, ...]

    @property
    def supported(self) -> bool:
        return bool(self.clusters) and not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "supported": self.supported if self.clusters else None,
            "clusters": [
                {
                    "cluster": c.cluster,
                    "kubernetes": c.kubernetes,
                    "images": {k: list(v) for k, v in sorted(c.images.items())},
                    "taugrid_charts": list(c.taugrid_charts),
                    "crds": {
                        n: {"served": list(v.served), "storage": v.storage} for n, v in sorted(c.crds.items())
                    },
                }
                for c in self.clusters
            ],
            "violations": [
                {"cluster": v.cluster, "check": v.check.value, "reason": v.reason.value, "detail": v.detail}
                for v in self.violations
            ],
        }

    def summary(self) -> str:
        """One line for `explain`'s text output."""
        if not self.clusters:
            return "environment: unknown (no version information)"
        names = ", ".join(c.cluster for c in self.clusters)
        if self.supported:
            return f"environment: supported ({names})"
        return f"environment: outside the supported contract ({names}): " + "; ".join(map(str, self.violations))


# --- reading raw objects -----------------------------------------------------------------------

# Bounded, anchored patterns on short strings (linear time).
_SEMVER = re.compile(r"v?(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?")
# The version part of a `helm.sh/chart` label (NAME-VERSION; NAME may hold dashes, VERSION too).
_CHART_VERSION = re.compile(r"v?\d{1,6}\.\d{1,6}\.\d{1,6}[A-Za-z0-9.+-]{0,60}")


def _chart_version(label: str) -> str | None:
    """The VERSION of a NAME-VERSION chart label: the first dash followed by a whole version."""
    label = label[:300]
    pos = label.find("-")
    while pos > 0:
        if _CHART_VERSION.fullmatch(label, pos + 1) is not None:
            return label[pos + 1:]
        pos = label.find("-", pos + 1)
    return None


def _parse(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    m = _SEMVER.match(version.strip()[:80])
    if m is None:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def _component(repository: str) -> str | None:
    """Which controller an image repository belongs to (the last path element, lower-cased)."""
    last = repository.rsplit("/", 1)[-1].lower()
    path = repository.lower()
    if "taugrid-evidence" in path:
        return None  # this collector is not part of the TauGrid release
    if last == "kueue" or last.startswith("kueue-"):
        return "kueue"
    if "kuberay" in path and ("operator" in last or last == "kuberay"):
        return "kuberay"
    if "taugrid" in path:
        return "taugrid"
    return None


def _split_image(image: str) -> tuple[str, str | None]:
    """`registry:5000/repo/name:tag@sha256:…` → (`registry:5000/repo/name`, `tag`)."""
    ref = image.split("@", 1)[0]
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        return ref[:colon], ref[colon + 1 :]
    return ref, None


def _dict(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def inventory(
    cluster: str, version_doc: Mapping[str, Any] | None, objects: Iterable[Mapping[str, Any]],
    namespaces: Collection[str] | None,
) -> ClusterInventory:
    """Build one cluster's inventory from `/version` (or `kubectl version -o json`) and raw
    CustomResourceDefinition and Deployment objects; other kinds are ignored, and so are Deployments
    outside the controllers' `namespaces` (`ControllerSettings.environment_namespaces`): a tenant's
    Deployment with Kueue's image is not Kueue. None: every Deployment counts (a cluster-wide read the
    operator chose)."""
    doc = _dict(version_doc)
    doc = _dict(doc.get("serverVersion")) or doc
    git = doc.get("gitVersion")
    kubernetes = git if isinstance(git, str) and git else None
    crds: dict[str, CrdVersions] = {}
    images: dict[str, set[str]] = {}
    charts: set[str] = set()
    for obj in objects:
        kind = obj.get("kind")
        meta = _dict(obj.get("metadata"))
        if kind == "CustomResourceDefinition":
            spec = _dict(obj.get("spec"))
            group = spec.get("group")
            name = meta.get("name")
            if group not in WORKLOAD_CRD_GROUPS or not isinstance(name, str):
                continue
            served = tuple(
                sorted(str(v.get("name")) for v in _list(spec.get("versions")) if _dict(v).get("served"))
            )
            storage = next((str(v.get("name")) for v in _list(spec.get("versions")) if _dict(v).get("storage")), None)
            crds[name] = CrdVersions(served, storage)
        elif kind == "Deployment" and (namespaces is None or meta.get("namespace") in namespaces):
            pod = _dict(_dict(_dict(obj.get("spec")).get("template")).get("spec"))
            found = False
            for c in _list(pod.get("containers")):
                image = _dict(c).get("image")
                if not isinstance(image, str):
                    continue
                repo, tag = _split_image(image)
                comp = _component(repo)
                if comp is not None:
                    images.setdefault(comp, set()).add(tag or "")
                    found = found or comp == "taugrid"
            chart = _dict(meta.get("labels")).get("helm.sh/chart")
            if found and isinstance(chart, str):
                version = _chart_version(chart)
                if version is not None:
                    charts.add(version)
    return ClusterInventory(
        cluster,
        kubernetes,
        crds,
        {k: tuple(sorted(v)) for k, v in images.items()},
        tuple(sorted(charts)),
    )


# --- the check ---------------------------------------------------------------------------------


def _fmt(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def _pinned(inv: ClusterInventory, component: str, want: tuple[int, ...], chk: Check) -> Iterable[Violation]:
    tags = inv.images.get(component, ())
    if not tags:
        yield Violation(inv.cluster, chk, Reason.UNKNOWN, f"no {component} controller Deployment found")
        return
    for tag in tags:
        if _parse(tag) is None:
            yield Violation(inv.cluster, chk, Reason.UNKNOWN,
                            f"{component} image tag {tag or '(none)'!r} is no version")
        elif _parse(tag) != want:
            yield Violation(inv.cluster, chk, Reason.UNSUPPORTED, f"{component} {tag}, supported {_fmt(want)}")


def _taugrid(inv: ClusterInventory) -> Iterable[Violation]:
    tags = inv.images.get("taugrid", ())
    if not tags:
        yield Violation(inv.cluster, Check.TAUGRID, Reason.UNKNOWN, "no TauGrid controller Deployment found")
        return
    versions = {t: _parse(t) for t in (*tags, *inv.taugrid_charts)}
    for t, v in sorted(versions.items()):
        if v is None:
            yield Violation(inv.cluster, Check.TAUGRID, Reason.UNKNOWN,
                            f"TauGrid version {t or '(none)'!r} is no version")
        elif v[:2] != TAUGRID_MINOR:
            yield Violation(inv.cluster, Check.TAUGRID, Reason.UNSUPPORTED,
                            f"TauGrid {t}, supported {_fmt(TAUGRID_MINOR)}.x")
    parsed = {v for v in versions.values() if v is not None}
    if len(parsed) > 1:
        yield Violation(
            inv.cluster, Check.TAUGRID, Reason.RELEASE_MISMATCH,
            "chart and images from different releases: " + ", ".join(sorted(map(_fmt, parsed))),
        )


def _kubernetes(inv: ClusterInventory) -> Iterable[Violation]:
    v = _parse(inv.kubernetes)
    if v is None:
        yield Violation(inv.cluster, Check.KUBERNETES, Reason.UNKNOWN, "server version not read")
    elif v[:2] < MIN_KUBERNETES:
        yield Violation(inv.cluster, Check.KUBERNETES, Reason.UNSUPPORTED,
                        f"Kubernetes {inv.kubernetes}, supported {_fmt(MIN_KUBERNETES)} or newer")


def _minors(inv: ClusterInventory) -> dict[Check, object]:
    """What must match the manager's: minor versions, and each workload CRD's versions."""
    def minor(tags: Sequence[str]) -> object:
        return tuple(sorted({p[:2] for p in map(_parse, tags) if p is not None}))

    k = _parse(inv.kubernetes)
    return {
        Check.KUBERNETES: k[:2] if k is not None else None,
        Check.KUEUE: minor(inv.images.get("kueue", ())),
        Check.KUBERAY: minor(inv.images.get("kuberay", ())),
        Check.CRD: {n: (v.served, v.storage) for n, v in sorted(inv.crds.items())},
    }


def _skew(manager: ClusterInventory, worker: ClusterInventory) -> Iterable[Violation]:
    want, got = _minors(manager), _minors(worker)
    for chk in (Check.KUBERNETES, Check.KUEUE, Check.KUBERAY):
        if want[chk] != got[chk]:
            yield Violation(worker.cluster, chk, Reason.SKEW,
                            f"{chk.value} minor {got[chk]} on the worker, {want[chk]} on the manager {manager.cluster}")
    mc = manager.crds
    wc = worker.crds
    for name in sorted(set(mc) | set(wc)):
        if mc.get(name) != wc.get(name):
            def show(v: CrdVersions | None) -> str:
                return "absent" if v is None else f"served {','.join(v.served)} stored {v.storage}"

            yield Violation(worker.cluster, Check.CRD, Reason.SKEW,
                            f"{name}: {show(wc.get(name))} on the worker, {show(mc.get(name))} on the manager")


def check(clusters: Sequence[ClusterInventory]) -> EnvironmentReport:
    """Judge the manager (`clusters[0]`) and its workers against the contract."""
    out: list[Violation] = []
    for inv in clusters:
        out += _taugrid(inv)
        out += _kubernetes(inv)
        out += _pinned(inv, "kueue", KUEUE_VERSION, Check.KUEUE)
        out += _pinned(inv, "kuberay", KUBERAY_VERSION, Check.KUBERAY)
    for worker in clusters[1:]:
        out += _skew(clusters[0], worker)
    return EnvironmentReport(tuple(clusters), tuple(out))


def single_cluster(
    cluster: str, version_doc: Mapping[str, Any] | None, objects: Sequence[Mapping[str, Any]],
    namespaces: Collection[str] | None,
) -> EnvironmentReport:
    """One cluster's check (a dump); no clusters at all when nothing version-bearing was read."""
    if version_doc is None and not objects:
        return check([])
    return check([inventory(cluster, version_doc, objects, namespaces)])
