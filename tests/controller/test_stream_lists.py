"""Streaming lists (WatchList) in the reflector, and the fall back to paginated lists.

Against the simulator: a 1.32 server streams the list (no list request at all) and the watch resumes
from the end bookmark; a 1.31 server refuses it with 422 and the reflector lists page by page from
then on, asking once. Against scripted streams: a server that accepts the watch but does not send
the initial-events-end bookmark (a plain bookmark first, another event type, the stream ending) is
no streaming list either; an ERROR is still an error. And the controller's index is the same
either way."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson
import pytest

from collector.controller import Controller
from collector.kube_pod import PodObject
from collector.sources.decode import decoder_for
from collector.sources.kube_api import Expired, KubeApi, Resource, api_client_for
from collector.sources.watch import Reflector
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, Clock, apply_run, settings, wait_until

POD = Resource("Pod", "", "v1", "pods", optional=False)


class Sink:
    def __init__(self) -> None:
        self.listed: list[list[Any]] = []
        self.upserts: list[Any] = []
        self.errors: list[Exception] = []
        self.lock = threading.Lock()

    def upsert(self, resource: Resource, obj: Any) -> None:
        with self.lock:
            self.upserts.append(obj)

    def delete(self, resource: Resource, obj: Any) -> None: ...

    def replace(self, resource: Resource, objs: Any) -> None:
        self.listed.append(list(objs))

    def mark_synced(self, resource: Resource, at: Any) -> None: ...

    def source_error(self, resource: Resource, error: Exception) -> None:
        self.errors.append(error)

    def flush(self, resource: Resource) -> None: ...
    def watch_restarted(self, resource: Resource, relist: bool) -> None: ...


def _name(obj: Any) -> str:
    return obj.metadata.name if type(obj) is PodObject else obj["metadata"]["name"]


def _streaming_requests(sim: Simulator) -> int:
    return sum(1 for verb, plural, q in sim.request_log if verb == "watch" and plural == "pods"
               and q.get("sendInitialEvents") == "true")


@pytest.mark.parametrize("decoder", ["typed", "full"])
def test_a_1_32_server_streams_the_list_and_the_watch_resumes_from_its_end(decoder: str) -> None:
    with Simulator(settings=FAST) as s:
        s.start()
        apply_run(s, "llm", workers=3)
        sink = Sink()
        r = Reflector(KubeApi(api_client_for(s.base_url)), POD, sink, lambda: T0, watch_timeout_s=5,  # type: ignore[arg-type]
                      decoder=decoder_for("v1", "Pod", full=decoder == "full"), stream_lists=True)
        r.relist()
        assert r.list_mode == "stream" and r.stream_lists
        assert sorted(map(_name, sink.listed[0])) == sorted(
            p["metadata"]["name"] for p in s.store.list_page(s.resource("v1", "Pod"), "", None).items)
        assert len(sink.listed[0]) == 3 and r.resource_version == str(s.store.resource_version)
        assert s.served("list", "pods") == 0 and _streaming_requests(s) == 1
        r.start()
        try:
            apply_run(s, "second", workers=1)
            wait_until(lambda: any(_name(o).startswith("second") for o in sink.upserts), what="a change after the list")
        finally:
            r.stop()
            r.join(10)
        assert s.served("list", "pods") == 0


def test_a_1_31_server_refuses_and_the_reflector_lists_pages_from_then_on() -> None:
    with Simulator(settings=replace(FAST, git_version="v1.31.2")) as s:
        s.start()
        apply_run(s, "llm", workers=2)
        sink = Sink()
        r = Reflector(KubeApi(api_client_for(s.base_url)), POD, sink, lambda: T0, watch_timeout_s=5,  # type: ignore[arg-type]
                      decoder=decoder_for("v1", "Pod"), stream_lists=True)
        r.relist()
        assert r.list_mode == "pages" and not r.stream_lists
        assert len(sink.listed[0]) == 2 and s.served("list", "pods") == 1
        r.relist()  # a relist (after a 410, say) does not ask again
        assert _streaming_requests(s) == 1 and s.served("list", "pods") == 2
        assert not sink.errors


class ScriptedApi:
    """A server that accepts the streaming watch and then sends `lines`; lists answer `items`."""

    def __init__(self, lines: list[dict[str, Any]], items: list[dict[str, Any]]) -> None:
        self.lines = [orjson.dumps(x) for x in lines]
        self.items = items
        self.opened: list[bool] = []
        self.lists = 0

    def open_watch(self, resource: Resource, rv: str, *, timeout_s: int, initial_events: bool = False,
                   read_timeout: float | None = None) -> Any:
        self.opened.append(initial_events)
        return object()

    def watch_lines(self, resource: Resource, raw: Any) -> Iterator[list[bytes]]:
        yield self.lines

    def iter_list(self, resource: Resource, *, limit: int = 500, decoder: Any = None) -> Any:
        api = self

        class Listing:
            resource_version = "77"

            def __iter__(self) -> Iterator[dict[str, Any]]:
                api.lists += 1
                yield from api.items
        return Listing()


def _pod(name: str, rv: str = "5") -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


def _event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def _bookmark(rv: str, end: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return _event("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": meta})


def _relist(lines: list[dict[str, Any]]) -> tuple[Reflector, ScriptedApi, Sink]:
    api = ScriptedApi(lines, [_pod("listed")])
    sink = Sink()
    r = Reflector(api, POD, sink, lambda: T0, decoder=decoder_for("v1", "Pod"), stream_lists=True)  # type: ignore[arg-type]
    r.relist()
    return r, api, sink


def test_the_end_bookmark_ends_the_list_at_its_version() -> None:
    r, api, sink = _relist([_event("ADDED", _pod("a")), _event("ADDED", _pod("b")), _bookmark("40", True),
                            _event("MODIFIED", _pod("a", "41"))])  # after the end: the watch's, not the list's
    assert (r.list_mode, r.resource_version, api.lists) == ("stream", "40", 0)
    assert [_name(o) for o in sink.listed[0]] == ["a", "b"]


@pytest.mark.parametrize("lines", [
    [_event("ADDED", _pod("a")), _bookmark("40", False)],  # a plain bookmark first: initial events ignored
    [_event("ADDED", _pod("a")), _event("MODIFIED", _pod("a", "9"))],  # not a list's event
    [_event("ADDED", _pod("a")), _event("DELETED", _pod("a", "9"))],
    [_event("ADDED", _pod("a"))],  # the stream ended with no end bookmark
], ids=["plain-bookmark", "modified", "deleted", "no-end"])
def test_no_end_bookmark_means_no_streaming_list(lines: list[dict[str, Any]]) -> None:
    r, api, sink = _relist(lines)
    assert (r.list_mode, r.resource_version, r.stream_lists, api.lists) == ("pages", "77", False, 1)
    assert [_name(o) for o in sink.listed[-1]] == ["listed"]  # the paginated list is what counts


def test_an_error_event_is_an_error_not_a_fall_back() -> None:
    gone = _event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
    with pytest.raises(Expired):
        _relist([_event("ADDED", _pod("a")), gone])


def test_the_controller_indexes_the_same_either_way() -> None:
    records = []
    for stream in (False, True):  # the controller setting `stream_lists`
        clock = Clock(T0)
        with Simulator(settings=FAST, clock=clock) as s:
            s.start()
            for i in range(3):
                apply_run(s, f"run-{i}", workers=2)
            c = Controller(KubeApi(api_client_for(s.base_url)), settings(stream_lists=stream), clock.now)
            c.open()
            try:
                wait_until(lambda c=c: c.synced, what="every resource listed")  # type: ignore[misc]
                assert {r.list_mode for r in c.watch.reflectors} == {"stream" if stream else "pages"}
                wait_until(lambda c=c: len(c.claims) == 3, what="claims")  # type: ignore[misc]
                records.append(sorted(map(repr, (c.index.get(*k) for k in c.index.keys_of_kind("Pod")))))
                # The fleet's lists only: the agents' discovery lists pods by a label of its own.
                pod_lists = sum(1 for verb, plural, q in s.request_log
                                if (verb, plural) == ("list", "pods") and "labelSelector" not in q)
            finally:
                c.close()
        assert pod_lists == 0 if stream else pod_lists >= 1
    assert records[0] == records[1] and len(records[0]) == 6
