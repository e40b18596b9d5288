"""A small local stand-in for ADX's Data Management endpoint, and Azurite's blob and queue services.

It also accepts (and records) the schema commands the exporter runs on the engine at start.

The DM endpoint answers the two commands azure-kusto-ingest's QueuedIngestClient asks before it
uploads (`.get ingestion resources`, `.get kusto identity token`) with Azurite SAS URLs, over
Kusto's v1 REST shape. `Dm.drain` then does what ADX's DM would: take the queue messages, skip
blobs whose ingestIfNotExists tag was already ingested, and load the rest (here: into DuckDB,
appending like ADX: two blobs holding one RowId leave two rows).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import re
import socket
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import pytest

from exporters.adx.schema import _DUCK_TYPES, ALL_TABLES, Table
from tests.azurite import ACCOUNT, KEY, PREFIX
from tests.netutil import free_port, stop_process

CONTAINER = "ingest-temp"
QUEUE = "readyforaggregation-secured"


class AzuriteBlobQueue:
    """`azurite` (blob + queue) on fixed loopback ports, so a stopped one can come back on the same."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.blob_port = free_port()
        self.queue_port = free_port(avoid=(self.blob_port,))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def blob_url(self) -> str:
        return f"http://127.0.0.1:{self.blob_port}/{ACCOUNT}"

    @property
    def queue_url(self) -> str:
        return f"http://127.0.0.1:{self.queue_port}/{ACCOUNT}"

    def start(self) -> None:
        exe = PREFIX / "node_modules" / ".bin" / "azurite"
        if not exe.exists():
            pytest.fail(f"Azurite is not installed at {exe}: .ci/run installs it", pytrace=False)
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "azurite.log").open("ab")
        self.proc = subprocess.Popen(
            [str(exe), "--blobHost", "127.0.0.1", "--blobPort", str(self.blob_port), "--queueHost", "127.0.0.1",
             "--queuePort", str(self.queue_port), "--tableHost", "127.0.0.1", "--tablePort", "0",
             "--location", str(self.workdir / "data"), "--disableTelemetry", "--skipApiVersionCheck", "--silent"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.workdir)
        deadline = time.monotonic() + 20
        for port in (self.blob_port, self.queue_port):
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        pytest.fail(f"azurite did not start: {(self.workdir / 'azurite.log').read_text()[-2000:]}",
                                    pytrace=False)
                    time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={self.blob_url};QueueEndpoint={self.queue_url};")

    def create(self) -> None:
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient
        from azure.storage.queue import QueueServiceClient

        with contextlib.suppress(ResourceExistsError):
            BlobServiceClient.from_connection_string(self.connection_string()).create_container(CONTAINER)
        with contextlib.suppress(ResourceExistsError):
            QueueServiceClient.from_connection_string(self.connection_string()).create_queue(QUEUE)

    def sas_urls(self) -> tuple[str, str]:
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas
        from azure.storage.queue import QueueSasPermissions, generate_queue_sas

        expiry = datetime.now(UTC) + timedelta(hours=1)
        blob_sas = generate_container_sas(ACCOUNT, CONTAINER, account_key=KEY, expiry=expiry,
                                          permission=ContainerSasPermissions(read=True, write=True, create=True,
                                                                             list=True))
        queue_sas = generate_queue_sas(ACCOUNT, QUEUE, account_key=KEY, expiry=expiry,
                                       permission=QueueSasPermissions(add=True, read=True, process=True))
        return f"{self.blob_url}/{CONTAINER}?{blob_sas}", f"{self.queue_url}/{QUEUE}?{queue_sas}"


def _table(columns: list[tuple[str, str]], rows: list[list[Any]]) -> dict[str, Any]:
    return {"Tables": [{"TableName": "Table_0",
                        "Columns": [{"ColumnName": n, "DataType": "String", "ColumnType": t} for n, t in columns],
                        "Rows": rows}]}


class Dm:
    """The DM endpoint on loopback; `commands` records what it was asked."""

    def __init__(self, azurite: AzuriteBlobQueue) -> None:
        self.azurite = azurite
        self.commands: list[str] = []
        self.ingested_tags: set[str] = set()
        dm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                csl = str(body.get("csl", "")).strip()
                dm.commands.append(csl)
                if csl == ".get ingestion resources":
                    blob, queue = dm.azurite.sas_urls()
                    out = _table([("ResourceTypeName", "string"), ("StorageRoot", "string")],
                                 [["TempStorage", blob], ["SecuredReadyForAggregationQueue", queue]])
                elif csl == ".get kusto identity token":
                    out = _table([("AuthorizationContext", "string")], [["local-test-context"]])
                elif csl.startswith((".create-merge table", ".create-or-alter table")):
                    # The engine's side of the stand-in: the exporter's schema commands, recorded.
                    out = _table([("TableName", "string")], [[csl.split("'")[1]]])
                elif csl.startswith(".create-or-alter function"):
                    name = re.search(r"(\w+)\(\)\s*\{", csl)
                    out = _table([("Name", "string")], [[name[1] if name else ""]])
                elif csl == ".show version":
                    out = _table([("ServiceType", "string")], [["DataManagement"]])
                else:
                    self.send_response(400)
                    self.end_headers()
                    return
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self._thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    def drain(self, store: Path) -> list[dict[str, Any]]:
        """Take every queued ingestion message; load blobs not ingested yet (by ingestIfNotExists)."""
        from azure.storage.blob import BlobClient
        from azure.storage.queue import QueueClient

        q = QueueClient.from_connection_string(self.azurite.connection_string(), QUEUE)
        con = duckdb.connect(str(store))
        for t in ALL_TABLES.values():
            con.execute(t.duckdb_ddl())  # no key on RowId: ADX's tables are append-only
        messages = []
        try:
            while True:
                batch = list(q.receive_messages(messages_per_page=32, max_messages=32))
                if not batch:
                    break
                for m in batch:
                    info = json.loads(base64.b64decode(m.content))
                    messages.append(info)
                    props = info.get("AdditionalProperties", {})
                    tags = json.loads(props.get("ingestIfNotExists", "[]"))
                    if not any(t in self.ingested_tags for t in tags):
                        raw = BlobClient.from_blob_url(info["BlobPath"]).download_blob().readall()
                        if info["BlobPath"].split("?")[0].endswith(".gz"):
                            raw = gzip.decompress(raw)
                        _append(con, ALL_TABLES[info["TableName"]], raw, store.with_suffix(".blob.jsonl"))
                        self.ingested_tags.update(t.removeprefix("ingest-by:")
                                                  for t in json.loads(props.get("tags", "[]")))
                    q.delete_message(m)
        finally:
            con.close()
        return messages


def _append(con: Any, table: Table, blob: bytes, scratch: Path) -> None:
    """Every row of a JSON-lines blob appended to its table, as ADX ingests it (no RowId check)."""
    scratch.write_bytes(blob)
    cols = ", ".join(f"'{c.name}': '{_DUCK_TYPES[c.type]}'" for c in table.columns)
    names = ", ".join(f'"{c.name}"' for c in table.columns)
    con.execute(f'INSERT INTO "{table.name}" ({names}) SELECT {names} FROM '
                f"read_json(?, format='newline_delimited', columns={{{cols}}})", [str(scratch)])
    scratch.unlink()
