"""Cluster dumps as users make them, for the accuracy harness: kubectl's own output, never rewritten.

Three kinds, all of one frozen instant (the simulator's clock stands still while they are taken):

- bare: `kubectl cluster-info dump --all-namespaces --output-directory DIR`, exactly as kubectl
  writes it (logs without kubelet timestamps, no custom kinds);
- full: the README's fuller procedure, every step (`PROCEDURE`);
- user: the fuller procedure with some steps skipped, then degraded file by file as a user's tooling
  might leave it (`DEGRADATIONS`): previous logs removed, Node objects removed, Events aged out,
  kubectl's banners stripped from a single-container pod's log, kubelet timestamps stripped, one
  rank's log missing.

The per-container log steps (`kubectl logs [--previous] --timestamps -n NS POD -c C > FILE`) are many
small kubectl runs; by default they are made as the same GET kubectl makes
(`/api/v1/namespaces/NS/pods/POD/log?container=C&timestamps=true[&previous=true]`), whose answer
kubectl writes out unchanged (tests/simulator/test_realism.py holds the two byte-equal);
`real_kubectl=True` runs kubectl.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kubesim.kubeconfig import write_kubeconfig

CRD_KINDS = "tauruns,tauworkspaces,rayjobs,rayclusters,workloads,localqueues,jobs,jobsets,pytorchjobs"
CLUSTER_KINDS = "clusterqueues,tauclusters"
CURRENT_SUFFIX = "-current.txt"  # kubectl logs --timestamps of a container: DIR/NS/POD/CONTAINER-current.txt
PREVIOUS_SUFFIX = "-previous.txt"
# The fuller procedure, step by step (a user may skip any but the first).
PROCEDURE = {
    "cluster-info": "kubectl cluster-info dump --all-namespaces --output-directory DIR",
    "crds": f"kubectl get {CRD_KINDS} -A -o json > DIR/crds.json",
    "cluster": f"kubectl get {CLUSTER_KINDS} -o json > DIR/cluster.json",
    "leases": "kubectl get leases -n kube-node-lease -o json > DIR/leases.json",
    "current-logs": "kubectl logs --timestamps -n NS POD -c CONTAINER > DIR/NS/POD/CONTAINER-current.txt"
                    "   (every container of every pod)",
    "previous-logs": "kubectl logs --previous --timestamps -n NS POD -c CONTAINER > "
                     "DIR/NS/POD/CONTAINER-previous.txt   (every container that restarted)",
}
GLOBAL_STEPS = ("crds", "cluster", "leases")
POD_STEPS = ("current-logs", "previous-logs")
DEGRADATIONS = ("no-previous", "no-node", "no-events", "no-banners", "no-kubelet-timestamps", "missing-rank-log")
_BANNER = re.compile(r"^==== (START|END) logs for container \S+ of pod \S+ ====$")
_KUBELET_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z ")


class Kubectl:
    """kubectl against the simulator, with a kubeconfig of its own. Log reads are cached: every
    dump of one instant gets the same bytes (the clock stands still while they are taken)."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.kubeconfig = write_kubeconfig(workdir / "kubeconfig", url)
        self._logs: dict[tuple[str, str, str, bool, bool], bytes | None] = {}
        self._conn: http.client.HTTPConnection | None = None

    def run(self, *args: str, out: Path | None = None) -> None:
        with (out.open("wb") if out else open("/dev/null", "wb")) as fh:  # noqa: SIM115
            proc = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args], stdout=fh,
                                  stderr=subprocess.PIPE, timeout=600, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.decode()[:500]}")

    def logs(self, ns: str, pod: str, container: str, previous: bool, real_kubectl: bool) -> bytes | None:
        """`kubectl logs [--previous] --timestamps -n NS POD -c CONTAINER` (None where kubectl fails)."""
        key = (ns, pod, container, previous, real_kubectl)
        if key not in self._logs:
            self._logs[key] = self._read_log(ns, pod, container, previous, real_kubectl)
        return self._logs[key]

    def _read_log(self, ns: str, pod: str, container: str, previous: bool, real_kubectl: bool) -> bytes | None:
        if real_kubectl:
            args = ["logs", "--timestamps", "-n", ns, pod, "-c", container, *(["--previous"] if previous else [])]
            proc = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args], capture_output=True,
                                  timeout=120, check=False)
            return proc.stdout if proc.returncode == 0 else None
        query = {"container": container, "timestamps": "true", **({"previous": "true"} if previous else {})}
        path = f"/api/v1/namespaces/{ns}/pods/{pod}/log?{urllib.parse.urlencode(query)}"
        for attempt in (0, 1):
            if self._conn is None:
                u = urllib.parse.urlsplit(self.url)
                self._conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=60)
            try:
                self._conn.request("GET", path, headers={"Accept": "*/*"})
                resp = self._conn.getresponse()
                body: bytes = resp.read()
                return body if resp.status == 200 else None
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
        return None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def pods_of(dump: Path) -> list[dict[str, Any]]:
    """Every pod of the dump's pods.json files."""
    out: list[dict[str, Any]] = []
    for f in sorted(dump.glob("*/pods.json")):
        out += json.loads(f.read_text()).get("items") or []
    return out


def bare(kubectl: Kubectl, dump: Path) -> Path:
    kubectl.run("cluster-info", "dump", "--all-namespaces", "--output-directory", str(dump))
    return dump


def procedure(kubectl: Kubectl, base: Path, dump: Path, skip: Iterable[str] = (),
              pod_skip: Callable[[str, str], Iterable[str]] | None = None, extra_kinds: str = "",
              real_kubectl: bool = False) -> Path:
    """The fuller procedure on a copy of the bare dump `base` (the same kubectl output at the same
    instant), without the steps in `skip`; `pod_skip(ns, pod)` names per-pod steps skipped for a pod."""
    skipped = set(skip)
    shutil.copytree(base, dump)
    if "crds" not in skipped:
        kubectl.run("get", CRD_KINDS, "-A", "-o", "json", out=dump / "crds.json")
    if "cluster" not in skipped:
        kubectl.run("get", CLUSTER_KINDS, "-o", "json", out=dump / "cluster.json")
        if extra_kinds:
            kubectl.run("get", extra_kinds, "-A", "-o", "json", out=dump / "extras.json")
    if "leases" not in skipped:
        kubectl.run("get", "leases", "-n", "kube-node-lease", "-o", "json", out=dump / "leases.json")
    for pod in pods_of(dump):
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        steps = skipped | set(pod_skip(ns, name) if pod_skip else ())
        restarted = {c["name"] for c in (pod.get("status") or {}).get("containerStatuses") or []
                     if c.get("restartCount")}
        for c in (pod.get("spec") or {}).get("containers") or []:
            cname = c["name"]
            if "current-logs" not in steps:
                body = kubectl.logs(ns, name, cname, False, real_kubectl)
                if body is not None:
                    (dump / ns / name).mkdir(parents=True, exist_ok=True)
                    (dump / ns / name / f"{cname}{CURRENT_SUFFIX}").write_bytes(body)
            if "previous-logs" not in steps and cname in restarted:
                body = kubectl.logs(ns, name, cname, True, real_kubectl)
                if body is not None:
                    (dump / ns / name).mkdir(parents=True, exist_ok=True)
                    (dump / ns / name / f"{cname}{PREVIOUS_SUFFIX}").write_bytes(body)
    return dump


# ----------------------------------------------------------------------------- degradations
def _pod_dirs(dump: Path, ns: str, prefix: str) -> list[Path]:
    return sorted(p for p in (dump / ns).glob(f"{prefix}-*") if p.is_dir())


def _rewrite_items(path: Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    if not path.is_file():
        return 0
    doc = orjson.loads(path.read_bytes())
    items = doc.get("items") or []
    kept = [i for i in items if keep(i)]
    if len(kept) != len(items):
        doc["items"] = kept
        path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return len(items) - len(kept)


@dataclass(frozen=True, slots=True)
class Degradation:
    """One degradation of one run's files: `what` (one of DEGRADATIONS) for run `ns/run` (its pods are
    named `run-...`), whose nodes are `nodes` and whose rank `rank_pod` loses its log."""

    what: str
    ns: str
    run: str
    nodes: tuple[str, ...] = ()
    rank_pod: str = ""


def degrade(dump: Path, plans: Iterable[Degradation]) -> int:
    """Apply degradations to the dump's files (each shared file rewritten once); returns how many
    files or items changed."""
    changed = 0
    gone_nodes: set[str] = set()
    quiet: dict[str, list[str]] = {}  # namespace → runs whose Events aged out
    for p in plans:
        if p.what not in DEGRADATIONS:
            raise ValueError(f"unknown degradation {p.what!r}")
        pods = _pod_dirs(dump, p.ns, p.run)
        if p.what == "no-node":
            gone_nodes.update(p.nodes)
        elif p.what == "no-events":
            quiet.setdefault(p.ns, []).append(p.run)
            quiet.setdefault("default", []).extend(p.nodes)
        elif p.what == "no-previous":
            for d in pods:
                for f in d.glob(f"*{PREVIOUS_SUFFIX}"):
                    f.unlink()
                    changed += 1
        elif p.what == "no-banners":
            for d in pods:
                changed += _strip_banners(d / "logs.txt")
        elif p.what == "no-kubelet-timestamps":
            for d in pods:
                for f in [*d.glob(f"*{CURRENT_SUFFIX}"), *d.glob(f"*{PREVIOUS_SUFFIX}")]:
                    lines = f.read_text(errors="replace").splitlines(keepends=True)
                    f.write_text("".join(_KUBELET_STAMP.sub("", ln, count=1) for ln in lines))
                    changed += 1
        elif p.what == "missing-rank-log":
            d = dump / p.ns / p.rank_pod
            if p.rank_pod and d.is_dir():
                for f in list(d.glob("*.txt")):
                    f.unlink()
                    changed += 1
    if gone_nodes:
        changed += _rewrite_items(dump / "nodes.json", lambda n: n.get("metadata", {}).get("name") not in gone_nodes)
    for ns, names in quiet.items():
        runs = set(names)

        def keep(e: dict[str, Any], runs: set[str] = runs) -> bool:
            name = str((e.get("involvedObject") or {}).get("name") or "")
            if name in runs:
                return False
            parts = name.split("-")
            # a run's pods and RayCluster (RUN-...), its Workload (KIND-RUN-...), its nodes (by name)
            return not any(x in runs for x in (parts[0], parts[1] if len(parts) > 1 else ""))
        changed += _rewrite_items(dump / ns / "events.json", keep)
    return changed


def _strip_banners(log: Path) -> int:
    """A single-container pod's log without kubectl's START/END lines (as `samples/demo-dump` has it)."""
    if not log.is_file():
        return 0
    lines = log.read_text(errors="replace").splitlines(keepends=True)
    starts = [ln for ln in lines if _BANNER.match(ln.rstrip("\n")) and " START " in ln]
    if len(starts) != 1:
        return 0  # kubectl's banners are what tells containers apart: only single-container logs lose them
    log.write_text("".join(ln for ln in lines if not _BANNER.match(ln.rstrip("\n"))))
    return 1
