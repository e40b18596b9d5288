"""This node's ResourceSlices (resource.k8s.io), read from the API server: which GPU UUID each DRA
device is (`podresources.dra.DraResolver`).

The agent only reads: `GET /apis/resource.k8s.io/<version>/resourceslices?fieldSelector=
spec.nodeName=<node>`, paged, with the pod's service-account token, at most once per interval and
only while a claim's device is left to resolve. `v1` (Kubernetes 1.34) first, then `v1beta2` and
`v1beta1` (whose devices nest their attributes under `basic`). Drivers publish the UUID as the
attribute `uuid` (or `<driver>/uuid`); a value that is not a GPU or MIG UUID is ignored.

A failed read keeps the last good index (slices change when a driver restarts or MIG is
re-partitioned, not per pod) and is named in `error`; nothing about it stops attribution.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import msgspec

from collector.agent.podresources.dra import MAX_NAME, UUID_RE
from collector.sources import httpget

log = logging.getLogger("taugrid.agent.draslices")

VERSIONS = ("v1", "v1beta2", "v1beta1")
MAX_PAGES = 50
PAGE = 500


class _Attribute(msgspec.Struct):
    string: str | None = None


class _Basic(msgspec.Struct):
    attributes: dict[str, _Attribute] = {}


class _Device(msgspec.Struct):
    name: str = ""
    attributes: dict[str, _Attribute] = {}
    basic: _Basic | None = None  # v1beta1


class _Pool(msgspec.Struct):
    name: str = ""


class _Spec(msgspec.Struct):
    driver: str = ""
    pool: _Pool = msgspec.field(default_factory=_Pool)
    nodeName: str | None = None  # noqa: N815 (the API's spelling)
    devices: list[_Device] = []


class _Slice(msgspec.Struct):
    spec: _Spec = msgspec.field(default_factory=_Spec)


class _ListMeta(msgspec.Struct):
    # "continue" is a keyword: renamed
    next: str | None = msgspec.field(default=None, name="continue")


class _SliceList(msgspec.Struct):
    items: list[_Slice] = []
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


_decode = msgspec.json.Decoder(_SliceList).decode

Index = dict[tuple[str, str, str], str]


def index_slices(slices: list[_Slice], node: str, drivers: tuple[str, ...]) -> Index:
    """(driver, pool, device) → UUID of the GPUs drivers in `drivers` publish for `node`."""
    out: Index = {}
    for s in slices:
        sp = s.spec
        if sp.driver not in drivers or (sp.nodeName is not None and sp.nodeName != node):
            continue
        for d in sp.devices:
            attrs = d.attributes or (d.basic.attributes if d.basic is not None else {})
            attr = attrs.get("uuid") or attrs.get(f"{sp.driver}/uuid")
            value = attr.string if attr is not None else None
            if (value and UUID_RE.fullmatch(value) and d.name and len(d.name) <= MAX_NAME
                    and len(sp.pool.name) <= MAX_NAME):
                out[(sp.driver, sp.pool.name, d.name)] = value
    return out


class ResourceSliceReader:
    """`reader()` → the node's slice index, read again when older than `interval_s`."""

    def __init__(self, api: str, node: str, *, drivers: tuple[str, ...], token_file: Path | None = None,
                 ca_file: Path | None = None, interval_s: float = 60.0, timeout_s: float = 5.0,
                 max_body: int = 8 << 20, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api.rstrip("/")
        self.node = node
        self.drivers = drivers
        self.token_file = token_file
        self.ca_file = ca_file
        self.context: ssl.SSLContext | None = None  # made at the first read: a missing CA file is a status
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_body = max_body
        self._clock = clock
        self._index: Index = {}
        self._read_at: float | None = None
        self._version: str | None = None
        self._lock = threading.Lock()
        self.error = ""
        self.reads = 0
        self.errors = 0

    def __call__(self) -> Index:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self.interval_s:
                self._read_at = now
                self._refresh()
            return self._index

    @property
    def status(self) -> str:
        if self.error:
            return self.error
        return f"{len(self._index)} devices" if self.reads else "not read yet"

    def _refresh(self) -> None:
        try:
            self._index = self._read()
        except (httpget.HttpGetError, msgspec.DecodeError, OSError, ssl.SSLError) as e:
            self.errors += 1
            self._version = None  # ask every version again next time (an upgraded API server)
            if str(e) != self.error:
                log.warning("ResourceSlices not read", extra={"error": str(e)[:300]})
            self.error = str(e)[:300]
            return
        self.error = ""
        self.reads += 1

    def _headers(self) -> dict[str, str]:
        if self.token_file is None:
            return {}
        token = self.token_file.read_text().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _read(self) -> Index:
        if self.context is None and self.api.startswith("https://"):
            try:
                self.context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
            except OSError as e:  # ssl names no file
                raise OSError(f"CA bundle {self.ca_file}: {e}") from e
        headers = self._headers()
        versions = (self._version,) if self._version else VERSIONS
        for version in versions:
            slices: list[_Slice] = []
            cont = ""
            for _ in range(MAX_PAGES):
                query = {"fieldSelector": f"spec.nodeName={self.node}", "limit": str(PAGE)}
                if cont:
                    query["continue"] = cont
                url = f"{self.api}/apis/resource.k8s.io/{version}/resourceslices?{urllib.parse.urlencode(query)}"
                answer = httpget.get(url, connect_s=min(2.0, self.timeout_s), total_s=self.timeout_s,
                                     max_body=self.max_body, accept="application/json", headers=headers,
                                     context=self.context, chunked=True)
                if answer.status == 404 and not slices:
                    break  # this API version is not served: try the next
                if answer.status != 200:
                    raise httpget.HttpGetError(url, f"HTTP {answer.status}", retryable=answer.status >= 500)
                page = _decode(answer.body)
                slices += page.items
                cont = page.metadata.next or ""
                if not cont:
                    self._version = version
                    return index_slices(slices, self.node, self.drivers)
            else:
                raise httpget.HttpGetError(url, f"more than {MAX_PAGES} pages of ResourceSlices", retryable=False)
        raise httpget.HttpGetError(f"{self.api}/apis/resource.k8s.io",
                                   f"no ResourceSlice API version served ({', '.join(versions)})", retryable=False)
