"""Streaming lists (WatchList, KEP-3157) as kube-apiserver serves them, and refuses them: a watch
with sendInitialEvents=true and resourceVersionMatch=NotOlderThan sends the current state as ADDED,
then a BOOKMARK annotated `k8s.io/initial-events-end: "true"`, then the changes after it. Without
the WatchList feature gate (1.27-1.31 by default) the request is 422 Invalid."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Any

import pytest

from kubesim import Simulator, SimulatorSettings

STREAM = "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def _watch(sim: Simulator, query: str, lines: int) -> list[dict[str, Any]]:
    url = f"{sim.base_url}/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=2&{query}"
    out: list[dict[str, Any]] = []
    with urllib.request.urlopen(url, timeout=10) as resp:
        while len(out) < lines:
            line = resp.readline()
            if not line:
                break
            out.append(json.loads(line))
    return out


def _refusal(sim: Simulator, query: str) -> dict[str, Any]:
    with pytest.raises(urllib.error.HTTPError) as err:
        _watch(sim, query, 1)
    assert err.value.code == 422
    status: dict[str, Any] = json.loads(err.value.read())
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Invalid", 422)
    return status


def test_initial_events_then_the_end_bookmark_then_changes(sim: Simulator) -> None:
    for name in ("a", "b", "c"):
        sim.apply(_pod(name))
    at = sim.store.resource_version
    events = _watch(sim, STREAM, 4)
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events[:3]] == [
        ("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    end = events[3]
    assert end["type"] == "BOOKMARK"
    assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert end["object"]["metadata"]["resourceVersion"] == str(at)


def test_a_server_without_the_gate_refuses_with_422(sim: Simulator) -> None:
    sim.settings = replace(sim.settings, git_version="v1.31.4")
    assert not sim.watch_list
    status = _refusal(sim, STREAM)
    assert [c["field"] for c in status["details"]["causes"]] == ["sendInitialEvents"]
    assert "WatchList feature gate" in status["message"]
    sim.settings = replace(sim.settings, watch_list=True)  # a 1.31 server with the gate turned on
    assert _watch(sim, STREAM, 1)[0]["type"] == "BOOKMARK"


def test_the_gate_on_by_default_from_1_32() -> None:
    assert Simulator(settings=SimulatorSettings(git_version="v1.32.0")).watch_list
    assert not Simulator(settings=SimulatorSettings(git_version="v1.27.3")).watch_list
    assert not Simulator(settings=SimulatorSettings(git_version="v1.33.1", watch_list=False)).watch_list


@pytest.mark.parametrize(("query", "field"), [
    ("sendInitialEvents=true&allowWatchBookmarks=true", "resourceVersionMatch"),  # NotOlderThan is required
    ("resourceVersionMatch=NotOlderThan", "resourceVersionMatch"),  # only with sendInitialEvents
    ("sendInitialEvents=true&resourceVersionMatch=Exact", "resourceVersionMatch"),
])
def test_invalid_combinations_are_refused(sim: Simulator, query: str, field: str) -> None:
    status = _refusal(sim, query)
    assert field in {c["field"] for c in status["details"]["causes"]}


@pytest.mark.parametrize("value", ["true", "false"])
def test_a_plain_list_with_send_initial_events_is_refused(sim: Simulator, value: str) -> None:
    """ValidateListOptions: sendInitialEvents, whatever its value, is for watches: 422 Invalid."""
    url = f"{sim.base_url}/api/v1/namespaces/default/pods?sendInitialEvents={value}"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url, timeout=10)
    assert err.value.code == 422
    status = json.loads(err.value.read())
    assert (status["reason"], status["details"]["kind"]) == ("Invalid", "ListOptions")
    assert [c["field"] for c in status["details"]["causes"]] == ["sendInitialEvents"]
    assert "sendInitialEvents is forbidden for list" in status["message"]
    with urllib.request.urlopen(f"{sim.base_url}/api/v1/namespaces/default/pods", timeout=10) as resp:
        assert json.loads(resp.read())["kind"] == "PodList"  # without it, the same list is served


def test_a_streaming_list_from_a_version_ahead_waits_then_answers_too_large(sim: Simulator) -> None:
    """As the watch cache: a streaming list is not older than its resourceVersion; one the store has
    not reached is waited for (too_large_wait_s), then one ERROR event: 504 Timeout, too large."""
    sim.apply(_pod("a"))
    sim.settings = replace(sim.settings, too_large_wait_s=0.3)
    ahead = sim.store.resource_version + 50
    t = time.monotonic()
    events = _watch(sim, f"{STREAM}&resourceVersion={ahead}", 2)
    assert time.monotonic() - t >= 0.3
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["code"], status["reason"]) == (504, "Timeout")
    assert "Too large resource version" in json.dumps(status)


def test_a_streaming_list_from_a_version_ahead_is_served_once_the_store_reaches_it(sim: Simulator) -> None:
    sim.apply(_pod("a"))
    sim.settings = replace(sim.settings, too_large_wait_s=5.0)
    ahead = sim.store.resource_version + 1
    threading.Timer(0.3, lambda: sim.apply(_pod("b"))).start()
    events = _watch(sim, f"{STREAM}&resourceVersion={ahead}", 3)
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events[:2]] == [("ADDED", "a"), ("ADDED", "b")]
    assert events[2]["type"] == "BOOKMARK"
    assert events[2]["object"]["metadata"]["resourceVersion"] == str(ahead)
