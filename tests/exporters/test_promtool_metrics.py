"""`promtool check metrics` (Prometheus's own linter: names, units, counter suffixes, HELP) is clean
on what a real scrape of the controller and of a node agent returns over HTTP."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import urllib.request
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.agent import Agent
from collector.controller import Controller
from collector.settings import Settings
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.run import start_simulation
from tests.agent.fake_nvml import FakeDevice, FakeNvml
from tests.agent.kubelet import PodResourcesServer
from tests.agent.test_agent import settings as agent_settings
from tests.agent.test_agent import wait


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: apt-get install -y --no-install-recommends prometheus", pytrace=False)
    return path


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        return bytes(r.read())


def check_metrics(text: bytes) -> str:
    """promtool's findings (empty when clean); it reads the exposition on stdin."""
    result = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, timeout=60)
    out = (result.stdout + result.stderr).decode()
    assert (result.returncode == 0) == (out.strip() == ""), out
    return out.strip()


def naming_problems(text: bytes) -> list[str]:
    """What promtool leaves out: `_total` inside a non-counter's name (`x_memory_total_bytes` passes
    promtool, which only looks at the suffix), and cumulative device error counts as anything but
    counters."""
    problems = []
    for fam in text_string_to_metric_families(text.decode()):
        if fam.type != "counter" and "_total" in fam.name:
            problems.append(f"{fam.name}: a {fam.type} named like a counter")
        if fam.name.startswith("taugrid_gpu_") and re.search(r"_errors|_remapped_rows", fam.name) \
                and fam.type != "counter":
            problems.append(f"{fam.name}: a cumulative error count exposed as a {fam.type}")
    return problems


def test_promtool_finds_what_it_should() -> None:
    """The linter has teeth: a gauge named like a counter and a counter without `_total` are named."""
    bad = (b"# HELP x_memory_total gauge named as a counter\n# TYPE x_memory_total gauge\nx_memory_total 1\n"
           b"# HELP x_errors a counter without its suffix\n# TYPE x_errors counter\nx_errors 1\n")
    out = check_metrics(bad)
    assert "x_memory_total" in out and "x_errors" in out
    gauges = (b"# HELP x_memory_total_bytes size\n# TYPE x_memory_total_bytes gauge\nx_memory_total_bytes 1\n"
              b"# HELP taugrid_gpu_ecc_errors count\n# TYPE taugrid_gpu_ecc_errors gauge\ntaugrid_gpu_ecc_errors 1\n")
    assert check_metrics(gauges) == ""  # what promtool lets through ...
    assert len(naming_problems(gauges)) == 2  # ... and this test does not


def test_a_scrape_of_the_controller_is_clean() -> None:
    session = start_simulation(None, "127.0.0.1:0", 20.0)
    base = Settings()
    ctl = Controller(KubeApi(api_client_for(session.base_url)),
                     replace(base, controller=replace(base.controller, leader_election=False,
                                                      tick=timedelta(seconds=1))), session.engine.clock.now)
    try:
        port = ctl.serve("127.0.0.1", 0)
        ctl.open()
        deadline = time.monotonic() + 30
        while b"taugrid_run_claim_state{" not in (text := scrape(f"http://127.0.0.1:{port}/metrics")):
            assert time.monotonic() < deadline, "the controller never exported a run"
            time.sleep(0.5)
    finally:
        ctl.close()
        session.close()
    assert b"taugrid_collector_build_info" in text
    assert check_metrics(text) == ""
    assert naming_problems(text) == []


def test_a_scrape_of_a_node_agent_is_clean(tmp_path: Path) -> None:
    devs = [FakeDevice(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000", gpm_sm=50.0),
            FakeDevice(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000", pci="00000000:1C:00.0", mig_enabled=True,
                       mig=[FakeDevice(uuid="MIG-bbbbbbbb-0000-0000-0000-000000000000")])]
    (tmp_path / "kmsg").write_text("4,1,1000,-;NVRM: Xid (PCI:0000:1c:00): 79, pid=0\n")
    pods = [("research", "llm-worker-0", [("trainer", "nvidia.com/gpu", [devs[0].uuid])])]
    with PodResourcesServer(pods) as kubelet, \
            Agent(agent_settings(tmp_path, kubelet.socket), nv=FakeNvml(devs)) as agent:
        wait(lambda: agent.ready and agent.attribution.up and bool(agent.xids.counts()))
        port = agent.serve("127.0.0.1", 0)
        text = scrape(f"http://127.0.0.1:{port}/metrics")
    # every family the agent has, populated: the per-GPU ones, the device error counters, XIDs
    for family in (b"taugrid_gpu_utilization_ratio{", b"taugrid_gpu_xid_errors_total{",
                   b"taugrid_gpu_memory_capacity_bytes{", b"taugrid_gpu_ecc_errors_total{",
                   b"taugrid_gpu_nvlink_errors_total{", b"taugrid_gpu_allocation{"):
        assert family in text, family
    assert check_metrics(text) == ""
    assert naming_problems(text) == []
