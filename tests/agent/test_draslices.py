"""ResourceSlices read over HTTP from the API simulator: this node's only, paged, other drivers and
malformed UUIDs left out, the older `basic` shape, and failures named while the last index is kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from collector.agent import draslices
from collector.agent.draslices import ResourceSliceReader, index_slices
from collector.agent.podresources.dra import Allocation, DraResolver
from kubesim.registry import DEFAULT_RESOURCES
from kubesim.server import Simulator
from tests.agent.test_dra import NODE, G, M, slice_obj

DRIVERS = ("gpu.nvidia.com",)


def reader(sim: Simulator, **kw: Any) -> ResourceSliceReader:
    return ResourceSliceReader(sim.base_url, NODE, drivers=DRIVERS, timeout_s=2, **kw)


def test_this_nodes_slices_paged_and_filtered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(draslices, "PAGE", 2)
    sim = Simulator()
    sim.start()
    try:
        rt = sim.registry.by_key("resource.k8s.io/v1/resourceslices")
        uuids = [f"GPU-5d2c9e41-0000-0000-0000-00000000010{i}" for i in range(5)]
        for i in range(5):  # one slice per GPU, as drivers with many devices publish them
            sim.store.create(rt, "", slice_obj(f"{NODE}-{i}", NODE, {f"gpu-{i}": uuids[i]}))
        sim.store.create(rt, "", slice_obj("other", "gpu-node-2", {"gpu-9": G[0]}))
        sim.store.create(rt, "", slice_obj("imex", NODE, {"channel-0": G[1]}, driver="compute-domain.nvidia.com"))
        sim.store.create(rt, "", slice_obj("bad", NODE, {"gpu-7": "not-a-uuid", "gpu-8": "GPU-1234"}))
        r = reader(sim)
        index = r()
        assert index == {("gpu.nvidia.com", NODE, f"gpu-{i}"): uuids[i] for i in range(5)}
        assert r.error == "" and r.reads == 1
        lists = [q for verb, res, q in sim.request_log if res == "resourceslices"]
        assert len(lists) >= 4 and all(q["fieldSelector"] == f"spec.nodeName={NODE}" for q in lists)
        assert r() is index and r.reads == 1, "read again only after the interval"
    finally:
        sim.close()


def test_no_resourceslice_api_and_a_gone_server_are_named_and_the_last_index_kept() -> None:
    sim = Simulator(resources=[rt for rt in DEFAULT_RESOURCES if rt.plural != "resourceslices"])
    sim.start()
    try:
        r = reader(sim, interval_s=0)
        assert r() == {} and "no ResourceSlice API version served" in r.error and r.errors == 1
    finally:
        sim.close()
    sim = Simulator()
    base = sim.start()
    rt = sim.registry.by_key("resource.k8s.io/v1/resourceslices")
    sim.store.create(rt, "", slice_obj("s", NODE, {"gpu-0": G[0]}))
    r = ResourceSliceReader(base, NODE, drivers=DRIVERS, timeout_s=1, interval_s=0)
    assert r() == {("gpu.nvidia.com", NODE, "gpu-0"): G[0]}
    sim.close()
    assert r() == {("gpu.nvidia.com", NODE, "gpu-0"): G[0]}, "a failed read keeps the last good index"
    assert base in r.error and r.errors == 1


def test_v1beta1_basic_attributes_and_qualified_names() -> None:
    doc = {"items": [{"spec": {"driver": "gpu.nvidia.com", "nodeName": NODE, "pool": {"name": NODE}, "devices": [
        {"name": "gpu-0", "basic": {"attributes": {"uuid": {"string": G[0]}}}},
        {"name": "gpu-1-mig-1g10gb-19-0", "attributes": {"gpu.nvidia.com/uuid": {"string": M[0]}}},
        {"name": "x" * 300, "attributes": {"uuid": {"string": G[2]}}},  # past a name's bound
        {"name": "gpu-3", "attributes": {"uuid": {"int": 3}}},
    ]}}], "metadata": {}}
    page = msgspec.json.decode(msgspec.json.encode(doc), type=draslices._SliceList)
    assert index_slices(page.items, NODE, DRIVERS) == {("gpu.nvidia.com", NODE, "gpu-0"): G[0],
                                                       ("gpu.nvidia.com", NODE, "gpu-1-mig-1g10gb-19-0"): M[0]}


def test_resolver_without_a_pool_name_needs_one_match() -> None:
    """A kubelet before 1.31 names no pool: a device name is resolved only where this node's slices
    hold it once; where NVML names the minor, a whole GPU still resolves."""
    def alloc(device: str, pool: str = "") -> Allocation:
        return Allocation("ns", "p", "c", "gpu.nvidia.com", f"gpu.nvidia.com/{pool}/{device}", driver="gpu.nvidia.com",
                          pool=pool, dra_device=device, resolved=False)
    index = {("gpu.nvidia.com", "pool-a", "mig-a"): M[0], ("gpu.nvidia.com", "pool-a", "dup"): G[0],
             ("gpu.nvidia.com", "pool-b", "dup"): G[1]}
    resolver = DraResolver(lambda: {2: G[2]}, lambda: index)
    out = resolver((alloc("mig-a"), alloc("dup"), alloc("dup", "pool-b"), alloc("gpu-2"), alloc("gpu-5")))
    assert [a.device if a.resolved else None for a in out] == [M[0], None, G[1], G[2], None]
    assert resolver.unresolved == 2
    other = Allocation("ns", "p", "c", "gpu.example.com", "x", driver="gpu.example.com", dra_device="gpu-2",
                       resolved=False)
    assert not resolver((other,))[0].resolved, "the minor-number convention is the NVIDIA driver's only"


def test_the_command_reads_slices_only_in_a_cluster_and_when_asked(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from collector.agent.command import agent as agent_command
    from collector.agent.command import in_cluster_api

    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_api(env, tmp_path) == ("https://[fd00::1]:443", tmp_path / "token", tmp_path / "ca.crt")
    assert in_cluster_api({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None
    result = CliRunner().invoke(agent_command, ["--node", NODE, "--resource-slices"],
                                env={"KUBERNETES_SERVICE_HOST": "", "KUBERNETES_SERVICE_PORT": ""})
    assert result.exit_code == 2 and "--resource-slices needs --node and the in-cluster API server" in result.output


def test_a_missing_service_account_is_a_status_not_a_crash(tmp_path: Path) -> None:
    r = ResourceSliceReader("https://127.0.0.1:1", NODE, drivers=DRIVERS, token_file=tmp_path / "token",
                            ca_file=tmp_path / "ca.crt", timeout_s=1)
    assert r() == {} and "ca.crt" in r.error and r.errors == 1


def test_resolver_names_mig_instances_as_the_nvidia_driver_does() -> None:
    """"gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>", looked up in what NVML
    says of each instance; another placement, profile or parent is not that instance."""
    def alloc(device: str) -> Allocation:
        return Allocation("ns", "p", "c", "gpu.nvidia.com", device, driver="gpu.nvidia.com", pool=NODE,
                          dra_device=device, resolved=False)
    resolver = DraResolver(lambda: {}, None, lambda: {(1, 19, 0): M[0], (1, 14, 4): M[1]})
    names = ["gpu-1-mig-1g10gb-19-0", "gpu-1-mig-2g20gb-14-4", "gpu-1-mig-1g10gb-19-3", "gpu-2-mig-1g10gb-19-0",
             "gpu-1-mig-" + "x" * 200 + "-19-0"]
    out = resolver(tuple(alloc(n) for n in names))
    assert [a.device if a.resolved else None for a in out] == [M[0], M[1], None, None, None]
