"""The streaming answers: watches (initial events, bookmarks, resumption, injected drops and 410s)
and pod logs, followed or not.

Watch framing is kube-apiserver's over HTTP/1.1 (`WatchServer.HandleHTTP` behind Go's net/http):
each event is one `Write` of its JSON line into the response writer, which holds up to 2 KiB
(net/http's bufferBeforeChunkingSize) before the chunked encoder; a `Flush` follows whenever the
event channel is drained. So a live event, or one of 2 KiB or more written while nothing is
buffered (a fleet's pods), is a chunk of its own, while a backlog of small events (bookmarks,
small objects) shares chunks of at most 2 KiB, a line possibly cut between two (`GoChunks`)."""

from __future__ import annotations

import contextlib
import socket
import time
from datetime import timedelta
from typing import Any

import orjson

from kubesim.clock import parse_time
from kubesim.errors import ApiError
from kubesim.faults import Fault
from kubesim.handlerbase import HandlerBase, Route, accept_table, qs, qs_bool, qs_int, too_large_error
from kubesim.selectors import build_selector
from kubesim.store import Entry, Expired, Obj, TooLarge
from kubesim.tables import table_row, to_table

GO_CHUNK_BUFFER = 2048  # net/http: bufferBeforeChunkingSize


class GoChunks:
    """Go's chunked response body as net/http writes it: a `bufio.Writer` of GO_CHUNK_BUFFER bytes
    in front of the chunk encoder (a write that does not fit goes out in the same pieces
    `bufio.Writer.Write` makes: filling the buffer, or whole when the buffer is empty), and the
    framed chunks kept here until `flush` sends them in one socket write (the chunk boundaries the
    client sees are Go's; only the system calls are fewer)."""

    def __init__(self, send: Any) -> None:
        self._send = send  # the socket's write: bytes -> None
        self._buf = bytearray()  # the bufio.Writer's pending bytes: no chunk yet
        self._out = bytearray()  # framed chunks not sent yet
        self.chunks = 0

    def _chunk(self, data: bytes | bytearray | memoryview) -> None:
        self._out += b"%x\r\n" % len(data)
        self._out += data
        self._out += b"\r\n"
        self.chunks += 1
        if len(self._out) >= 1 << 16:
            self._send(bytes(self._out))
            self._out.clear()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while len(view) > GO_CHUNK_BUFFER - len(self._buf):
            if not self._buf:  # a large write, nothing buffered: one chunk of its own
                self._chunk(view)
                return
            room = GO_CHUNK_BUFFER - len(self._buf)
            self._buf += view[:room]
            view = view[room:]
            self._chunk(self._buf)
            self._buf.clear()
        self._buf += view

    def flush(self) -> None:
        """`http.Flusher.Flush`: what is buffered becomes a chunk, and everything goes out."""
        if self._buf:
            self._chunk(self._buf)
            self._buf.clear()
        if self._out:
            self._send(bytes(self._out))
            self._out.clear()

    def end(self) -> None:
        self.flush()
        self._send(b"0\r\n\r\n")


def watch_options_error(query: dict[str, list[str]], watch_list: bool) -> ApiError | None:
    """kube-apiserver's validation of a watch's ListOptions (1.27 on; `watch_list` is its WatchList
    feature gate): sendInitialEvents needs resourceVersionMatch=NotOlderThan and the gate, and
    resourceVersionMatch on a watch needs sendInitialEvents. Servers before 1.27 refuse any
    resourceVersionMatch on a watch, which reads the same to a client: 422 Invalid."""
    match = qs(query, "resourceVersionMatch")
    send_initial = "sendInitialEvents" in query
    causes: list[tuple[str, str, str]] = []  # (reason, field, message)
    if send_initial:
        if match != "NotOlderThan":
            causes.append(("FieldValueForbidden", "resourceVersionMatch",
                           "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"))
        if not watch_list:
            causes.append(("FieldValueForbidden", "sendInitialEvents",
                           "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"))
    if match:
        if not send_initial:
            causes.append(("FieldValueForbidden", "resourceVersionMatch",
                           "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"))
        if match != "NotOlderThan":
            causes.append(("FieldValueNotSupported", "resourceVersionMatch",
                           f'Unsupported value: "{match}": supported values: "NotOlderThan"'))
    return _invalid_options(causes) if causes else None


def list_options_error(query: dict[str, list[str]]) -> ApiError | None:
    """kube-apiserver's validation of a plain list's ListOptions, for what a client may carry over
    from a watch: sendInitialEvents (any value, even false) is for watches only: 422 Invalid."""
    if "sendInitialEvents" not in query:
        return None
    return _invalid_options([("FieldValueForbidden", "sendInitialEvents", "sendInitialEvents is forbidden for list")])


def _invalid_options(causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid for ListOptions, worded as kube-apiserver's field errors: (reason, field, message)."""
    kinds = {"FieldValueForbidden": "Forbidden", "FieldValueNotSupported": "Unsupported value"}
    texts = [f"{f}: {kinds[r]}: {m}" if r == "FieldValueForbidden" else f"{f}: {m}" for r, f, m in causes]
    listed = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    message = f'ListOptions.meta.k8s.io "" is invalid: {listed}'
    return ApiError(422, message, details={"group": "meta.k8s.io", "kind": "ListOptions", "causes": [
        {"reason": r, "message": (f"{kinds[r]}: {m}" if r == "FieldValueForbidden" else m), "field": f}
        for r, f, m in causes]})


class StreamHandler(HandlerBase):
    """The request handler's watch and log answers."""

    # ------------------------------------------------------------------ logs
    def _logs(self, r: Route, query: dict[str, list[str]]) -> None:
        store = self.sim.store
        pod = store.get(r.rt, r.namespace, r.name)
        spec = pod.get("spec") or {}
        names = [c.get("name") for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])]
        regular = [c.get("name") for c in spec.get("containers") or []]
        container = qs(query, "container")
        if not container:
            default = ((pod.get("metadata") or {}).get("annotations") or {}).get(
                "kubectl.kubernetes.io/default-container"
            )
            if len(regular) == 1:
                container = str(regular[0])
            elif default in names:
                container = str(default)
            else:
                raise ApiError.bad_request(
                    f"a container name must be specified for pod {r.name}, "
                    f"choose one of: [{' '.join(map(str, regular))}]"
                )
        if container not in names:
            raise ApiError.bad_request(f"container {container} is not valid for pod {r.name}")
        previous = qs_bool(query, "previous")
        if not spec.get("nodeName"):
            self._send(200, b"", "text/plain")  # not bound: no kubelet to ask, an empty stream
            return
        if not previous and not store.log_lines(r.namespace, r.name, container):
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            state = next((c.get("state") or {} for c in statuses if c.get("name") == container), {})
            if not state.get("running") and not state.get("terminated"):
                reason = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
                raise ApiError.bad_request(f'container "{container}" in pod "{r.name}" is waiting to start: {reason}')
        since = None
        if qs(query, "sinceTime"):
            since = parse_time(qs(query, "sinceTime"))
        elif qs_int(query, "sinceSeconds") is not None:
            since = self.sim.clock.now() - timedelta(seconds=qs_int(query, "sinceSeconds") or 0)
        kw: dict[str, Any] = {
            "previous": previous,
            "tail_lines": qs_int(query, "tailLines"),
            "limit_bytes": qs_int(query, "limitBytes"),
            "timestamps": qs_bool(query, "timestamps"),
            "since": since,
        }
        data, total = store.read_log(r.namespace, r.name, container, **kw)
        if not qs_bool(query, "follow") or previous:
            self._send(200, data, "text/plain")
            return
        self._start_stream("text/plain")
        self._chunk(data)
        sent = total
        seen_version = store.log_version
        deadline = time.monotonic() + self.sim.settings.default_watch_timeout_s
        while not store.closed and time.monotonic() < deadline:
            with store.cond:
                if store.log_version == seen_version and not store.closed:
                    store.cond.wait(timeout=1.0)
                seen_version = store.log_version
            try:
                store.get(r.rt, r.namespace, r.name)
            except ApiError:
                break
            data, total = store.read_log(r.namespace, r.name, container, timestamps=kw["timestamps"])
            if total > sent:
                lines = data.splitlines(keepends=True)
                self._chunk(b"".join(lines[-(total - sent) :]))
                sent = total
            elif total < sent:
                sent = total
        self._end_stream()

    # ------------------------------------------------------------------ watch
    def _watch(
        self, r: Route, query: dict[str, list[str]], gone: bool, drop: Fault | None, no_marks: bool = False
    ) -> None:
        store = self.sim.store
        settings = self.sim.settings
        rt = r.rt
        sel = build_selector(qs(query, "labelSelector"), qs(query, "fieldSelector"), rt.field_path)
        if r.name:
            sel = build_selector(
                qs(query, "labelSelector"),
                ",".join(filter(None, [qs(query, "fieldSelector"), f"metadata.name={r.name}"])),
                rt.field_path,
            )
        rv = qs(query, "resourceVersion")
        invalid = watch_options_error(query, self.sim.watch_list)
        if invalid is not None:
            raise invalid
        send_initial_raw = qs(query, "sendInitialEvents").lower()
        initial = send_initial_raw == "true" or (rv in ("", "0") and send_initial_raw != "false")
        bookmarks = qs_bool(query, "allowWatchBookmarks")
        timeout = qs_int(query, "timeoutSeconds")
        deadline = time.monotonic() + (
            timeout if timeout is not None and timeout > 0 else settings.default_watch_timeout_s
        )
        table = accept_table(self.headers.get("Accept", ""))
        include = qs(query, "includeObject") or "Metadata"
        sent = 0

        def encode(type_: str, item: Entry | Obj) -> bytes:
            if table:
                obj = store.to_view(rt, item.obj) if isinstance(item, Entry) else item
                tbl = to_table(
                    rt,
                    [],
                    self.sim.clock.now(),
                    {"resourceVersion": obj["metadata"]["resourceVersion"]},
                    include,
                    table,
                )
                tbl["rows"] = [table_row(rt, obj, self.sim.clock.now(), include)]
                return orjson.dumps({"type": type_, "object": tbl}) + b"\n"
            enc = orjson.dumps(store.to_view(rt, item.obj) if isinstance(item, Entry) else item)
            return b'{"type":"' + type_.encode() + b'","object":' + enc + b"}\n"

        def expired_line(message: str) -> bytes:
            return orjson.dumps({"type": "ERROR", "object": ApiError.expired(message).status()}) + b"\n"

        def bookmark(pos: int, initial_end: bool = False) -> bytes:
            meta: Obj = {"resourceVersion": str(pos), "creationTimestamp": None}
            if initial_end:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            return (
                orjson.dumps(
                    {
                        "type": "BOOKMARK",
                        "object": {"kind": rt.kind, "apiVersion": rt.group_version, "metadata": meta},
                    }
                )
                + b"\n"
            )

        self._start_stream("application/json")
        out = GoChunks(self.wfile.write)
        try:
            if gone:
                out.write(expired_line(f"too old resource version: {rv or 0} ({store.resource_version})"))
                out.end()
                return
            try:
                try:
                    watch = store.watch(rt, r.namespace, sel, rv, initial_events=initial)
                except TooLarge as exc:
                    if not store.wait_for(exc.rv, settings.too_large_wait_s):
                        # Like the watch cache: the watch is accepted, then one ERROR event says why.
                        status = too_large_error(exc, settings.too_large_retry_after_s,
                                                 settings.too_large_cause).status()
                        self.sim.count("too-large", rt.plural)
                        out.write(orjson.dumps({"type": "ERROR", "object": status}) + b"\n")
                        out.end()
                        return
                    watch = store.watch(rt, r.namespace, sel, rv, initial_events=initial)
            except Expired as exc:
                out.write(expired_line(str(exc)))
                out.end()
                return

            def send(lines: list[bytes]) -> bool:
                """One Write per event, as the API server's watch encoder does; False once an
                injected drop cut the connection."""
                nonlocal sent
                if drop is not None and sent + len(lines) > drop.after_events:
                    keep = drop.after_events - sent
                    for line in lines[:keep]:
                        out.write(line)
                    cut = lines[keep]
                    out.write(cut[: max(1, len(cut) // 2)])
                    out.flush()
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return False
                sent += len(lines)
                for line in lines:
                    out.write(line)
                return True

            pending = watch.initial or []
            watch.initial = None
            for i in range(0, len(pending), 512):  # encoded as they go out, not all at once
                if not send([encode("ADDED", o) for o in pending[i:i + 512]]):
                    return
            del pending
            lines = [bookmark(watch.pos, initial_end=True)] if send_initial_raw == "true" and bookmarks else []
            last_mark = time.monotonic()
            while not store.closed:
                if lines and not send(lines):
                    return
                out.flush()  # the backlog is drained: Flush
                now = time.monotonic()
                if now >= deadline:
                    break
                wait = min(deadline - now, 1.0)
                if bookmarks and not no_marks:
                    wait = max(0.0, min(wait, settings.bookmark_interval_s - (now - last_mark)))
                try:
                    batch = watch.poll(wait)
                except Expired as exc:
                    out.write(expired_line(str(exc)))
                    break
                lines = [encode(t, item) for t, item in batch]
                if bookmarks and not no_marks and time.monotonic() - last_mark >= settings.bookmark_interval_s:
                    lines.append(bookmark(watch.pos))
                    last_mark = time.monotonic()
            out.end()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
