"""The whole agent: scripted NVML, a real gRPC pod-resources server, real CRI files and a kmsg file,
read over HTTP as Prometheus and the controller read it; the degraded modes; the process itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.agent import Agent, AgentSettings, HangSettings, LogSettings
from collector.sources.agents import AgentEndpoint, AgentReader
from tests.agent.fake_nvml import FakeDevice, FakeNvml
from tests.agent.kubelet import PodResourcesServer
from tests.agent.test_logs import Node
from tests.netutil import free_port

EXE = str(Path(sys.executable).with_name("taugrid-evidence"))
G = [f"GPU-7e1f0c2a-0000-0000-0000-00000000000{i}" for i in range(3)]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def wait(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def settings(tmp: Path, socket: Path, **kw: object) -> AgentSettings:
    return AgentSettings(
        node="gpu-node-1", sample_interval_s=0.05, podresources_socket=socket, podresources_interval_s=0.1,
        kmsg_path=tmp / "kmsg", state_dir=tmp / "state",
        hang=HangSettings(sustain_s=0.3),
        logs=LogSettings(root=tmp / "pods", poll_s=0.05), **kw)  # type: ignore[arg-type]


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        out[name] = [(s.labels, s.value) for s in fam.samples if not s.name.endswith("_created")]
    return out


def test_agent_serves_gpu_attribution_xids_hangs_and_logs(tmp_path: Path) -> None:
    devs = [FakeDevice(uuid=G[i], pci=f"00000000:{0x1b + i:02X}:00.0") for i in range(3)]
    devs[0].util, devs[0].power_mw = 100, 60_000  # busy and cold: a hung collective
    devs[1].util, devs[1].power_mw = 98, 600_000  # busy and working
    nv = FakeNvml(devs)
    node = Node(tmp_path / "pods")
    node.write(*node.steps(1, 5))
    (tmp_path / "kmsg").write_text("4,7,2000000,-;NVRM: Xid (PCI:0000:1c:00): 79, pid=0, GPU has fallen off the bus.\n"
                                   "complete garbage\n")
    pods = [("research", "llm-worker-0", [("trainer", "nvidia.com/gpu", [G[0], G[1]])])]
    with PodResourcesServer(pods) as kubelet, Agent(settings(tmp_path, kubelet.socket), nv=nv) as agent:
        port = agent.serve("127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        wait(lambda: get(base + "/readyz")[0] == 200)
        wait(lambda: agent.attribution.up and agent.logs.followed == 1)
        nv.inject_xid(devs[2], 48)
        wait(lambda: len(agent.xids.counts()) == 2)
        time.sleep(0.4)  # past the hang sustain window
        code, text = get(base + "/metrics")
        assert code == 200
        fam = families(text)
        util = {s[0]["uuid"]: s for s in fam["taugrid_gpu_utilization_ratio"]}
        assert util[G[0]][0] == {"gpu": "0", "uuid": G[0], "pod": "llm-worker-0", "namespace": "research",
                                 "container": "trainer"} and util[G[0]][1] == 1.0
        assert util[G[2]][0]["pod"] == "" and util[G[2]][0]["gpu"] == "2"
        hang = {s[0]["uuid"]: s[1] for s in fam["taugrid_gpu_hang_hint"]}
        assert hang == {G[0]: 1.0, G[1]: 0.0, G[2]: 0.0}
        xids = {(s[0]["uuid"], s[0]["code"], s[0]["origin"]): s[1] for s in fam["taugrid_gpu_xid_errors_total"]}
        assert xids == {(G[1], "79", "kmsg"): 1.0, (G[2], "48", "nvml"): 1.0}
        assert {s[0]["code"] for s in fam["taugrid_gpu_xid_info"]} == {"79", "48"}
        assert fam["taugrid_agent_kmsg_malformed_total"][0][1] == 1.0
        assert fam["taugrid_agent_nvml_up"] == [({"state": "ok"}, 1.0)]
        assert fam["taugrid_agent_podresources_up"][0][1] == 1.0
        assert fam["taugrid_agent_log_containers"][0][1] == 1.0
        assert {s[0]["pod"] for s in fam["taugrid_gpu_allocation"]} == {"llm-worker-0"}

        code, body = get(base + "/evidence")
        doc = json.loads(body)
        assert code == 200 and doc["version"] == 1 and doc["node"] == "gpu-node-1"
        g0 = next(g for g in doc["gpus"] if g["uuid"] == G[0])
        assert g0["hang_hint"] is True and g0["pods"] == [{"namespace": "research", "pod": "llm-worker-0",
                                                          "container": "trainer", "resource": "nvidia.com/gpu"}]
        (lg,) = doc["logs"]
        assert (lg["namespace"], lg["pod"], lg["container"]) == ("research", "llm-worker-0", "trainer")
        assert [s[0] for s in lg["samples"]] == [1, 2, 3, 4, 5] and lg["format"] == "megatron"
        assert "iteration" not in body, "parsed samples only, never raw lines"
        assert {x["code"] for x in doc["xids"]} == {79, 48}
        # asked for version 2, as the controller's reader asks: the GPUs column by column, the same evidence
        v2 = json.loads(get(base + "/evidence?version=2")[1])
        assert v2["version"] == 2 and v2["gpus"]["uuid"] == [g["uuid"] for g in doc["gpus"]]
        assert set(v2["gpus"]) == set(doc["gpus"][0]) and v2["logs"] and v2["xids"]
        # version 3, as the controller's reader asks: the columns it reads, no allocation the GPUs say
        v3 = json.loads(get(base + "/evidence?version=3")[1])
        assert v3["version"] == 3 and v3["gpus"]["uuid"] == v2["gpus"]["uuid"] and "name" not in v3["gpus"]
        assert v3["allocations"] == [a for a in doc["allocations"] if a["device"] not in v2["gpus"]["uuid"]]
        # version 4, what the controller's reader asks: the pod's GPUs packed, the one with an XID (G[1])
        # keeps the pod's GPUs in the columns
        v4 = json.loads(get(base + "/evidence?version=4")[1])
        assert v4["version"] == 4 and v4["records"] == [] and v4["gpus"]["uuid"] == v3["gpus"]["uuid"]
        # a reader of a later release names the versions it reads: the newest this agent knows of them
        assert [json.loads(get(base + f"/evidence?version={v}")[1])["version"] for v in ("5,4", "5,3,2", "5", "4,x")] \
            == [4, 3, 1, 4]
        rep = AgentReader(lambda: datetime.now(UTC)).read(AgentEndpoint("gpu-node-1", "agent-0", base))
        (ev,) = rep.gpus
        assert (ev.namespace, ev.pod, ev.containers) == ("research", "llm-worker-0", ("trainer",))
        assert [d.uuid for d in ev.devices] == [G[0], G[1]] and ev.devices[0].hang_hint is True
        assert ev.devices[1].xids == (79,) and not rep.problems

        # a GPU falls off the bus: marked lost, the others keep sampling
        devs[1].lost = True
        wait(lambda: any(r.lost for r in agent._gpus))
        fam = families(get(base + "/metrics")[1])
        lost = {s[0]["uuid"]: s[1] for s in fam["taugrid_gpu_lost"]}
        assert lost == {G[0]: 0.0, G[1]: 1.0, G[2]: 0.0}
        assert G[0] in {s[0]["uuid"] for s in fam["taugrid_gpu_power_watts"]}
        assert get(base + "/healthz")[0] == 200
        assert get(base + "/nope")[0] == 404


def test_no_nvml_still_serves_logs_and_status(tmp_path: Path) -> None:
    node = Node(tmp_path / "pods")
    node.write(*node.steps(1, 3))
    s = settings(tmp_path, tmp_path / "no-kubelet.sock", nvml_retry_s=3600)
    s = AgentSettings(**{**{f: getattr(s, f) for f in s.__dataclass_fields__},  # type: ignore[arg-type]
                         "logs": LogSettings(root=tmp_path / "pods", scope="all", poll_s=0.05)})
    with Agent(s, nv=FakeNvml([], library_missing=True)) as agent:
        port = agent.serve("127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        wait(lambda: get(base + "/readyz")[0] == 200)
        wait(lambda: agent.logs.followed == 1 and agent.attribution.errors > 0)
        code, text = get(base + "/healthz?verbose")
        assert code == 200 and "nvml: no NVML" in text and "does not exist" in text
        doc = json.loads(get(base + "/evidence")[1])
        assert doc["nvml"]["state"] == "no-nvml" and doc["gpus"] == []
        assert doc["podresources"]["up"] is False and "does not exist" in doc["podresources"]["error"]
        assert [s[0] for s in doc["logs"][0]["samples"]] == [1, 2, 3]
        fam = families(get(base + "/metrics")[1])
        assert fam["taugrid_agent_nvml_up"] == [({"state": "no-nvml"}, 0.0)]
        assert fam["taugrid_gpu_utilization_ratio"] == []


def test_agent_module_does_not_import_ray() -> None:
    code = "import sys, collector.agent, collector.agent.agent; sys.exit(1 if 'ray' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_agent_command_loads_neither_ray_nor_the_controller() -> None:
    """`taugrid-evidence agent` (collector.entry) keeps the node's process small."""
    code = ("import sys; sys.argv = ['taugrid-evidence', 'agent', '--help']\n"
            "from collector.entry import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in ('ray', 'kubernetes', 'collector.controller', 'collector.cli') if m in sys.modules]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--pod-resources-socket" in r.stdout


def test_controller_command_loads_no_agent_module() -> None:
    """The controller's CLI registers `agent` without importing the agent's modules (gRPC, protobuf, h2)."""
    code = ("import sys, collector.cli, collector.controller\n"
            "bad = [m for m in sys.modules if m.startswith(('collector.agent.', 'google.protobuf', 'h2'))\n"
            "       and m != 'collector.agent.command']\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    code = "from collector.agent import Agent, HangSettings, run_agent; print(Agent.__name__, run_agent.__name__)"
    r = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True, text=True)
    assert r.stdout.split() == ["Agent", "run_agent"], r.stderr


def test_agent_process_without_a_gpu(tmp_path: Path) -> None:
    """The real command on this GPU-less machine: real pynvml says no NVML; logs are served; SIGTERM stops it."""
    node = Node(tmp_path / "pods")
    node.write(*node.steps(1, 3))
    port = free_port()
    proc = subprocess.Popen(
        [EXE, "agent", "--address", f"127.0.0.1:{port}", "--log-root", str(tmp_path / "pods"), "--log-scope", "all",
         "--kmsg", str(tmp_path / "no-kmsg"), "--pod-resources-socket", str(tmp_path / "kubelet.sock"),
         "--state-dir", str(tmp_path / "state"), "--node", "n1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        wait(lambda: get(base + "/readyz")[0] == 200 or proc.poll() is not None, timeout=30)
        assert proc.poll() is None
        wait(lambda: bool(json.loads(get(base + "/evidence")[1])["logs"]), timeout=10)
        doc = json.loads(get(base + "/evidence")[1])
        assert doc["nvml"]["state"] == "no-nvml" and doc["node"] == "n1"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    lines = [json.loads(x) for x in err.decode().splitlines() if x.startswith("{")]
    assert any("no NVML" in x["msg"] for x in lines), err.decode()[-2000:]


def test_row_remap_pending_and_its_xid63_on_one_gpu(tmp_path: Path, fixtures: Path) -> None:
    """A real `nvidia-smi -q` capture (row remap pending, 177 corrected DRAM errors) scripted into NVML,
    and the matching kernel XID 63 line: both land on the same GPU, joined by its PCI bus id."""
    import re

    text = (fixtures / "xid_nvsmi" / "nvidia_smi_q_a100_row_remap_pending_xid63_ml_engineering.txt").read_text()

    def field(name: str, after: str = "") -> str:
        m = re.search(rf"{after}[\s\S]*?{name}\s*: (\S+)", text)
        assert m, name
        return m.group(1)

    pci = re.search(r"^GPU (\S+)", text, re.M).group(1)  # type: ignore[union-attr]
    dev = FakeDevice(uuid="GPU-5269b708-678a-b1a8-60f0-c90406537486", pci=pci, name=field("Product Name"),
                     ecc={(0, 0): int(field("DRAM Correctable", "Volatile")),
                          (0, 1): int(field("DRAM Correctable", "Aggregate")),
                          (1, 0): int(field("DRAM Uncorrectable", "Volatile")),
                          (1, 1): int(field("DRAM Uncorrectable", "Aggregate"))},
                     rows=(int(field("Correctable Error")), int(field("Uncorrectable Error")),
                           int(field("Pending") == "Yes"), int(field("Remapping Failure Occurred") == "Yes")))
    xid = (fixtures / "xid_nvsmi" / "xid63_row_remapper_line_ml_engineering.txt").read_text().strip()
    (tmp_path / "kmsg").write_text(f"3,1,5000000,-;{xid}\n")
    with Agent(settings(tmp_path, tmp_path / "none.sock"), nv=FakeNvml([dev])) as agent:
        wait(lambda: agent.ready and bool(agent.xids.counts()))
        fam = families(generate_latest(agent.registry).decode())
    assert fam["taugrid_gpu_row_remap_pending"][0][1] == 1.0
    rows = {s[0]["error_type"]: s[1] for s in fam["taugrid_gpu_remapped_rows_total"]}
    assert rows == {"correctable": 1.0, "uncorrectable": 0.0}
    ecc = {(s[0]["error_type"], s[0]["scope"]): s[1] for s in fam["taugrid_gpu_ecc_errors_total"]}
    assert ecc[("corrected", "volatile")] == 177.0 and ecc[("uncorrected", "aggregate")] == 0.0
    (x,) = fam["taugrid_gpu_xid_errors_total"]
    assert x[0] == {"uuid": dev.uuid, "code": "63", "origin": "kmsg"} and x[1] == 1.0


def test_the_agent_serves_on_loopback_unless_told_otherwise_and_then_only_with_a_token(tmp_path: Path) -> None:
    from collector.agent.agent import exposure_problem
    from collector.agent.command import agent as agent_command

    assert next(p for p in agent_command.params if p.name == "address").default == "127.0.0.1:9402"
    for address in ("127.0.0.1:9402", ":9402", "localhost:9402", "[::1]:9402"):
        assert exposure_problem(AgentSettings(address=address)) == "", address
    for address in ("0.0.0.0:9402", "[::]:9402", "10.0.0.7:9465", "node-1:9402"):
        assert "--token-file" in exposure_problem(AgentSettings(address=address)), address
        assert exposure_problem(AgentSettings(address=address, token_file=tmp_path / "token")) == ""
        assert exposure_problem(AgentSettings(address=address, allow_unauthenticated=True)) == ""
