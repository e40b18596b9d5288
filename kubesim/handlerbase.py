"""The simulator's HTTP plumbing, shared by every part of its request handler: answers and errors,
request bodies, query parameters, chunked streams, and the injected faults a request may meet."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

import orjson
import yaml

from kubesim.errors import ApiError
from kubesim.faults import Fault
from kubesim.registry import ResourceType
from kubesim.store import TooLarge

if TYPE_CHECKING:
    from kubesim.server import Simulator, SimulatorServer

# The HTTP front logs under one name, the module it lived in before it was split.
log = logging.getLogger("kubesim.server")


def too_large_error(exc: TooLarge, retry_after_s: int, cause: str = "reason") -> ApiError:
    """What Kubernetes answers for a resourceVersion ahead of its store (storage.NewTooLargeResourceVersionError
    wrapped in a Timeout StatusError): 504, reason Timeout, a ResourceVersionTooLarge cause. client-go's
    reflector recognizes it (reason Timeout + that cause) and relists from resourceVersion "".
    `cause` is SimulatorSettings.too_large_cause: older servers sent less of the cause.
    """
    details: dict[str, Any] = {"retryAfterSeconds": retry_after_s}
    if cause == "reason":
        details["causes"] = [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]
    elif cause == "message":
        details["causes"] = [{"message": "Too large resource version"}]
    return ApiError(504, f"Timeout: {exc}", reason="Timeout", details=details, retry_after=retry_after_s)


@dataclass(slots=True)
class Route:
    rt: ResourceType
    namespace: str
    name: str
    subresource: str
    verb: str


def qs_bool(q: dict[str, list[str]], key: str) -> bool:
    return q.get(key, [""])[0].lower() in ("true", "1")


def qs(q: dict[str, list[str]], key: str) -> str:
    return q.get(key, [""])[0]


def qs_int(q: dict[str, list[str]], key: str) -> int | None:
    raw = qs(q, key)
    if raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ApiError.bad_request(f"invalid {key}: {raw!r}") from None


def accept_table(accept: str) -> str | None:
    """ "v1"/"v1beta1" when the client prefers a meta.k8s.io Table, else None."""
    for part in accept.split(","):
        params = dict(p.strip().partition("=")[::2] for p in part.split(";")[1:])
        media = part.split(";")[0].strip()
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return params.get("v", "v1")
        if media in ("application/json", "*/*", "application/*") and "as" not in params:
            return None
    return None


class Dropped(Exception):
    """An injected fault: close the connection without answering."""


class HandlerBase(BaseHTTPRequestHandler):
    """Plumbing for the request handler's parts (discovery, streams, admin API, resources)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server: SimulatorServer

    # ------------------------------------------------------------------ plumbing
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s " + format, self.address_string(), *args)

    @property
    def sim(self) -> Simulator:
        return self.server.sim

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The `Date` header (RFC 7231 HTTP-date) on every answer, watch streams included: the scenario
        clock, not the host's, so a client that evaluates on the server's clock plays on scenario time."""
        when = self.sim.clock.now().timestamp() if timestamp is None else timestamp
        return formatdate(when, usegmt=True)

    def _send(
        self,
        code: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, obj: Any, content_type: str = "application/json") -> None:
        self._send(code, orjson.dumps(obj), content_type)

    def _error(self, err: ApiError) -> None:
        headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
        self._send(err.code, orjson.dumps(err.status()), headers=headers)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self, yaml_ok: bool = False) -> Any:
        raw = self._body()
        if not raw:
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            if yaml_ok:
                try:
                    return yaml.safe_load(raw)
                except yaml.YAMLError as exc:
                    raise ApiError.bad_request(f"invalid YAML body: {exc}") from None
            raise ApiError.bad_request("the request body is not valid JSON") from None

    # ------------------------------------------------------------------ faults
    def _maybe_fault(self, verb: str, resource: str, namespace: str) -> list[Fault]:
        fired = self.sim.faults.pick(verb, resource, namespace, self.headers.get("User-Agent", ""))
        for f in fired:
            if f.action == "delay":
                time.sleep(f.delay_s)
        for f in fired:
            if f.action == "status":
                retry = f.retry_after_s if f.status in (429, 503) else None
                message = {
                    429: "Too many requests, please try again later.",
                    503: "the server is currently unable to handle the request",
                }.get(f.status, "Internal error occurred: injected fault")
                err = ApiError(
                    f.status,
                    message,
                    retry_after=retry,
                    details={"retryAfterSeconds": retry} if retry else None,
                )
                raise err
        if verb != "watch" and any(f.action == "drop" for f in fired):
            raise Dropped()
        return [f for f in fired if f.action in ("gone", "drop", "nobookmarks")]

    # ------------------------------------------------------------------ chunked streams
    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
