"""A paged list that outruns the versions the API server keeps: a loaded controller listing a big
fleet while the cluster writes steadily gets 410 Gone on a continue page, and listing page by page
again would expire again, forever (the controller never ready: seen at 48,700 pods under a live
scenario on a loaded machine). The next list is then one unpaginated answer, as client-go's pager
does (FullListIfExpired), and the lists after it are paged again. Against the simulator, whose
continue tokens expire past its watch window as kube-apiserver's do past compaction."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

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
        paged = objs.limit > 0  # writes between two page requests (a whole list is one answer)
        for i, obj in enumerate(objs):
            names.append(obj["metadata"]["name"])
            if self.busy and paged and i % objs.limit == objs.limit - 1:  # a page consumed: others write
                for _ in range(WINDOW + 5):
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


def test_after_an_expired_continue_page_the_next_list_is_whole_then_paged_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "LIST_PAGE", 5)
    with Simulator(settings=replace(FAST, watch_window=WINDOW)) as s:
        s.start()
        names = _pods(s)
        sink = WritingSink(s)
        r = Reflector(KubeApi(api_client_for(s.base_url)), POD, sink, lambda: T0, watch_timeout_s=5,  # type: ignore[arg-type]
                      decoder=decoder_for("v1", "Pod", full=True), stream_lists=False)
        with pytest.raises(Expired):
            r.relist()
        assert not sink.listed and not r.synced_once.is_set()
        assert [q.get("limit") for q in _lists(s)] == ["5", "5"] and "continue" in _lists(s)[1]
        r.relist()  # the cluster still writes between pages: one answer, nothing to expire
        assert r.list_mode == "whole" and sorted(sink.listed[-1]) == names
        assert "limit" not in _lists(s)[-1] and "continue" not in _lists(s)[-1]
        assert r.resource_version == str(s.store.resource_version)
        sink.busy = False
        r.relist()
        assert r.list_mode == "pages" and sorted(sink.listed[-1]) == names
        assert _lists(s)[-1].get("limit") == "5"


def test_the_reflector_syncs_while_every_paged_list_would_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "LIST_PAGE", 5)
    with Simulator(settings=replace(FAST, watch_window=WINDOW)) as s:
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
        assert sorted(sink.listed[0]) == names and r.list_mode == "whole"
        assert len(sink.errors) == 1 and isinstance(sink.errors[0], Expired)
