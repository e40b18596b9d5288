"""TauGrid's group, version and TauCluster name come from settings, for the controller and the index."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from collector.config import load_settings
from collector.correlate import build_index
from collector.kube import normalize
from collector.model import Ref
from collector.settings import TauGridContract
from collector.sources.kube_api import resources_for


def test_contract_moves_the_watched_taugrid_apis(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("taugrid:\n  group: platform.example.com\n  version: v1beta2\n  cluster_name: main\n")
    s = load_settings(cfg)
    tau = {r.kind: r for r in resources_for(s.taugrid) if r.group == "platform.example.com"}
    assert set(tau) == {"TauRun", "TauCluster", "TauWorkspace"}
    assert tau["TauCluster"].path == "/apis/platform.example.com/v1beta2/tauclusters"
    assert not tau["TauCluster"].namespaced and tau["TauRun"].optional
    assert not [r for r in resources_for(s.taugrid) if r.group == "taugrid.io"]


def test_the_index_reads_the_taucluster_the_settings_name() -> None:
    contract = TauGridContract(group="platform.example.com", cluster_name="main")
    t = "2026-01-10T12:00:00Z"
    objs = [
        {"apiVersion": "platform.example.com/v1alpha1", "kind": "TauRun",
         "metadata": {"name": "r", "namespace": "ns", "creationTimestamp": t}, "spec": {"profile": "p"}},
        *({"apiVersion": "platform.example.com/v1alpha1", "kind": "TauCluster",
           "metadata": {"name": name, "creationTimestamp": t}, "status": {}} for name in ("cluster", "main")),
    ]
    index = build_index((n.record for n in (normalize(o, contract) for o in objs) if n.record), contract)
    ev = index.evidence(Ref("TauRun", "ns", "r"))
    assert ev.taucluster is not None and ev.taucluster.ref.name == "main"
    assert ev.root.created == datetime(2026, 1, 10, 12, tzinfo=UTC)
