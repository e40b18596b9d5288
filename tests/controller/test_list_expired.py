"""A paged list that outruns the versions the API server keeps: a loaded controller listing a big
fleet while the cluster writes steadily gets 410 Gone on a continue page, and listing page by page
again would expire again, forever (the controller never ready: seen at 48,700 pods under a live
scenario on a loaded machine). The next list is then one snapshot: a streaming list where the server
serves them (1.32 on), else one unpaginated answer as client-go's pager does (FullListIfExpired);
the lists after it are paged again. Against the simulator, whose continue tokens expire past its
watch window as kube-apiserver's do past compaction."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from collector.kube_pod import PodObject
from collector.sources import watch
from collector.sources.decode import decoder_for
from collector.sources.kube_api import Expired, KubeApi, Resource, api_client_for
from collector.sources.watch import Reflector
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, wait_until

POD = Resource("Pod", "", "v1", "pods", optional=False)
PODS = 30
WINDOW = 20  # writes the simulator keeps: a continue token older than this answers 410


class WritingSink:
    """Consumes a list as the controller does, page by page, while the cluster writes (more than the
    window between two page requests, as long as `busy`)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim, self.busy, self.n = sim, True, 0
        self.listed: list[list[str]] = []
        self.errors: list[Exception] = []
        self.lock = threading.Lock()

    def replace(self, resource: Resource, objs: Any) -> None:
        names = []
        # Between two page requests, more writes than the window; along a streaming list (a generator,
        # objects as they arrive), a steady trickle; a whole list is one answer already read.
        limit = getattr(objs, "limit", None)
        every, writes = (limit, WINDOW + 5) if limit is not None else (5, 1)
        for i, obj in enumerate(objs):
            names.append(obj["metadata"]["name"])
            if self.busy and every and i % every == every - 1:
                for _ in range(writes):
                    self.n += 1
                    self.sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"w{self.n}"}})
        with self.lock:
            self.listed.append(names)

    def source_error(self, resource: Resource, error: Exception) -> None:
        self.errors.append(error)

    def upsert(self, resource: Resource, obj: Any) -> None: ...
    def delete(self, resource: Resource, obj: Any) -> None: ...
    def mark_synced(self, resource: Resource, at: Any) -> None: ...
    def flush(self, resource: Resource) -> None: ...
    def watch_restarted(self, resource: Resource, relist: bool) -> None: ...


def _pods(sim: Simulator) -> list[str]:
    sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}})
    names = [f"p{i:03d}" for i in range(PODS)]
    for n in names:
        sim.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "namespace": "t"},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    return names


def _lists(sim: Simulator) -> list[dict[str, str]]:
    return [q for verb, plural, q in sim.request_log if verb == "list" and plural == "pods"]


@pytest.mark.parametrize(("version", "mode"), [("v1.32.1", "stream"), ("v1.31.2", "whole")])
def test_after_an_expired_continue_page_the_next_list_is_one_snapshot_then_paged_again(
        monkeypatch: pytest.MonkeyPatch, version: str, mode: str) -> None:
    monkeypatch.setattr(watch, "LIST_PAGE", 5)
    with Simulator(settings=replace(FAST, watch_window=WINDOW, git_version=version)) as s:
        s.start()
        names = _pods(s)
        sink = WritingSink(s)
        r = Reflector(KubeApi(api_client_for(s.base_url)), POD, sink, lambda: T0, watch_timeout_s=5,  # type: ignore[arg-type]
                      decoder=decoder_for("v1", "Pod", full=True), stream_lists=False)
        with pytest.raises(Expired):
            r.relist()
        assert not sink.listed and not r.synced_once.is_set()
        assert [q.get("limit") for q in _lists(s)] == ["5", "5"] and "continue" in _lists(s)[1]
        lists, rv = len(_lists(s)), s.store.resource_version
        r.relist()  # the cluster still writes between pages: one snapshot, nothing to expire
        assert r.list_mode == mode and sorted(sink.listed[-1]) == names
        if mode == "whole":
            assert len(_lists(s)) == lists + 1 and "limit" not in _lists(s)[-1] and "continue" not in _lists(s)[-1]
        else:  # no list request at all: a watch with sendInitialEvents
            assert len(_lists(s)) == lists
        assert r.resource_version == str(rv)  # the snapshot's: the watch resumes from there
        sink.busy = False
        r.relist()
        assert r.list_mode == "pages" and sorted(sink.listed[-1]) == names
        assert _lists(s)[-1].get("limit") == "5"


@pytest.mark.parametrize(("version", "mode"), [("v1.32.1", "stream"), ("v1.31.2", "whole")])
def test_the_reflector_syncs_while_every_paged_list_would_expire(monkeypatch: pytest.MonkeyPatch, version: str,
                                                                 mode: str) -> None:
    monkeypatch.setattr(watch, "LIST_PAGE", 5)
    with Simulator(settings=replace(FAST, watch_window=WINDOW, git_version=version)) as s:
        s.start()
        names = _pods(s)
        sink = WritingSink(s)
        r = Reflector(KubeApi(api_client_for(s.base_url)), POD, sink, lambda: T0, watch_timeout_s=5,  # type: ignore[arg-type]
                      decoder=decoder_for("v1", "Pod", full=True), stream_lists=False)
        r.start()
        try:
            wait_until(r.synced_once.is_set, 20, "the reflector's first list")
        finally:
            r.stop()
        assert sorted(sink.listed[0]) == names and r.list_mode == mode
        assert len(sink.errors) == 1 and isinstance(sink.errors[0], Expired)


class KeepingSink(WritingSink):
    """Keeps each list's objects (no writes between pages)."""

    def __init__(self, sim: Simulator) -> None:
        super().__init__(sim)
        self.busy = False
        self.objects: list[list[Any]] = []

    def replace(self, resource: Resource, objs: Any) -> None:
        self.objects.append(list(objs))


def test_the_whole_list_is_read_off_the_socket_with_the_objects_the_pages_give() -> None:
    """The fallback's one answer is not read whole (`get_text`: the 2.2 GB peak at 48,700 pods) but item
    by item (tests/controller/test_whole_list.py), with the selective pod decoder's same objects."""
    with Simulator(settings=replace(FAST, git_version="v1.31.2")) as s:
        s.start()
        names = _pods(s)
        api = KubeApi(api_client_for(s.base_url))
        read_whole: list[Any] = []
        get_text = api.get_text

        def guarded(path: str, query: Any = ()) -> bytes:
            if path == POD.path and not dict(query).get("limit"):
                read_whole.append(query)
            out: bytes = get_text(path, query)
            return out
        api.get_text = guarded  # type: ignore[method-assign]
        sink = KeepingSink(s)
        r = Reflector(api, POD, sink, lambda: T0, watch_timeout_s=5,
                      decoder=decoder_for("v1", "Pod"), stream_lists=False)
        r._list_whole = True  # as after a continue page expired
        r.relist()
        assert r.list_mode == "whole" and not read_whole
        assert "limit" not in _lists(s)[-1]
        r.relist()
        assert r.list_mode == "pages" and _lists(s)[-1].get("limit") == str(watch.LIST_PAGE)
    whole, paged = sink.objects
    # (clean pods come typed, as watch frames do: collector/sources/decode.py)
    assert all(type(o) is PodObject for o in whole) and all(type(o) is PodObject for o in paged)
    assert whole == paged and sorted(o.metadata.name for o in whole) == names
