"""`explain RUN` live: the simulator read with a user's own kubeconfig, as a process and as a kubectl plugin.

One claim engine, three inputs: the live read agrees with `explain --from-dump` on a kubectl dump of
the same moment; a user whose RBAC forbids pods/log gets the refusal named and progressing unknown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import taugrid_evidence as te
from collector.model import rfc3339
from kubesim.clock import ManualClock
from kubesim.engine import ScenarioEngine
from kubesim.kubeconfig import write_kubeconfig
from kubesim.rbac import READ_VERBS, Rule
from kubesim.scenario import default_scenario_path, load_scenario
from kubesim.server import Simulator, SimulatorSettings
from tests.controller.test_dump_parity import CUSTOM_KINDS, kubectl, verdicts

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# Everything a researcher reads in her namespace, but not pods/log (RBAC has no deny: it is left out).
NAMESPACED = ("pods", "events", "jobs", "workloads", "localqueues", "rayjobs", "rayclusters", "pytorchjobs",
              "jobsets", "tauruns", "tauworkspaces", "resourceclaims")
CLUSTER = ("nodes", "clusterqueues", "tauclusters", "admissionchecks", "nodeclaims", "leases")


def certificate(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, valid for an hour; the file is its own CA bundle."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubesim")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp / "kubesim.crt", tmp / "kubesim.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Simulator, ManualClock, Path]]:
    spec = load_scenario(default_scenario_path())
    clock = ManualClock(spec.start)
    tmp = tmp_path_factory.mktemp("live")
    with Simulator(clock=clock, settings=SimulatorSettings(seed=spec.seed)) as sim:
        url = sim.start()
        engine = ScenarioEngine(spec, url, clock=clock)
        engine.step_to(9 * 60)
        assert engine.errors == []
        sim.rbac.add_user("researcher", "researcher-token", [
            Rule(READ_VERBS, NAMESPACED, namespaces=("research",)), Rule(READ_VERBS, CLUSTER)])
        cert, key = certificate(tmp)
        tls_url = sim.start_tls(str(cert), str(key))  # tokens travel over TLS only
        write_kubeconfig(tmp / "admin", url)
        write_kubeconfig(tmp / "researcher", tls_url, namespace="research", token="researcher-token",
                         ca_file=str(cert))
        (tmp / "tls_url").write_text(tls_url)
        yield sim, clock, tmp


def explain(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from collector.cli import main; main()", "explain", *args],
                          capture_output=True, text=True, timeout=120, env=env or ENV, cwd=REPO, check=False)


def runs(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{r['namespace']}/{r['name']}": r for r in doc["runs"]}


def test_live_explain_agrees_with_a_dump_of_the_same_moment(cluster: tuple[Simulator, ManualClock, Path]) -> None:
    sim, clock, tmp = cluster
    lists, logs = sim.served("list", "pods"), sim.served("logs")
    live = explain("--kubeconfig", str(tmp / "admin"), "-n", "research", "-o", "json")
    assert live.returncode == 0, live.stderr
    doc = json.loads(live.stdout)
    # The API server's clock (its Date header: the scenario's, months from this machine's), to the second.
    assert doc["evaluated_at"][:19] == rfc3339(clock.now())[:19]  # type: ignore[index]
    assert doc["refused"] == []
    assert sim.served("list", "pods") == lists + 1  # one list per kind
    assert sim.served("logs") > logs
    # Bounded: every log read asked for at most --max-log-bytes.
    asked = [q for v, r, q in sim.request_log if v == "logs"]
    assert asked and all(q.get("limitBytes") == str(1 << 20) and q.get("timestamps") == "true" for q in asked)

    dump = tmp / "dump"
    kubectl(tmp / "admin", "cluster-info", "dump", "--all-namespaces", "--output-directory", str(dump))
    kubectl(tmp / "admin", "get", CUSTOM_KINDS, "-A", "-o", "json", out=dump / "crds.json")
    kubectl(tmp / "admin", "get", "clusterqueues", "-o", "json", out=dump / "clusterqueues.json")
    offline = explain("--from-dump", str(dump), "--at", doc["evaluated_at"], "-o", "json", *runs(doc))
    assert offline.returncode == 0, offline.stderr
    by_dump, by_live = runs(json.loads(offline.stdout)), runs(doc)
    assert set(by_live) == {"research/llm-pretrain", "research/llm-sft", "research/vision-finetune"}
    assert set(by_dump) == set(by_live)
    for name in by_live:
        assert verdicts(by_live[name]) == verdicts(by_dump[name]), name
    assert by_live["research/llm-sft"]["claims"]["progressing"]["cause"] == "stalled"
    assert by_live["research/llm-pretrain"]["claims"]["progressing"]["verdict"] == "verified"
    assert by_live["research/vision-finetune"]["blocked"]["stage"] == "queue-admission"


def test_logs_are_bounded_and_a_restarted_container_is_read_with_its_previous_log(
        cluster: tuple[Simulator, ManualClock, Path]) -> None:
    sim, _, tmp = cluster
    before = len(sim.request_log)
    full = explain("--kubeconfig", str(tmp / "admin"), "-n", "team-b", "-o", "json")
    assert full.returncode == 0, full.stderr
    asked = [q for v, _, q in list(sim.request_log)[before:] if v == "logs"]
    # bert-large's worker crash-loops: its previous log is read, its current one (it has none) is not.
    assert [q["container"] for q in asked if q.get("previous") == "true"] == ["ray-worker"]
    assert "waiting to start" not in full.stderr
    bert = runs(json.loads(full.stdout))["team-b/bert-large"]
    assert bert["claims"]["running"]["verdict"] == "contradicted"

    before = len(sim.request_log)
    capped = explain("--kubeconfig", str(tmp / "admin"), "-n", "team-b", "--max-pods", "1", "--max-log-bytes", "4096")
    assert capped.returncode == 0, capped.stderr
    assert "logs read for the first 1 by name (--max-pods)" in capped.stderr
    asked = [q for v, _, q in list(sim.request_log)[before:] if v == "logs"]
    assert 1 <= len(asked) <= 2 and all(q["limitBytes"] == "4096" for q in asked)


def plugin_path(tmp: Path) -> str:
    """A `kubectl-taugrid` on PATH running this checkout's plugin module (the installed script's stand-in)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "kubectl-taugrid"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -m collector.kubectl_plugin \"$@\"\n")
    exe.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def test_a_user_whose_rbac_forbids_logs_is_told_so(cluster: tuple[Simulator, ManualClock, Path]) -> None:
    _, _, tmp = cluster
    # KUBECONFIG as a list, as kubectl reads it (files merged; a missing one skipped).
    env = {**ENV, "KUBECONFIG": f"{tmp / 'missing'}{os.pathsep}{tmp / 'researcher'}", "PATH": plugin_path(tmp)}
    # kubectl itself reads the simulator's refusal as the API server's Status.
    denied = subprocess.run(["kubectl", "logs", "-n", "research", "-l", "ray.io/node-type=head"],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert denied.returncode != 0
    assert 'User "researcher" cannot get resource "pods/log" in API group "" in the namespace "research"' \
        in denied.stderr

    proc = subprocess.run(["kubectl", "taugrid", "explain", "llm-pretrain", "-n", "research", "--context",
                           "taugrid-sim", "-o", "json"], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 3, proc.stderr  # evaluated, but an input was refused
    doc = json.loads(proc.stdout)
    assert [r for r in doc["refused"] if r["resource"] != "pods/log"] == []
    (refusal,) = doc["refused"]
    assert (refusal["verb"], refusal["namespace"], refusal["claims"]) == ("get", "research", ["progressing"])
    assert 'cannot get resource "pods/log"' in refusal["message"]
    assert "training progress" in refusal["would_show"]
    run = runs(doc)["research/llm-pretrain"]
    assert run["claims"]["progressing"]["observed"] == "unknown"  # it was verified from the logs
    assert run["claims"]["progressing"]["verdict"] == "unconfirmed"
    assert run["claims"]["progressing"]["reason"].startswith("get pods/log refused; ")
    assert run["claims"]["running"]["verdict"] == "verified"  # what RBAC allowed still counts

    text = subprocess.run(["kubectl", "taugrid", "explain", "llm-pretrain"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert text.returncode == 3, text.stderr
    assert "refused: get pods/log in namespace research: it would have shown training progress" in text.stdout
    assert "progressing cannot be true without it" in text.stdout
    # The notebook API reads the same way (in this process, with the same kubeconfig).
    ex = te.explain("llm-pretrain", kubeconfig=str(tmp / "researcher"))
    assert ex.source == "live:research" and list(ex.refused["resource"]) == ["pods/log"]
    assert ex.claims.set_index("claim").loc["progressing", "observed"] == "unknown"
    assert ex.runs.loc[0, "running"] == "verified"
    yml = subprocess.run(["kubectl", "taugrid", "explain", "research/llm-pretrain", "-o", "yaml"],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert yml.returncode == 3 and "resource: pods/log" in yml.stdout


def test_refused_lists_name_the_resource_and_leave_its_claims_unknown(
        cluster: tuple[Simulator, ManualClock, Path]) -> None:
    sim, _, tmp = cluster
    # Pods are readable only in another namespace: nothing of this run's pods may be claimed.
    sim.rbac.add_user("outsider", "outsider-token", [
        Rule(READ_VERBS, tuple(r for r in NAMESPACED if r != "pods"), namespaces=("research",)),
        Rule(READ_VERBS, ("pods",), namespaces=("team-b",))])
    write_kubeconfig(tmp / "outsider", (tmp / "tls_url").read_text(), namespace="research", token="outsider-token",
                     ca_file=str(tmp / "kubesim.crt"))
    proc = explain("--kubeconfig", str(tmp / "outsider"), "llm-pretrain", "-o", "json")
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    refused = {(r["verb"], r["resource"], r["namespace"]) for r in doc["refused"]}
    assert ("list", "pods", "research") in refused
    assert ("list", "nodes", None) in refused  # cluster scope
    nodes = next(r for r in doc["refused"] if r["resource"] == "nodes")
    assert nodes["message"] == ('nodes is forbidden: User "outsider" cannot list resource "nodes" in API group "" '
                                "at the cluster scope")
    claims = runs(doc)["research/llm-pretrain"]["claims"]
    assert {k: c["observed"] for k, c in claims.items()} == {
        "scheduled": "unknown", "running": "unknown", "progressing": "unknown"}


def test_an_unknown_token_is_401_and_no_evaluation(cluster: tuple[Simulator, ManualClock, Path]) -> None:
    _, _, tmp = cluster
    write_kubeconfig(tmp / "stranger", (tmp / "tls_url").read_text(), token="not-a-user",
                     ca_file=str(tmp / "kubesim.crt"))
    proc = explain("--kubeconfig", str(tmp / "stranger"), "llm-pretrain")
    assert proc.returncode == 1
    assert "HTTP 401" in proc.stderr and proc.stdout == ""
