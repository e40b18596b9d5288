"""Per GPU in the agent's evidence document: when each XID code was first seen (NVML events and the
kernel log, never a tenant's log) and NVML's ECC counts, for the controller's work-at-risk record."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import orjson

from collector.agent import Agent, LogSettings
from collector.agent.evidence import evidence_document
from collector.agent.xids import MAX_FIRST_SEEN, XidCounter
from tests.agent.fake_nvml import FakeDevice, FakeNvml
from tests.agent.test_agent import G, settings, wait
from tests.agent.test_logs import Node


def test_first_seen_keeps_the_earliest_time_per_gpu_and_code_and_is_bounded() -> None:
    c = XidCounter()
    c.add(79, uuid="GPU-a", origin="nvml", at=200.0)
    c.add(79, uuid="GPU-a", origin="kmsg", at=150.0)  # the kernel's record of it, read later
    c.add(79, uuid="GPU-a", origin="nvml", at=300.0)
    c.add(48, uuid="GPU-a", origin="nvml", at=250.0)
    c.add(13, pci="0000:1b:00", origin="kmsg", at=100.0)  # no GPU named: kept under its bus id
    assert c.first_seen() == {"GPU-a": {79: 150.0, 48: 250.0}, "0000:1b:00": {13: 100.0}}
    for code in range(MAX_FIRST_SEEN + 10):
        c.add(code, uuid="GPU-b", origin="nvml", at=1.0)
    assert sum(len(v) for v in c.first_seen().values()) == MAX_FIRST_SEEN
    assert c.counts()[("GPU-b", MAX_FIRST_SEEN + 5, "nvml")] == 1  # past the bound: still counted


def test_the_evidence_document_carries_xid_first_seen_and_ecc_per_gpu(tmp_path: Path) -> None:
    devs = [FakeDevice(uuid=G[i], pci=f"00000000:{0x1b + i:02X}:00.0") for i in range(3)]
    devs[0].ecc = {(1, 0): 2, (1, 1): 5, (0, 0): 177, (0, 1): 900}
    devs[2].ecc = None  # no ECC on this board: NOT_SUPPORTED
    nv = FakeNvml(devs)
    node = Node(tmp_path / "pods")
    # a tenant printing an XID line in its own log: never a GPU's XID
    node.write(node.line("NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus."))
    (tmp_path / "kmsg").write_text("4,7,2000000,-;NVRM: Xid (PCI:0000:1c:00): 94, pid=1, Contained ECC error.\n")
    before = time.time()
    s = replace(settings(tmp_path, tmp_path / "none.sock"), logs=LogSettings(root=tmp_path / "pods", poll_s=0.05,
                                                                              scope="all"))
    with Agent(s, nv=nv) as agent:
        wait(lambda: agent.ready and bool(agent.xids.counts()) and agent.logs.followed == 1)
        nv.inject_xid(devs[1], 48)
        wait(lambda: len(agent.xids.counts()) == 2)
        doc = json.loads(orjson.dumps(evidence_document(agent.snapshot())))
        kmsg_at = next(x.at for x in agent.xids.recent() if x.origin == "kmsg")
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    assert gpus[G[0]]["xid_first_seen"] == {}, "a tenant's log line is not the GPU's XID"
    assert doc["logs"][0]["xids"][0]["code"] == 79  # (it is the container's finding)
    first = gpus[G[1]]["xid_first_seen"]
    assert set(first) == {"94", "48"} and first["94"] == kmsg_at
    assert before <= first["48"] <= time.time()
    assert gpus[G[2]]["xid_first_seen"] == {}
    assert gpus[G[0]]["ecc_uncorrected"] == {"volatile": 2, "aggregate": 5}
    assert gpus[G[0]]["ecc_corrected"] == {"volatile": 177, "aggregate": 900}
    assert gpus[G[2]]["ecc_uncorrected"] is None and gpus[G[2]]["ecc_corrected"] is None
