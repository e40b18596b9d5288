"""A real Azurite blob service for tests (npm `azurite@3.35.0`, Node 20), on loopback, its own data dir.

    with Azurite.start(tmp_path / "azurite") as az:
        service = BlobServiceClient(az.blob_url, credential=az.credential())

Installed into the repository's `.cache/azurite` (see INSTALL_HINT); `AZURITE_BLOB` may name
another `azurite-blob` executable. A missing binary FAILS the test: skipping would hide a broken
setup. Ready in well under a second; stopped by process id.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import pytest

from tests.netutil import free_port, stop_process

if TYPE_CHECKING:
    from azure.core.credentials import AzureNamedKeyCredential

REPO = Path(__file__).resolve().parents[1]
PREFIX = REPO / ".cache" / "azurite"
VERSION = "3.35.0"
INSTALL_HINT = f"npm install --prefix .cache/azurite --no-audit --no-fund azurite@{VERSION}  (from the repository root)"

# Azurite's well-known development account, exactly as its documentation gives it (public, not a secret).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def find_binary() -> str:
    """The `azurite-blob` executable, or pytest.fail saying how to install it."""
    override = os.environ.get("AZURITE_BLOB")
    candidates = [override] if override else [str(PREFIX / "node_modules" / ".bin" / "azurite-blob")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    if not override and (found := shutil.which("azurite-blob")):
        return found
    pytest.fail(
        f"the Azurite blob service was not found ({candidates[0]}); Azure Blob tests need it: {INSTALL_HINT}",
        pytrace=False,
    )




class Azurite:
    """One running `azurite-blob` process. Use `start`; stop with `stop()` or a `with` block."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, workdir: Path, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.workdir = workdir
        self.log = log
        self.account = ACCOUNT
        self.key = KEY
        self.blob_url = f"http://127.0.0.1:{port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={self.blob_url};"

    def credential(self) -> AzureNamedKeyCredential:
        from azure.core.credentials import AzureNamedKeyCredential

        return AzureNamedKeyCredential(ACCOUNT, KEY)

    @classmethod
    def start(cls, workdir: Path, *, ready_timeout: float = 15.0) -> Azurite:
        """Start the blob service on a free loopback port and wait until it accepts connections."""
        exe = find_binary()
        workdir.mkdir(parents=True, exist_ok=True)
        last_error = ""
        # The free port can be taken between probing and binding: retry with another.
        for attempt in range(3):
            port = free_port()
            data = workdir / f"data-{attempt}"
            data.mkdir(exist_ok=True)
            log = workdir / f"azurite-{attempt}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [
                        exe,
                        "--blobHost",
                        "127.0.0.1",
                        "--blobPort",
                        str(port),
                        "--location",
                        str(data),
                        "--disableTelemetry",
                        "--skipApiVersionCheck",  # the SDK may speak a newer API version than 3.35 knows
                        "--silent",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=data,
                )
            server = cls(proc, port, workdir, log)
            if server._wait_ready(ready_timeout):
                return server
            server.stop()
            last_error = log.read_text(errors="replace")[-2000:]
        pytest.fail(f"azurite did not become ready; last log:\n{last_error}", pytrace=False)

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.02)
        return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM this process by its id, SIGKILL if it lingers."""
        stop_process(self.proc, timeout)

    def __enter__(self) -> Azurite:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
