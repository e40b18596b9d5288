"""One claim engine, two inputs: kubectl's dump of the simulator and the live controller agree."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from collector.cli import main
from collector.model import rfc3339
from collector.sources.kube_api import KubeApi, api_client_for
from kubesim.clock import ManualClock
from kubesim.engine import ScenarioEngine
from kubesim.kubeconfig import write_kubeconfig
from kubesim.scenario import default_scenario_path, load_scenario
from kubesim.server import Simulator, SimulatorSettings
from tests.controller.test_controller import settings, settle, wait_until

CUSTOM_KINDS = "tauruns,tauclusters,tauworkspaces,rayjobs,rayclusters,workloads,localqueues,jobs"


def kubectl(kubeconfig: Path, *args: str, out: Path | None = None) -> None:
    with (out.open("wb") if out else open("/dev/null", "wb")) as fh:  # noqa: SIM115
        proc = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args], stdout=fh,
                              stderr=subprocess.PIPE, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr.decode()


def verdicts(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "claims": {k: (c["asserted"], c["observed"], c["verdict"]) for k, c in run["claims"].items()},
        "blocked": run["blocked"]["stage"] if run["blocked"] else None,
        "finished": run["finished"],
    }


@pytest.mark.parametrize("minutes", [3, 9])
def test_explain_on_a_kubectl_dump_agrees_with_the_live_controller(tmp_path: Path, minutes: int) -> None:
    from collector.controller import Controller

    spec = load_scenario(default_scenario_path())
    clock = ManualClock(spec.start)
    with Simulator(clock=clock, settings=SimulatorSettings(seed=spec.seed, bookmark_interval_s=0.5)) as sim:
        url = sim.start()
        engine = ScenarioEngine(spec, url, clock=clock)
        engine.step_to(minutes * 60)
        assert engine.errors == []
        ctl = Controller(KubeApi(api_client_for(url)), settings(log_poll_interval=timedelta(seconds=0.2)), clock.now)
        ctl.open()
        try:
            wait_until(ctl.ready.is_set)
            # Every running container's log has been read at least once.
            wait_until(lambda: ctl.sources["logs"].targets.current and all(
                any(sig.source == c for sig in ctl.index.evidence(rc.ref).signals)
                for rc in ctl.claims.values() for pod, c, *_ in ctl.sources["logs"].targets.current
                if ctl.index.root_of(pod) == rc.ref), timeout=20, what="logs read")
            live = settle(ctl)
        finally:
            ctl.close()
        kc = write_kubeconfig(tmp_path / "kubeconfig", url)
        dump = tmp_path / "dump"
        kubectl(kc, "cluster-info", "dump", "--all-namespaces", "--output-directory", str(dump))
        kubectl(kc, "get", CUSTOM_KINDS, "-A", "-o", "json", out=dump / "crds.json")
        kubectl(kc, "get", "clusterqueues", "-o", "json", out=dump / "clusterqueues.json")
        at = rfc3339(clock.now())
    assert at is not None
    assert (dump / "nodes.json").exists() and (dump / "research" / "pods.json").exists()
    result = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", at, "-o", "json"])
    assert result.exit_code == 0, result.stderr
    offline = {f"{r['namespace']}/{r['name']}": r for r in json.loads(result.stdout)["runs"]}
    assert set(offline) == set(live)
    for name in sorted(live):
        assert verdicts(offline[name]) == verdicts(live[name]), name
        for claim in ("scheduled", "running"):
            assert offline[name]["claims"][claim]["reason"] == live[name]["claims"][claim]["reason"], (name, claim)
    if minutes == 9:
        # The scenario's story, as both inputs tell it.
        assert live["research/llm-sft"]["claims"]["progressing"]["reason"].startswith("STALLED")
        assert live["team-b/bert-large"]["claims"]["running"]["verdict"] == "contradicted"
        assert live["research/vision-finetune"]["blocked"]["stage"] == "queue-admission"
        assert live["research/llm-pretrain"]["claims"]["progressing"]["verdict"] == "verified"
