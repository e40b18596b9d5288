"""ADX connection settings: workload identity from the pod's federated token (no secret in config),
no-auth only for loopback test endpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.adx.kusto import AdxSettings, connection


def test_ingest_uri_defaults_to_the_ingest_host() -> None:
    s = AdxSettings(query_uri="https://fleet.westeurope.kusto.windows.net")
    assert s.ingest() == "https://ingest-fleet.westeurope.kusto.windows.net"
    assert AdxSettings(query_uri="https://a", ingest_uri="https://b").ingest() == "https://b"
    assert not AdxSettings().configured


def test_no_auth_only_on_loopback() -> None:
    with pytest.raises(ValueError, match="loopback"):
        connection("https://fleet.westeurope.kusto.windows.net", AdxSettings(auth="none"))
    assert connection("http://127.0.0.1:8080", AdxSettings(auth="none")) is not None
    with pytest.raises(ValueError, match="unknown auth"):
        connection("https://fleet.kusto.windows.net", AdxSettings(auth="password"))


def test_workload_identity_reads_the_federated_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the workload identity webhook injects: client, tenant and a token file; nothing else."""
    token = tmp_path / "token"
    token.write_text("federated-token")
    monkeypatch.setenv("AZURE_CLIENT_ID", "00000000-0000-0000-0000-000000000001")
    monkeypatch.setenv("AZURE_TENANT_ID", "00000000-0000-0000-0000-000000000002")
    monkeypatch.setenv("AZURE_FEDERATED_TOKEN_FILE", str(token))
    kcsb = connection("https://fleet.westeurope.kusto.windows.net", AdxSettings())
    assert "federated-token" not in str(kcsb) and kcsb.data_source.startswith("https://fleet")
