"""Azure Data Explorer: queued ingestion (azure-kusto-ingest), management commands and queries
(azure-kusto-data), authenticated by workload identity (azure-identity). No secrets in config:
the identity comes from the pod's federated token, which the workload identity webhook mounts.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from exporters.adx.schema import Table, management_commands

log = logging.getLogger("taugrid.adx")


@dataclass(frozen=True, slots=True)
class AdxSettings:
    """Where the ADX cluster is; empty `query_uri` means the embedded DuckDB default."""

    query_uri: str = ""  # https://<cluster>.<region>.kusto.windows.net
    ingest_uri: str = ""  # default: the query URI with `ingest-` in front of the host
    database: str = "taugrid"
    # "workload-identity" (in a cluster) | "azure-cli" (a laptop) | "none" (loopback test endpoints only)
    auth: str = "workload-identity"
    client_id: str = ""  # the managed identity's client id when the pod's default is not the one
    create_tables: bool = True  # run `.create-merge table` and the mappings at start (idempotent)

    @property
    def configured(self) -> bool:
        return bool(self.query_uri)

    def ingest(self) -> str:
        if self.ingest_uri:
            return self.ingest_uri
        u = urlparse(self.query_uri)
        return u._replace(netloc=f"ingest-{u.netloc}").geturl()


def _loopback(uri: str) -> bool:
    return (urlparse(uri).hostname or "") in ("127.0.0.1", "localhost", "::1")


def connection(uri: str, settings: AdxSettings) -> Any:
    """A KustoConnectionStringBuilder for `uri` with the configured authentication."""
    from azure.kusto.data import KustoConnectionStringBuilder

    if settings.auth == "none":
        if not _loopback(uri):
            raise ValueError(f"adx: auth 'none' is only for loopback test endpoints, not {uri}")
        return KustoConnectionStringBuilder.with_no_authentication(uri)
    if settings.auth == "azure-cli":
        return KustoConnectionStringBuilder.with_az_cli_authentication(uri)
    if settings.auth == "workload-identity":
        from azure.identity import WorkloadIdentityCredential

        cred = WorkloadIdentityCredential(client_id=settings.client_id) if settings.client_id \
            else WorkloadIdentityCredential()
        return KustoConnectionStringBuilder.with_azure_token_credential(uri, cred)
    raise ValueError(f"adx: unknown auth {settings.auth!r} (workload-identity, azure-cli, none)")


class KustoQueuedTarget:
    """An IngestTarget: each blob goes through QueuedIngestClient (upload + queue message), tagged
    `ingest-by:<tag>` with ingestIfNotExists on the same tag, so a replay is dropped by ADX."""

    def __init__(self, settings: AdxSettings) -> None:
        self.settings = settings
        self._client: Any = None

    def open(self) -> None:
        from azure.kusto.ingest import QueuedIngestClient

        if self.settings.create_tables:
            try:
                create_schema(self.settings)
            except Exception as e:  # ingestion still works on tables someone else created
                log.warning("could not create the ADX tables", extra={"error": str(e)[:500]})
        uri = self.settings.ingest()
        self._client = QueuedIngestClient(connection(uri, self.settings), auto_correct_endpoint=False)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def ingest(self, table: Table, blob: bytes, tag: str) -> bool:
        from azure.kusto.data.data_format import DataFormat, IngestionMappingKind
        from azure.kusto.ingest import IngestionProperties, StreamDescriptor

        assert self._client is not None, "open() first"
        props = IngestionProperties(
            database=self.settings.database, table=table.name, data_format=DataFormat.MULTIJSON,
            ingestion_mapping_reference=table.mapping_name, ingestion_mapping_kind=IngestionMappingKind.JSON,
            ingest_by_tags=[tag], ingest_if_not_exists=[tag],
        )
        self._client.ingest_from_stream(StreamDescriptor(io.BytesIO(blob), source_id=None), props)
        return True


def create_schema(settings: AdxSettings) -> list[str]:
    """Run `.create-merge table` and the JSON mappings on the cluster; returns the commands run."""
    from azure.kusto.data import KustoClient

    done = []
    with KustoClient(connection(settings.query_uri, settings)) as client:
        for cmd in management_commands():
            client.execute_mgmt(settings.database, cmd)
            done.append(cmd)
    return done
