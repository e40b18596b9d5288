"""Token exfiltration through a TauRun's `spec.checkpointUri` (issue 8, severe).

A tenant writes the checkpoint location; the collector lists it with its workload identity. The
attack: name a host the tenant controls that looks like Azure Blob (`x.blob.attacker.example`),
or `abfss://` on any domain, and receive a bearer token for storage. The defence: credentials go
only to storage the platform configured (accounts, clouds, namespaces); the rest is refused before
any connection. Here a listener on 127.0.0.1 poses as every such host (name resolution is
redirected to it, the one fake: DNS) and counts the connections it receives; a workload
identity cannot exist on this machine, so a static token credential stands in for it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken

from collector.controller import Controller
from collector.model import Ref
from collector.settings import StorageSettings
from collector.sources.checkpoints import LocalCheckpointStore, RefusedLocation, read_checkpoints, store_for
from collector.sources.kube_api import KubeApi
from kubesim.server import Simulator
from tests.controller.test_controller import (
    FAST,
    T0,
    Clock,
    api_client_for,
    ensure_namespaces,
    server_side,
    settings,
    taurun,
    wait_until,
)

ATTACKER_HOSTS = ("x.blob.attacker.example", "acct01.blob.attacker.example", "acct01.dfs.attacker.example",
                  "acct01.blob.core.windows.net.attacker.example", "acct01.blob.core.chinacloudapi.cn",
                  "teamb.blob.core.windows.net", "teama.blob.core.windows.net")
CONFIGURED = StorageSettings(accounts=frozenset({"acct01"}), account_namespaces={"teama": "team-a"})


class Listener:
    """A TCP listener that records every connection (a TLS ClientHello is a token on its way)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


class StaticToken:
    """Stands in for DefaultAzureCredential (workload identity cannot exist here)."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def get_token(self, *scopes: str, **_: Any) -> AccessToken:
        return AccessToken("STOLEN-STORAGE-TOKEN", int(time.time()) + 3600)

    def close(self) -> None:
        pass


@pytest.fixture
def attacker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Listener]:
    listener = Listener()
    real = socket.getaddrinfo

    def resolve(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        if isinstance(host, str) and (host in ATTACKER_HOSTS or host == "acct01.blob.core.windows.net"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", listener.port))]
        return real(host, port, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    import azure.identity

    monkeypatch.setattr(azure.identity, "DefaultAzureCredential", StaticToken)
    try:
        yield listener
    finally:
        listener.close()


def _list(uri: str, policy: StorageSettings, namespace: str = "team-a") -> None:
    store, prefix = store_for(uri, policy, namespace=namespace)
    store.retries = 0  # type: ignore[attr-defined]
    store.open()
    try:
        read_checkpoints(store, prefix, Ref("TauRun", namespace, "r"), datetime.now(UTC))
    except Exception:  # noqa: BLE001 - the control only needs the connection to happen
        pass
    finally:
        store.close()


def test_control_a_configured_account_is_reached(attacker: Listener) -> None:
    """The harness sees a request when one is made: the configured account is contacted."""
    _list("https://acct01.blob.core.windows.net/ckpt/run1", CONFIGURED)
    assert attacker.connections >= 1


@pytest.mark.parametrize("uri", [
    "https://x.blob.attacker.example/ckpt/run1",
    "https://acct01.blob.attacker.example/ckpt/run1",  # a configured account's name on a foreign domain
    "https://acct01.blob.core.windows.net.attacker.example/ckpt/run1",
    "abfss://ckpt@acct01.dfs.attacker.example/run1",
    "abfs://ckpt@x.dfs.attacker.example/run1",
    "https://acct01.blob.core.chinacloudapi.cn/ckpt/run1",  # a cloud not configured
    "https://teamb.blob.core.windows.net/ckpt/run1",  # an account not configured
    "https://teama.blob.core.windows.net/ckpt/run1",  # configured, but for another namespace
    "https://user:pw@acct01.blob.core.windows.net/ckpt/run1",
    "https://acct01.blob.core.windows.net:8443/ckpt/run1",
])
def test_foreign_storage_is_refused_before_any_connection(attacker: Listener, uri: str) -> None:
    with pytest.raises(RefusedLocation, match="refused") as exc:
        _list(uri, CONFIGURED, namespace="team-b")
    assert repr(uri) in str(exc.value)
    time.sleep(0.05)
    assert attacker.connections == 0


def test_account_namespace_map_lets_a_workspace_reach_only_its_own_accounts() -> None:
    store, _ = store_for("https://teama.blob.core.windows.net/ckpt/r", CONFIGURED, namespace="team-a")
    assert store is not None
    with pytest.raises(RefusedLocation, match="serves namespaces team-a, not 'team-b'"):
        store_for("https://teama.blob.core.windows.net/ckpt/r", CONFIGURED, namespace="team-b")


def test_other_clouds_only_when_configured() -> None:
    china = StorageSettings(clouds=frozenset({"china"}), accounts=frozenset({"acct01"}))
    store, _ = store_for("https://acct01.blob.core.chinacloudapi.cn/ckpt/r", china)
    assert store is not None
    with pytest.raises(RefusedLocation, match="core.chinacloudapi.cn"):
        store_for("https://acct01.blob.core.windows.net/ckpt/r", china)


@pytest.mark.parametrize("uri", [
    "/var/run/secrets/kubernetes.io/serviceaccount",
    "file:///var/run/secrets/kubernetes.io/serviceaccount",
    "/proc/self",
    "/ckpt/../proc/self",  # leaves the configured root
])
def test_local_paths_are_refused_unless_under_a_configured_root(uri: str) -> None:
    for policy in (StorageSettings(), StorageSettings(local_roots=frozenset({"/ckpt"}))):
        with pytest.raises(RefusedLocation, match="local path"):
            store_for(uri, policy)


def test_a_marker_link_to_a_secret_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("eyJhbGciOiJSUzI1NiJ9.SECRET-SERVICE-ACCOUNT-TOKEN")
    root = tmp_path / "ckpt"
    (root / "global_step100").mkdir(parents=True)
    (root / "global_step100" / "model.pt").write_bytes(b"x")
    (root / "latest").symlink_to(secret)
    store, _ = store_for(str(root), StorageSettings(local_roots=frozenset({str(root)})))
    assert isinstance(store, LocalCheckpointStore)
    sig = read_checkpoints(store, "", Ref("TauRun", "ns", "r"), datetime.now(UTC))
    assert "SECRET" not in repr(sig)


def test_controller_refuses_a_tenant_location_and_never_connects(attacker: Listener) -> None:
    """End to end: a TauRun in the simulator names the attacker's host; the controller's Expstore
    poller refuses it with a note naming the run and location, and the attacker sees nothing."""
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=50) as sim:
        sim.start()
        ensure_namespaces(sim, "team-b")
        tr = taurun("exfil", "team-b", "Running", T0 - timedelta(hours=1), workers=1)
        tr["spec"]["checkpointUri"] = "https://x.blob.attacker.example/ckpt/exfil"
        sim.apply(server_side(tr))
        c = Controller(KubeApi(api_client_for(sim.base_url)),
                       _with_storage(settings(checkpoint_poll_interval=timedelta(seconds=0.1)), CONFIGURED), clock.now)
        c.open()
        try:
            wait_until(lambda: any("x.blob.attacker.example" in s for s in c.skipped), what="refusal note")
            note = next(s for s in c.skipped if "x.blob.attacker.example" in s)
            assert "TauRun/team-b/exfil" in note.replace(" ", "/") or "exfil" in note
            assert "refused, nothing fetched" in note
            time.sleep(0.5)  # several more poll passes
            assert attacker.connections == 0
            assert sum(1 for s in c.skipped if "x.blob.attacker.example" in s) == 1  # said once, not every pass
        finally:
            c.close()


def _with_storage(s: Any, storage: StorageSettings) -> Any:
    from dataclasses import replace

    return replace(s, storage=storage)


def test_the_allowlist_comes_from_the_settings_file(tmp_path: Path) -> None:
    from collector.config import ConfigError, load_settings

    cfg = tmp_path / "config.yaml"
    cfg.write_text("storage:\n  clouds: [public, usgov]\n  accounts: [acct01]\n"
                   "  account_namespaces:\n    teama: [team-a, team-a-dev]\n  local_roots: [/mnt/expstore]\n")
    policy = load_settings(cfg).storage
    assert store_for("https://teama.blob.core.usgovcloudapi.net/ckpt/p", policy, namespace="team-a-dev")[0] is not None
    with pytest.raises(RefusedLocation):
        store_for("https://teama.blob.core.windows.net/ckpt/p", policy, namespace="team-b")
    for bad, why in (("storage:\n  clouds: [mars]\n", "unknown cloud 'mars'"),
                     ("storage:\n  accounts: [Not_An_Account]\n", "not a storage account name"),
                     ("storage:\n  accounts: acct01\n", "expected a list")):
        cfg.write_text(bad)
        with pytest.raises(ConfigError, match=why):
            load_settings(cfg)
