"""GPUs allocated through ResourceClaims (DRA), MIG instances and shared GPUs, attributed by the whole
agent: a real gRPC pod-resources server returning `dynamic_resources`, the API simulator serving
ResourceSlices over HTTP, the scripted NVML; read as Prometheus and the controller read it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from collector.agent import Agent
from collector.agent.podresources import PodResourcesClient
from collector.agent.podresources.dra import MAX_ALLOCATIONS, MAX_NAME
from collector.sources.agents import AgentEndpoint, parse_evidence
from kubesim.server import Simulator
from tests.agent.fake_nvml import FakeDevice, FakeNvml
from tests.agent.kubelet import PodResourcesServer
from tests.agent.test_agent import families, get, settings, wait

NODE = "gpu-node-1"
G = [f"GPU-5d2c9e41-0000-0000-0000-00000000000{i}" for i in range(3)]
M = [f"MIG-8a7b6c5d-0000-0000-0000-00000000000{i}" for i in range(2)]
UID = "3f1e2d4c-1111-2222-3333-444455556666"  # a ResourceClaim's UID, as the NVIDIA driver's CDI names carry it
MIG0, MIG1 = "gpu-1-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-1"


def nv(device: str, **kw: Any) -> dict[str, Any]:
    """A device of the NVIDIA DRA driver as a 1.31+ kubelet reports it."""
    return {"driver": "gpu.nvidia.com", "pool": NODE, "device": device,
            "cdi": [f"k8s.gpu.nvidia.com/claim={UID}-{device}"], **kw}


def gpus() -> list[FakeDevice]:
    devs = [FakeDevice(uuid=G[0], pci="00000000:1B:00.0", util=97, minor=0),
            FakeDevice(uuid=G[1], pci="00000000:1C:00.0", util=None, minor=1, mig_enabled=True, gpm_sm=50.0,
                       mig=[FakeDevice(uuid=M[0], mem_used=3 << 30, mem_total=10 << 30, gi=1, gpm_sm=20.0,
                                       profile_id=19, placement_start=0),
                            # NVML places it where MIG1's name does not say: only the ResourceSlice names it
                            FakeDevice(uuid=M[1], mem_used=7 << 30, mem_total=10 << 30, gi=2, gpm_sm=80.0,
                                       profile_id=19, placement_start=5)]),
            FakeDevice(uuid=G[2], pci="00000000:1D:00.0", util=55, minor=2)]
    return devs


def slice_obj(name: str, node: str, devices: dict[str, str], driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    pool = {"name": node, "generation": 1, "resourceSliceCount": 1}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": pool,
                     "devices": [{"name": d, "attributes": {"uuid": {"string": u}}} for d, u in devices.items()]}}


@pytest.fixture
def api() -> Iterator[Simulator]:
    sim = Simulator()
    sim.start()
    rt = sim.registry.by_key("resource.k8s.io/v1/resourceslices")
    sim.store.create(rt, "", slice_obj(f"{NODE}-gpu", NODE, {"gpu-0": G[0], MIG0: M[0], MIG1: M[1]}))
    # another node's driver names its devices alike: never this node's
    sim.store.create(rt, "", slice_obj("gpu-node-2-gpu", "gpu-node-2",
                                       {"gpu-0": "GPU-99999999-0000-0000-0000-000000000000"}))
    yield sim
    sim.close()


def test_list_reads_resourceclaim_devices_of_gpu_drivers() -> None:
    pods = [
        ("research", "llm-0", [("trainer", "", [], [("research", "llm-0-gpus", [nv("gpu-0"), nv(MIG0)])])]),
        # a driver that writes the UUID in its CDI name
        ("research", "by-uuid", [("main", "", [], [("research", "c2", [
            {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-2",
             "cdi": [f"k8s.gpu.nvidia.com/device={G[2]}"]}])])]),
        # a kubelet before 1.31: CDI names only
        ("research", "old-kubelet", [("main", "", [], [("research", "c3", [
            {"cdi": [f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"]}])])]),
        # IMEX channels of the same vendor are not GPUs
        ("infra", "imex", [("app", "", [], [("infra", "cd", [
            {"driver": "compute-domain.nvidia.com", "pool": NODE, "device": "channel-0"}])])]),
        # consumable capacity: a share of a GPU
        ("team-b", "mps-0", [("a", "", [], [("team-b", "mps", [nv("gpu-0", share_id="6a1c")])])]),
        # device plugin and claim side by side in one container
        ("team-c", "mixed", [("a", "nvidia.com/gpu", [f"{G[1]}::3"], [("team-c", "x", [nv("gpu-2")])])]),
    ]
    with PodResourcesServer(pods) as kubelet:  # type: ignore[arg-type]
        client = PodResourcesClient(kubelet.socket, node=NODE)
        try:
            allocs = client.list()
        finally:
            client.close()
    by = {(a.pod, a.dra_device or a.device): a for a in allocs}
    assert set(by) == {("llm-0", "gpu-0"), ("llm-0", MIG0), ("by-uuid", "gpu-2"), ("old-kubelet", "gpu-0"),
                       ("mps-0", "gpu-0"), ("mixed", G[1]), ("mixed", "gpu-2")}
    a = by[("llm-0", "gpu-0")]
    assert (a.claim, a.driver, a.pool, a.resource, a.container) == ("research/llm-0-gpus", "gpu.nvidia.com", NODE,
                                                                     "gpu.nvidia.com", "trainer")
    assert not a.resolved and a.device == f"gpu.nvidia.com/{NODE}/gpu-0", "named by minor: resolved later"
    assert by[("by-uuid", "gpu-2")].resolved and by[("by-uuid", "gpu-2")].device == G[2]
    old = by[("old-kubelet", "gpu-0")]
    assert (old.driver, old.pool, old.dra_device) == ("gpu.nvidia.com", "", "gpu-0")
    assert old.device == f"gpu.nvidia.com/{NODE}/gpu-0", "unnamed, it is still this node's device, not another's"
    assert by[("mps-0", "gpu-0")].shared and not by[("llm-0", "gpu-0")].shared
    assert by[("mixed", G[1])].shared, "a time-slicing replica is a share"
    assert client.rejected == {}


def test_agent_attributes_claim_gpus_mig_instances_and_says_when_a_gpu_is_shared(tmp_path: Path,
                                                                                 api: Simulator) -> None:
    pods = [
        ("research", "llm-0", [("trainer", "", [], [("research", "llm-0-gpus", [nv("gpu-0"), nv(MIG0)])]),
                               ("sidecar", "", [], [("research", "llm-0-gpus", [nv("gpu-0")])])]),
        ("team-b", "small-0", [("main", "", [], [("team-b", "small", [nv(MIG1)])])]),
        # time-slicing through the device plugin: two replicas of one GPU
        ("team-c", "ts-0", [("a", "nvidia.com/gpu", [f"{G[2]}::0"])]),
        ("team-c", "ts-1", [("a", "nvidia.com/gpu", [f"{G[2]}::1"])]),
    ]
    with PodResourcesServer(pods) as kubelet, \
            Agent(settings(tmp_path, kubelet.socket, api_server=api.base_url), nv=FakeNvml(gpus())) as agent:
        port = agent.serve("127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        wait(lambda: agent.ready and agent.attribution.up and agent.samples > 1
             and all(a.resolved for a in agent.attribution.allocations()))
        fam = families(get(base + "/metrics")[1])
        doc = json.loads(get(base + "/evidence")[1])
        health = get(base + "/healthz?verbose")[1]

    def holder(family: str) -> dict[str, tuple[str, str, str]]:
        return {lab["uuid"]: (lab["namespace"], lab["pod"], lab["container"]) for lab, _ in fam[family]}

    # a claim's whole GPU (named gpu-<minor>) and MIG instances (named in the ResourceSlice)
    assert holder("taugrid_gpu_utilization_ratio")[G[0]] == ("research", "llm-0", "sidecar")  # first container
    mem = holder("taugrid_gpu_memory_used_bytes")
    assert mem[M[0]] == ("research", "llm-0", "trainer") and mem[M[1]] == ("team-b", "small-0", "main")
    assert mem[G[1]] == ("", "", ""), "the MIG parent is no one pod's"
    sm = {lab["uuid"]: (lab["pod"], v) for lab, v in fam["taugrid_gpu_sm_active_ratio"]}
    assert sm[M[0]] == ("llm-0", 0.2) and sm[M[1]] == ("small-0", 0.8), "each instance's own activity, its pod's"
    assert sm[G[1]] == ("", 0.5)
    # shared: no pod credited with the GPU's readings; the count and the holders say who shares it
    assert holder("taugrid_gpu_utilization_ratio")[G[2]] == ("", "", "")
    sharers = {lab["uuid"]: v for lab, v in fam["taugrid_gpu_sharers"]}
    assert sharers == {G[0]: 1.0, G[1]: 0.0, M[0]: 1.0, M[1]: 1.0, G[2]: 2.0}
    alloc = {(lab["pod"], lab["container"], lab["uuid"]): lab for lab, _ in fam["taugrid_gpu_allocation"]}
    assert {k for k in alloc if k[2] == G[2]} == {("ts-0", "a", G[2]), ("ts-1", "a", G[2])}
    assert all(lab["shared"] == "true" and lab["resource_name"] == "nvidia.com/gpu" and lab["resource_claim"] == ""
               for k, lab in alloc.items() if k[2] == G[2])
    llm = alloc[("llm-0", "trainer", M[0])]
    assert (llm["resource_name"], llm["resource_claim"], llm["shared"]) == ("gpu.nvidia.com", "research/llm-0-gpus",
                                                                            "false")
    assert alloc[("llm-0", "sidecar", G[0])]["shared"] == "false", "two containers of one pod are one holder"
    assert fam["taugrid_agent_dra_unresolved_devices"][0][1] == 0.0
    assert "dra: ok; ResourceSlices: 3 devices" in health

    g2 = next(g for g in doc["gpus"] if g["uuid"] == G[2])
    assert g2["shared"] is True and g2["sharers"] == 2 and {p["pod"] for p in g2["pods"]} == {"ts-0", "ts-1"}
    m1 = next(g for g in doc["gpus"] if g["uuid"] == M[1])
    assert m1["shared"] is False and m1["parent_uuid"] == G[1] and m1["pods"][0]["pod"] == "small-0"
    a = next(x for x in doc["allocations"] if x["device"] == M[0])
    assert a["claim"] == "research/llm-0-gpus" and a["dra_device"] == MIG0 and a["resolved"] is True

    # the controller's reading of the document: per pod, its own devices; the shared GPU marked
    report = parse_evidence(doc, AgentEndpoint(NODE, "agent-0", "http://agent"), datetime.now(UTC))
    ev = {(e.namespace, e.pod): e for e in report.gpus}
    assert {d.uuid for d in ev[("research", "llm-0")].devices} == {G[0], M[0]}
    assert {d.uuid for d in ev[("team-b", "small-0")].devices} == {M[1]}
    assert all(d.shared for d in ev[("team-c", "ts-0")].devices)
    assert not any(d.lost for e in report.gpus for d in e.devices)


def test_without_resourceslices_nvml_names_gpus_and_mig_instances_and_the_rest_is_held_not_lost(
        tmp_path: Path) -> None:
    """No API server configured: a whole GPU is named by its minor number, a MIG instance by its
    parent's minor, GPU instance profile id and placement (what the NVIDIA driver names it by); a
    device neither names is held by the pod but not named: counted, never called lost."""
    pods = [("research", "llm-0", [("trainer", "", [], [("research", "llm-0-gpus",
                                                         [nv("gpu-0"), nv(MIG0), nv(MIG1)])])])]
    with PodResourcesServer(pods) as kubelet, \
            Agent(settings(tmp_path, kubelet.socket), nv=FakeNvml(gpus())) as agent:  # type: ignore[arg-type]
        port = agent.serve("127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        wait(lambda: agent.ready and agent.attribution.up and agent.samples > 1
             and sum(a.resolved for a in agent.attribution.allocations()) == 2)
        fam = families(get(base + "/metrics")[1])
        doc = json.loads(get(base + "/evidence")[1])
        health = get(base + "/healthz?verbose")[1]
    assert fam["taugrid_agent_dra_unresolved_devices"][0][1] == 1.0
    assert "dra: 1 claim devices without a GPU UUID; ResourceSlices: off (--resource-slices)" in health
    assert {lab["uuid"] for lab, _ in fam["taugrid_gpu_allocation"]} == {G[0], M[0], f"gpu.nvidia.com/{NODE}/{MIG1}"}
    assert {lab["uuid"]: lab["pod"] for lab, _ in fam["taugrid_gpu_utilization_ratio"]}[G[0]] == "llm-0"
    assert {lab["uuid"]: lab["pod"] for lab, _ in fam["taugrid_gpu_memory_used_bytes"]}[M[0]] == "llm-0"
    report = parse_evidence(doc, AgentEndpoint(NODE, "agent-0", "http://agent"), datetime.now(UTC))
    (e,) = report.gpus
    assert {d.uuid: d.lost for d in e.devices} == {G[0]: False, M[0]: False, f"gpu.nvidia.com/{NODE}/{MIG1}": False}


def test_one_claim_shared_by_two_pods_is_shared(tmp_path: Path) -> None:
    pods = [("team-d", f"infer-{i}", [("srv", "", [], [("team-d", "shared-gpu", [nv("gpu-2")])])]) for i in range(2)]
    with PodResourcesServer(pods) as kubelet, \
            Agent(settings(tmp_path, kubelet.socket), nv=FakeNvml(gpus())) as agent:  # type: ignore[arg-type]
        wait(lambda: agent.ready and agent.attribution.up and agent.samples > 1
             and all(a.resolved for a in agent.attribution.allocations()))
        from prometheus_client import generate_latest
        fam = families(generate_latest(agent.registry).decode())
    util = {lab["uuid"]: (lab["pod"], v) for lab, v in fam["taugrid_gpu_utilization_ratio"]}
    assert util[G[2]] == ("", 0.55), "one value, once, credited to neither pod"
    assert {lab["uuid"]: v for lab, v in fam["taugrid_gpu_sharers"]}[G[2]] == 2.0
    assert {(lab["pod"], lab["shared"]) for lab, _ in fam["taugrid_gpu_allocation"]} == {("infer-0", "true"),
                                                                                          ("infer-1", "true")}


def test_hostile_names_and_floods_are_bounded_and_counted(tmp_path: Path) -> None:
    huge = "c" * 100_000
    odd = "claim\n\x1b[31mred\x00"
    pods = [
        ("research", "p0", [("trainer", "", [], [
            ("research", huge, [nv("gpu-0" + "A" * 5000)]),
            ("research", odd, [{**nv("gpu-2"), "cdi": [f"k8s.gpu.nvidia.com/claim={UID}-gpu-2"] * 100}]),
            ("research", "nameless", [{"driver": "gpu.nvidia.com", "pool": NODE}]),
        ])]),
        # a flood of device-plugin devices
        ("research", "p1", [("trainer", "nvidia.com/gpu", [f"{G[0]}::{i}" for i in range(MAX_ALLOCATIONS + 500)])]),
    ]
    with PodResourcesServer(pods) as kubelet, \
            Agent(settings(tmp_path, kubelet.socket), nv=FakeNvml(gpus())) as agent:  # type: ignore[arg-type]
        port = agent.serve("127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        wait(lambda: agent.ready and agent.attribution.up
             and any(a.device == G[2] for a in agent.attribution.allocations()))
        code, text = get(base + "/metrics")
        body = get(base + "/evidence")[1]
    allocs = agent.attribution.allocations()
    assert len(allocs) == MAX_ALLOCATIONS
    assert all(len(a.claim) <= 2 * MAX_NAME + 1 and len(a.dra_device) <= MAX_NAME and len(a.device) <= 3 * MAX_NAME + 2
               for a in allocs)
    assert all(a.claim.isprintable() and a.device.isprintable() for a in allocs)
    p0 = {a.dra_device[:5]: a for a in allocs if a.pod == "p0"}
    assert p0["gpu-0"].claim.endswith("\N{HORIZONTAL ELLIPSIS}") and not p0["gpu-0"].resolved
    assert p0["gpu-2"].claim == "research/claim\N{REPLACEMENT CHARACTER}\N{REPLACEMENT CHARACTER}[31mred" \
        "\N{REPLACEMENT CHARACTER}" and p0["gpu-2"].device == G[2], "cleaned, and still resolved by its minor"
    fam = families(text)
    rejected = {lab["reason"]: v for lab, v in fam["taugrid_agent_podresources_rejected_total"]}
    assert rejected["too-long"] >= 2 and rejected["unprintable"] >= 1 and rejected["malformed"] >= 1
    assert rejected["too-many"] >= 500 + 100 - 16
    assert code == 200 and len(text) < 4 << 20 and len(body) < 4 << 20
    assert "\x1b" not in text and "\x1b" not in body and huge not in body
