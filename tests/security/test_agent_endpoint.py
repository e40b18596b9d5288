"""Attacks on the node agent's endpoint (issue 26).

`/evidence` holds every tenant's pods, progress and losses on the node. A pod that can reach the
agent must not read it without the token, a flood of half-sent requests must not cost a thread
each, and the controller reads its agents with the token (and over verified TLS when configured).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from collector.agent import Agent
from collector.endpoints import HttpOptions
from collector.sources.agents import AgentEndpoint, AgentReader, AgentReadError, endpoints_from_pods
from tests.agent.fake_nvml import FakeDevice, FakeNvml
from tests.agent.kubelet import PodResourcesServer
from tests.agent.test_agent import EXE, settings
from tests.agent.test_logs import Node
from tests.netutil import free_port

TOKEN = "agent-scrape-token-4e1d"
SERVER_NAME = "taugrid-evidence-agent.observability.svc"
G0 = "GPU-7e1f0c2a-0000-0000-0000-000000000000"


def get(url: str, *, token: str | None = None, context: ssl.SSLContext | None = None,
        timeout: float = 5.0) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout,
                                    context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def certificate(tmp: Path, name: str = SERVER_NAME) -> tuple[Path, Path]:
    """A self-signed certificate for `name` (as the chart's cert-manager Certificate would name the
    agents), valid for an hour; the file doubles as the CA bundle that trusts it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@contextmanager
def agent_with_a_tenant(tmp: Path, options: HttpOptions | None = None) -> Iterator[int]:
    """An agent (scripted NVML, a real pod-resources server, real CRI log files) holding one
    tenant's GPU pod and its training log; yields the port it serves on (loopback)."""
    node = Node(tmp / "pods")
    node.write(*node.steps(1, 5))
    pods = [("research", "llm-worker-0", [("trainer", "nvidia.com/gpu", [G0])])]
    with PodResourcesServer(pods) as kubelet, \
            Agent(settings(tmp, kubelet.socket), nv=FakeNvml([FakeDevice(uuid=G0, pci="00000000:1B:00.0")])) as agent:
        port = agent.serve("127.0.0.1", 0, options) if options is not None else agent.serve("127.0.0.1", 0)
        # Generous under a loaded CI machine (it failed once at 10 s): a slow start is waited out, a
        # start that never comes is named rather than read later as an empty report.
        deadline = time.monotonic() + 30
        while not agent.ready and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.ready, "the agent did not become ready in 30 s"
        yield port


def test_a_pod_without_the_token_reads_nothing_but_the_probes(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with agent_with_a_tenant(tmp_path, HttpOptions(token_file=token)) as port:
        base = f"http://127.0.0.1:{port}"
        for path in ("/evidence", "/evidence?epoch=x&poll=1", "/metrics"):
            code, body = get(base + path)
            assert code == 401 and b"research" not in body and b"llm-worker" not in body, (path, body[:200])
            assert get(base + path, token="wrong-" + TOKEN)[0] == 401
        code, body = get(base + "/evidence", token=TOKEN)
        assert code == 200 and b"llm-worker-0" in body  # the controller, with the token, reads it all
        assert get(base + "/metrics", token=TOKEN)[0] == 200
        assert get(base + "/healthz")[0] == 200 and get(base + "/readyz")[0] == 200  # the kubelet's probes


def test_the_agent_refuses_to_serve_every_tenants_evidence_to_anyone_by_default(tmp_path: Path) -> None:
    """The real command: beyond loopback without a token it does not start (before: it served
    /evidence on 0.0.0.0 to any pod). With --token-file it serves, and /evidence needs the token."""
    node = Node(tmp_path / "pods")
    node.write(*node.steps(1, 3))
    common = ["--log-root", str(tmp_path / "pods"), "--log-scope", "all", "--kmsg", str(tmp_path / "no-kmsg"),
              "--pod-resources-socket", str(tmp_path / "kubelet.sock"), "--node", "n1"]
    port = free_port()
    refused = subprocess.run([EXE, "agent", "--address", f"0.0.0.0:{port}", *common],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0
    assert "--token-file" in refused.stderr
    token = tmp_path / "token"
    token.write_text(TOKEN)
    proc = subprocess.Popen([EXE, "agent", "--address", f"0.0.0.0:{port}", "--token-file", str(token), *common],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if get(base + "/readyz", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        assert get(base + "/evidence")[0] == 401
        code, body = get(base + "/evidence", token=TOKEN)
        assert code == 200 and json.loads(body)["node"] == "n1"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=20)


def test_300_half_sent_requests_hold_no_thread_each(tmp_path: Path) -> None:
    """Before: one thread per connection and no header timeout, so 300 half-sent requests held
    306 threads. Now they cost a file descriptor each until the header timeout, and the probes and
    a whole request still answer."""
    with agent_with_a_tenant(tmp_path) as port:  # the agent's own defaults
        before = threading.active_count()
        clients = []
        try:
            for _ in range(300):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET /evidence HTTP/1.1\r\nHost: agent\r\n")  # never finishes its head
                clients.append(s)
            time.sleep(0.5)
            grown = threading.active_count() - before
            assert grown <= 2, f"{grown} threads for 300 half-sent requests"
            started = time.monotonic()
            assert get(f"http://127.0.0.1:{port}/healthz", timeout=2)[0] == 200
            assert get(f"http://127.0.0.1:{port}/evidence", timeout=2)[0] == 200
            assert time.monotonic() - started < 2
        finally:
            for s in clients:
                s.close()


def test_the_controller_reads_its_agents_with_the_token_over_verified_tls(tmp_path: Path) -> None:
    cert, key = certificate(tmp_path)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    options = HttpOptions(token_file=token, tls_cert_file=cert, tls_key_file=key)
    with agent_with_a_tenant(tmp_path, options) as port:
        now = lambda: datetime(2026, 1, 10, 12, tzinfo=UTC)  # noqa: E731
        [ep] = endpoints_from_pods([{"metadata": {"name": "agent-x"}, "spec": {"nodeName": "gpu-node-1"},
                                     "status": {"phase": "Running", "podIP": "127.0.0.1"}}], port, scheme="https")
        assert ep.url == f"https://127.0.0.1:{port}"
        reader = AgentReader.from_settings(now, token_file=str(token), ca_file=str(cert), server_name=SERVER_NAME)
        report = reader.read(ep)
        assert {(g.namespace, g.pod) for g in report.gpus} == {("research", "llm-worker-0")}
        # No token: the agent answers 401, and the reader says so.
        with pytest.raises(AgentReadError, match="HTTP 401"):
            AgentReader.from_settings(now, ca_file=str(cert), server_name=SERVER_NAME).read(ep)
        # A certificate the configured CA did not sign, or for another name: refused before the token is sent.
        other, _ = certificate(tmp_path, "someone-else.example")
        with pytest.raises(AgentReadError, match="certificate"):
            AgentReader.from_settings(now, token_file=str(token), ca_file=str(other), server_name=SERVER_NAME).read(ep)
        with pytest.raises(AgentReadError, match="certificate"):
            AgentReader.from_settings(now, token_file=str(token), ca_file=str(cert),
                                      server_name="another-name.example").read(ep)
        # Plain HTTP to the TLS port gets nothing.
        with pytest.raises(AgentReadError):
            AgentReader.from_settings(now, token_file=str(token)).read(AgentEndpoint("n", "p", f"http://127.0.0.1:{port}"))


def test_a_token_never_travels_to_a_pod_ip_that_is_not_an_address() -> None:
    """Agent endpoints come from the DaemonSet's pods; a podIP that is not an IP literal (a host
    name, userinfo, a path) never becomes a URL the token is sent to."""
    pods = [{"metadata": {"name": f"a{i}"}, "spec": {"nodeName": f"n{i}"}, "status": {"phase": "Running", "podIP": ip}}
            for i, ip in enumerate(["evil.example", "10.0.0.1@evil.example", "10.0.0.1/x", "10.0.0.9", "fd00::9"])]
    urls = [e.url for e in endpoints_from_pods(pods, 9465)]
    assert urls == ["http://10.0.0.9:9465", "http://[fd00::9]:9465"]
    assert all(ipaddress.ip_address(u.split("//")[1].rsplit(":", 1)[0].strip("[]")) for u in urls)
