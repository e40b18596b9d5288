"""The streaming answers: watches (initial events, bookmarks, resumption, injected drops and 410s)
and pod logs, followed or not."""

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
        try:
            if gone:
                self._chunk(expired_line(f"too old resource version: {rv or 0} ({store.resource_version})"))
                self._end_stream()
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
                        self._chunk(orjson.dumps({"type": "ERROR", "object": status}) + b"\n")
                        self._end_stream()
                        return
                    watch = store.watch(rt, r.namespace, sel, rv, initial_events=initial)
            except Expired as exc:
                self._chunk(expired_line(str(exc)))
                self._end_stream()
                return
            pending = watch.initial or []
            watch.initial = None
            lines = [encode("ADDED", o) for o in pending]
            if send_initial_raw == "true" and bookmarks:
                lines.append(bookmark(watch.pos, initial_end=True))
            last_mark = time.monotonic()
            while not store.closed:
                if lines:
                    if drop is not None and sent + len(lines) > drop.after_events:
                        keep = drop.after_events - sent
                        cut = lines[keep]
                        self._chunk(b"".join(lines[:keep]) + cut[: max(1, len(cut) // 2)])
                        self.close_connection = True
                        with contextlib.suppress(OSError):
                            self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    sent += len(lines)
                    self._chunk(b"".join(lines))
                now = time.monotonic()
                if now >= deadline:
                    break
                wait = min(deadline - now, 1.0)
                if bookmarks and not no_marks:
                    wait = max(0.0, min(wait, settings.bookmark_interval_s - (now - last_mark)))
                try:
                    batch = watch.poll(wait)
                except Expired as exc:
                    self._chunk(expired_line(str(exc)))
                    break
                lines = [encode(t, item) for t, item in batch]
                if bookmarks and not no_marks and time.monotonic() - last_mark >= settings.bookmark_interval_s:
                    lines.append(bookmark(watch.pos))
                    last_mark = time.monotonic()
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
