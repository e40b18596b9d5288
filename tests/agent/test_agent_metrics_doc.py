"""docs/metrics.md's node-agent rows and a populated agent exposition agree, in both directions."""

from __future__ import annotations

import re
import time
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.agent import Agent
from tests.agent.fake_nvml import FakeDevice, FakeNvml
from tests.agent.kubelet import PodResourcesServer
from tests.agent.test_agent import settings, wait
from tests.agent.test_logs import Node

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented(text: str) -> tuple[dict[str, tuple[str, frozenset[str]]], set[str]]:
    """Agent families → (type, labels); every documented label name (any table)."""
    fams: dict[str, tuple[str, frozenset[str]]] = {}
    labels: set[str] = set()
    header: list[str] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = [c.lower() for c in cells]
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        row = dict(zip(header, cells, strict=False))
        name = re.match(r"`([^`]+)`", cells[0])
        if name is None:
            continue
        if "family" in row and row.get("component") == "agent":
            fams[name.group(1)] = (row["type"], frozenset(x.strip() for x in row["labels"].split(",") if x.strip()))
        elif "label" in row:
            labels.add(name.group(1))
    return fams, labels


def exported(tmp_path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    devs = [FakeDevice(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000", gpm_sm=50.0, nvlink_kib=(1, 2)),
            FakeDevice(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000", pci="00000000:1C:00.0", mig_enabled=True,
                       mig=[FakeDevice(uuid="MIG-bbbbbbbb-0000-0000-0000-000000000000")])]
    nv = FakeNvml(devs)
    node = Node(tmp_path / "pods")
    node.write(*node.steps(1, 2), b"not cri\n")
    (tmp_path / "kmsg").write_text("4,1,1000,-;NVRM: Xid (PCI:0000:1c:00): 79, pid=0\n")
    pods = [("research", "llm-worker-0", [("trainer", "nvidia.com/gpu", [devs[0].uuid])])]
    with PodResourcesServer(pods) as kubelet, Agent(settings(tmp_path, kubelet.socket), nv=nv) as agent:
        wait(lambda: agent.ready and agent.attribution.up and agent.logs.followed == 1 and bool(agent.xids.counts()))
        time.sleep(0.2)  # a second GPM (and NVLink counter) sample: SM activity, NVLink throughput
        text = generate_latest(agent.registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        out[name] = (fam.type, frozenset(k for s in fam.samples for k in s.labels))
        assert fam.samples, f"{name}: populate it in this test so its labels are checked"
    return out


def test_agent_families_documented_both_ways(tmp_path: Path) -> None:
    fams, labels = documented(DOC.read_text())
    exp = exported(tmp_path)
    problems = []
    for name, (typ, labs) in sorted(exp.items()):
        if name not in fams:
            problems.append(f"{name}: exported by the agent but not documented for it")
            continue
        if fams[name] != (typ, labs):
            doc_type, doc_labels = fams[name]
            problems.append(f"{name}: exported {typ} {sorted(labs)}, documented {doc_type} {sorted(doc_labels)}")
        problems += [f"{name}: label {lab!r} missing from a labels table" for lab in sorted(labs - labels)]
    problems += [f"{name}: documented for the agent but not exported" for name in sorted(set(fams) - set(exp))]
    assert not problems, "\n".join(problems)
