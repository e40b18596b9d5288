"""Faults injected through the simulator's fault API; after recovery the claims equal an
uninterrupted run's (issue 9). Loopback servers only, bounded waits."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest

from collector.controller import Controller
from collector.settings import ClaimSettings
from collector.sources.kube_api import KubeApi, Resource, api_client_for
from collector.sources.lease import LeaseElector
from collector.sources.watch import Reflector
from exporters.adx import AdxExporter
from exporters.prometheus import render
from kubesim.server import Simulator
from tests.controller.test_controller import FAST, T0, Clock, apply_run, observed, settings, wait_until
from tests.faults.streams import claim_rows, sink, stream_problems

REFERENCE_AGENT = "uninterrupted-reference"  # a controller the simulator's faults leave alone


def _reference(s: Simulator, clock: Clock, directory: Path) -> tuple[Controller, AdxExporter]:
    """An uninterrupted controller beside the faulted one: exempt from the injected faults (by its
    User-Agent), exporting its claim transitions to its own store."""
    s.faults.exempt_user_agents = (*s.faults.exempt_user_agents, REFERENCE_AGENT)
    client = api_client_for(s.base_url)
    client.user_agent = REFERENCE_AGENT
    exporter = sink(directory)
    c = Controller(KubeApi(client), settings(), clock.now, sink=exporter)
    c.open()
    wait_until(c.ready.is_set, what="reference ready")
    return c, exporter


def _close(c: Controller, exporter: AdxExporter) -> list[dict[str, Any]]:
    """Close a controller and its exporter; the claim transitions it exported."""
    c.close()
    exporter.close()
    return claim_rows(exporter.target.path)  # type: ignore[attr-defined]


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _claims(c: Controller) -> dict[str, dict[str, str]]:
    return {f"{r.ref.namespace}/{r.ref.name}": {k: v.observed.value for k, v in r.claims.items()}
            for r in c.claims.values()}


def test_outage_readyz_unknown_with_cause_then_recovery(tmp_path: Path) -> None:
    """Also the exported transitions: into unknown (the outage its reason) and back, none lost or
    repeated; without that excursion, those of a controller the outage spared."""
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        apply_run(s, "llm")
        cfg = replace(settings(), claims=replace(ClaimSettings(), evidence_max_age=timedelta(seconds=2)))
        ref, ref_sink = _reference(s, clock, tmp_path / "reference")
        exporter = sink(tmp_path / "faulted")
        c = Controller(KubeApi(api_client_for(s.base_url)), cfg, clock.now, sink=exporter)
        port = c.serve("127.0.0.1", 0)
        c.open()
        try:
            wait_until(lambda: observed(c, "llm").get("running") == "true", what="running")
            wait_until(lambda: _readyz(port) == 200, what="/readyz 200 once synced")
            before = _claims(c)
            assert b'taugrid_collector_leader{identity=""} 1.0' in render(c.registry)
            # The API stops answering: connections close before any response, watches are cut.
            s.faults.drop(count=None)
            s.faults.drop_watch(count=None)
            wait_until(lambda: _readyz(port) == 503, timeout=20, what="/readyz 503 past the evidence bound")
            clock.advance(10)  # past the bound on the evaluation clock too
            wait_until(lambda: observed(c, "llm").get("running") == "unknown", what="claims unknown")
            rc = next(r for r in c.claims.values() if r.ref.name == "llm")
            assert "Kubernetes API failing since" in rc.running.reason  # the cause, not only the age
            assert any(r.name == "llm" for r in c.exporter.runs())  # unknown, not vanished
            s.faults.clear()
            wait_until(lambda: _readyz(port) == 200, timeout=30, what="/readyz 200 again")
            wait_until(lambda: _claims(c) == before, timeout=30, what="claims as before the outage")
            rc = next(r for r in c.claims.values() if r.ref.name == "llm")
            assert "failing since" not in rc.running.reason
            wait_until(lambda: _claims(ref) == before, what="the reference agrees")
        finally:
            rows = _close(c, exporter)
            want = _close(ref, ref_sink)
    running = [(r["PreviousVerdict"], r["Observed"]) for r in sorted(rows, key=lambda r: r["Timestamp"])
               if r["Claim"] == "running"]
    # Into unknown with the outage (the run's own status goes stale too: unasserted), and back.
    assert running[0] == ("", "true") and running[-1][1] == "true" and running[1] == ("verified", "unknown"), running
    assert any("Kubernetes API failing since" in r["Reason"] for r in rows if r["Claim"] == "running")
    problems = stream_problems(rows, want, excursion=True)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("how", ["restart", "restore"])
def test_api_server_replaced_by_another_store_relists(how: str, tmp_path: Path) -> None:
    """restart: the server comes back on another (older) store; the reflector's store check sees its
    resourceVersion behind ours. restore: etcd restored under a running server while the reflectors'
    watches are on their way in: each watch is answered 504 "Too large resource version", as the
    real watch cache answers it, and the reflector relists from scratch as client-go's does.
    Both: the exported transitions, per run none lost or repeated, and those of the new store's runs
    end where a controller started on the new store has them."""
    clock = Clock(T0)
    fast = replace(FAST, too_large_wait_s=0.2)
    a = Simulator(settings=fast, watch_window=50, clock=clock)
    url = a.start()
    port = url.rsplit(":", 1)[1]
    apply_run(a, "old-run")
    apply_run(a, "kept")
    for i in range(20):  # move A's resourceVersion well past where B's will be
        apply_run(a, "kept", crash=i % 2 == 0)
    if how == "restore":
        # Hold every watch the controller opens after its first list long enough to swap the store.
        a.faults.delay(3.0, verbs=("watch",))
    exporter = sink(tmp_path / "faulted")
    c = Controller(KubeApi(api_client_for(a.base_url)), settings(), clock.now, sink=exporter)
    c.open()
    wait_until(c.ready.is_set, what="controller ready")
    b = a
    try:
        wait_until(lambda: observed(c, "old-run").get("running") == "true", what="old run seen")
        relists0 = c.registry.get_sample_value("taugrid_collector_relists_total", {"resource": "pods"}) or 0
        if how == "restart":
            a.close()  # the API server restarts on another (restored, older) store
            # Another seed: the simulator derives uids from it, and another store's objects have other uids.
            b = Simulator(settings=replace(fast, seed=1), watch_window=50, clock=clock)
            b.start(f"127.0.0.1:{port}")
        else:
            b.restore_store()
            b.faults.clear()
        apply_run(b, "kept")
        apply_run(b, "new-run", ns="team-b")
        wait_until(lambda: set(_claims(c)) == {"research/kept", "team-b/new-run"}, timeout=30,
                   what="claims of the new store only")
        assert observed(c, "kept")["running"] == "true"
        wait_until(lambda: (c.registry.get_sample_value("taugrid_collector_relists_total",
                                                        {"resource": "pods"}) or 0) > relists0,
                   timeout=5, what="the relist counted")
        if how == "restore":
            assert b.served("too-large", "pods") >= 1, b.requests  # the watch itself was refused
        # An uninterrupted controller that only ever saw the new store agrees.
        fresh, fresh_sink = _reference(b, clock, tmp_path / "reference")  # started on the new store
        wait_until(lambda: _claims(fresh) == _claims(c), what="the fresh controller agrees")
        want = _close(fresh, fresh_sink)
    finally:
        rows = _close(c, exporter)
        b.close()
        a.close()
    problems = stream_problems(rows)
    assert problems == [], "\n".join(problems)
    assert {r["RunUid"] for r in want} < {r["RunUid"] for r in rows}  # the new store's runs, and the old's
    last = {(r["RunUid"], r["Claim"]): (r["Verdict"], r["Observed"], r["Since"])
            for r in sorted(rows, key=lambda r: r["Timestamp"])}
    assert {(r["RunUid"], r["Claim"]): (r["Verdict"], r["Observed"], r["Since"]) for r in want} == {
        k: v for k, v in last.items() if k[0] in {r["RunUid"] for r in want}}


def test_too_new_resource_version_is_answered_like_the_api_server() -> None:
    """Lists (NotOlderThan; Exact on 1.34 on) and watches from a resourceVersion ahead of the store,
    through the official client: 504 Timeout "Too large resource version: X, current: Y" with a
    ResourceVersionTooLarge cause and retryAfterSeconds; a version reached within the wait is served."""
    import json
    import threading

    from kubernetes import client as k8s
    from kubernetes import watch as k8s_watch

    with Simulator(settings=replace(FAST, too_large_wait_s=0.3, git_version="v1.34.0")) as s:
        s.start()
        apply_run(s, "llm")
        api = k8s.ApiClient(k8s.Configuration(host=s.base_url))
        core = k8s.CoreV1Api(api)
        current = s.store.resource_version
        ahead = str(current + 100)
        for match in ("NotOlderThan", "Exact"):
            with pytest.raises(k8s.ApiException) as err:
                t0 = time.monotonic()
                core.list_pod_for_all_namespaces(resource_version=ahead, resource_version_match=match)
            assert time.monotonic() - t0 >= 0.3  # the watch cache waited for the version first
            assert err.value.status == 504
            body = json.loads(err.value.body)
            assert body["reason"] == "Timeout" and body["code"] == 504
            assert body["message"] == f"Timeout: Too large resource version: {ahead}, current: {current}"
            assert body["details"]["causes"] == [{"reason": "ResourceVersionTooLarge",
                                                  "message": "Too large resource version"}]
            assert body["details"]["retryAfterSeconds"] == 1
            assert err.value.headers["Retry-After"] == "1"
        with pytest.raises(k8s.ApiException) as err:  # the python client raises the watch's ERROR event
            for _ in k8s_watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=ahead,
                                              timeout_seconds=5):
                pass
        assert err.value.status == 504
        assert s.served("too-large", "pods") == 3
        # A version the store reaches while the server waits is served, not refused.
        nxt = str(s.store.resource_version + 1)
        threading.Timer(0.1, lambda: apply_run(s, "later")).start()
        listing = core.list_namespace(resource_version=nxt, resource_version_match="NotOlderThan")
        assert int(listing.metadata.resource_version) >= int(nxt)
        # The collector files both answers under "relist".
        from collector.sources.kube_api import Expired

        kube = KubeApi(api_client_for(s.base_url))
        with pytest.raises(Expired):
            kube.get_json("/api/v1/pods", [("resourceVersion", ahead), ("resourceVersionMatch", "NotOlderThan")])
        api.close()


@pytest.mark.parametrize("version", ["v1.32.0", "v1.33.4"])
def test_exact_list_ahead_of_etcd_before_1_34(version: str) -> None:
    """Before 1.34 an Exact list skips the watch cache: etcd refuses a revision it has not reached
    at once, and the apiserver passes that error on unconverted, a 500 without a reason (NotOlderThan
    still waits in the watch cache, then answers 504 too large).

    Upstream, kubernetes/apiserver at tag kubernetes-1.32.0 (9d863059eefcdf943210936d416f3c9af185f8dd):
    pkg/storage/cacher/cacher.go `shouldDelegateList` (any match but NotOlderThan goes to etcd);
    pkg/storage/etcd3/store.go `GetList` -> pkg/storage/etcd3/errors.go `interpretListError` (only
    ErrCompacted is converted); pkg/endpoints/handlers/responsewriters/status.go `ErrorToAPIStatus`
    (a non-Status error: 500, StatusReasonUnknown, the error's text); the etcd error text as the
    storage tests of 1.33 quote it. From kubernetes-1.34.0 (8335e368b67ae5489e4369fb2af0dcdd56b1573a)
    ListFromCacheSnapshot is on by default and `Cacher.shouldDelegateExactRV` keeps a future Exact
    list in the cache (pkg/storage/cacher/watch_cache.go `waitAndListExactRV` ->
    `waitUntilFreshLocked`: 3 s, then 504 with retryAfterSeconds 1), as the test above has it; etcd3
    itself answers 504 too large from commit fdccb8b2dc7b229ce26dc7e0e565577c455f8274 on."""
    from kubernetes import client as k8s

    wait = 0.5
    with Simulator(settings=replace(FAST, too_large_wait_s=wait, git_version=version)) as s:
        s.start()
        apply_run(s, "llm")
        api = k8s.ApiClient(k8s.Configuration(host=s.base_url))
        core = k8s.CoreV1Api(api)
        current = s.store.resource_version
        ahead = str(current + 100)
        t0 = time.monotonic()
        with pytest.raises(k8s.ApiException) as err:
            core.list_pod_for_all_namespaces(resource_version=ahead, resource_version_match="Exact", limit=10)
        assert time.monotonic() - t0 < wait  # no wait for the version
        assert err.value.status == 500
        body = orjson.loads(err.value.body)
        assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "etcdserver: mvcc: required revision is a future revision", "code": 500}
        assert "Retry-After" not in err.value.headers
        assert s.served("too-large", "pods") == 0
        # The version it has reached is listed exactly; NotOlderThan ahead still waits, then 504.
        exact = orjson.loads(core.list_pod_for_all_namespaces(
            resource_version=str(current), resource_version_match="Exact", _preload_content=False).data)
        assert exact["metadata"]["resourceVersion"] == str(current) and len(exact["items"]) >= 1
        t0 = time.monotonic()
        with pytest.raises(k8s.ApiException) as err:
            core.list_pod_for_all_namespaces(resource_version=ahead, resource_version_match="NotOlderThan")
        assert err.value.status == 504 and time.monotonic() - t0 >= wait
        assert s.served("too-large", "pods") == 1
        # The collector retries a 500 with backoff; it never relists on it.
        from collector.sources.kube_api import Expired, RetryableSourceError

        with pytest.raises(RetryableSourceError) as raised:
            KubeApi(api_client_for(s.base_url)).get_json(
                "/api/v1/pods", [("resourceVersion", ahead), ("resourceVersionMatch", "Exact")])
        assert not isinstance(raised.value, Expired)
        api.close()


def test_retry_after_is_honored(tmp_path: Path) -> None:
    """Also the exported transitions equal those of a controller the 429 spared."""
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        apply_run(s, "llm")
        ref, ref_sink = _reference(s, clock, tmp_path / "reference")
        s.faults.fail(429, count=1, verbs=("list",), resources=("pods",), retry_after_s=2)
        t0 = time.monotonic()
        exporter = sink(tmp_path / "faulted")
        c = Controller(KubeApi(api_client_for(s.base_url)), settings(), clock.now, sink=exporter)
        c.open()
        wait_until(c.ready.is_set, what="controller ready")
        try:
            waited = time.monotonic() - t0
            assert waited >= 1.9, f"synced {waited:.2f} s after a 429 asking for 2 s"
            wait_until(lambda: c.registry.get_sample_value("taugrid_collector_errors_total",
                                                           {"source": "pods", "class": "retryable"}) == 1,
                       timeout=5, what="the 429 counted")
            rule = s.faults.rules()
            assert not rule or rule[0].hits == 1
            apply_run(s, "llm", crash=True)  # and a transition after it
            wait_until(lambda: observed(c, "llm").get("running") == observed(ref, "llm").get("running") == "false",
                       what="both see the crash")
        finally:
            rows = _close(c, exporter)
            want = _close(ref, ref_sink)
    assert stream_problems(rows, want) == []


def test_leader_releases_its_lease_on_close() -> None:
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        s.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
        cfg = replace(settings().controller, leader_election=True, lease_namespace="default",
                      lease_renew=timedelta(seconds=0.2), lease_duration=timedelta(minutes=5))
        a = LeaseElector(KubeApi(api_client_for(s.base_url)), cfg, clock.now, identity="replica-a")
        b = LeaseElector(KubeApi(api_client_for(s.base_url)), cfg, clock.now, identity="replica-b")
        a.start()
        wait_until(lambda: a.is_leader, what="a leads")
        b.start()
        try:
            time.sleep(0.6)
            assert not b.is_leader  # a five-minute lease, renewed by a live holder
            a.stop()
            # No waiting out the lease duration (the clock does not move): b takes over at once.
            wait_until(lambda: b.is_leader, timeout=3, what="b leads after a released")
            lease = s.store.get(s.resource("coordination.k8s.io/v1", "Lease"), "default", cfg.lease_name)
            assert lease["spec"]["holderIdentity"] == "replica-b"
            assert lease["spec"]["leaseTransitions"] >= 1
            # b knows until when a led (its release): what b saw first before then, a wrote.
            assert b.led_until is not None and b.led_until >= T0
        finally:
            a.stop()
            b.stop()


def test_lease_expiry_is_measured_on_the_local_clock_not_by_renew_time() -> None:
    """As client-go: a Lease expires leaseDurationSeconds after this replica saw its record change.
    A clock far ahead (skew, or a simulator playing its scenario sped up) never ends a live leader's
    lease early, and a holder that stops renewing loses it once the duration passes locally."""
    clock = Clock(T0)
    with Simulator(settings=FAST, watch_window=50, clock=clock) as s:
        s.start()
        s.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
        cfg = replace(settings().controller, leader_election=True, lease_namespace="default",
                      lease_duration=timedelta(seconds=10))
        local = [0.0]
        a = LeaseElector(KubeApi(api_client_for(s.base_url)), cfg, clock.now, identity="replica-a")
        b = LeaseElector(KubeApi(api_client_for(s.base_url)), cfg, lambda: clock.now() + timedelta(hours=1),
                         identity="replica-b", monotonic=lambda: local[0])
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()  # an hour "past" a's renewTime, but just seen: live
        local[0] = 9.0
        assert not b.try_acquire_or_renew()  # a stopped renewing 9 s ago (b's clock): still live
        clock.advance(1)
        assert a.try_acquire_or_renew()  # a renews: a new record, observed anew
        local[0] = 18.0
        assert not b.try_acquire_or_renew()
        local[0] = 28.5
        assert b.try_acquire_or_renew()  # 10.5 s since the last renewal b saw
        lease = s.store.get(s.resource("coordination.k8s.io/v1", "Lease"), "default", cfg.lease_name)
        assert lease["spec"]["holderIdentity"] == "replica-b"


class _Sink:
    def __init__(self) -> None:
        self.synced = 0
        self.errors: list[Exception] = []

    def upsert(self, resource: Resource, obj: Any) -> None: ...
    def delete(self, resource: Resource, obj: Any) -> None: ...
    def replace(self, resource: Resource, objs: Any) -> None:
        list(objs)

    def mark_synced(self, resource: Resource, at: Any) -> None:
        self.synced += 1

    def source_error(self, resource: Resource, error: Exception) -> None:
        self.errors.append(error)

    def flush(self, resource: Resource) -> None: ...
    def watch_restarted(self, resource: Resource, relist: bool) -> None: ...


def test_bookmark_behind_our_version_means_another_store() -> None:
    import pytest

    from collector.sources.kube_api import Expired

    sink = _Sink()
    r = Reflector(None, Resource("Pod", "", "v1", "pods"), sink, lambda: T0)  # type: ignore[arg-type]
    r.resource_version = "500"
    r._apply({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "501"}}})
    assert r.resource_version == "501" and sink.synced == 1
    with pytest.raises(Expired, match="store changed"):
        r._apply({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "12"}}})
    assert sink.synced == 1  # that bookmark counted for nothing
    with pytest.raises(Expired):
        r._apply({"type": "ERROR", "object": {"kind": "Status", "code": 504, "reason": "Timeout",
                                              "message": "Too large resource version: 900, current: 12"}})


@pytest.mark.parametrize("cause", ["reason", "message", "none"])
def test_too_large_answer_of_every_server_age_means_relist(cause: Literal["reason", "message", "none"]) -> None:
    """The simulator answers "too large resource version" as API servers of each age did (the cause's
    reason from 1.18.6, its message only 1.17.0-1.18.5, no cause before); the collector files each
    under Expired (relist), for a list (an HTTP error) and a watch (an ERROR event after 200)."""
    from collector.sources.kube_api import Expired

    with Simulator(settings=replace(FAST, too_large_wait_s=0.1, too_large_cause=cause)) as s:
        s.start()
        apply_run(s, "llm")
        ahead = str(s.store.resource_version + 100)
        kube = KubeApi(api_client_for(s.base_url))
        with pytest.raises(Expired, match="HTTP 504"):
            kube.get_json("/api/v1/pods", [("resourceVersion", ahead), ("resourceVersionMatch", "NotOlderThan")])
        sink_ = _Sink()
        r = Reflector(kube, Resource("Pod", "", "v1", "pods"), sink_, lambda: T0, watch_timeout_s=5)  # type: ignore[arg-type]
        r.resource_version = ahead
        with pytest.raises(Expired, match="Timeout"):
            r.watch_once()
        assert s.served("too-large", "pods") == 2


def test_too_large_is_read_by_its_cause_first() -> None:
    """The ResourceVersionTooLarge cause decides, whatever the message says (a server that words it
    otherwise); without the cause, only a 504 Timeout with those words is one; other 504s are not."""
    from collector.sources.kube_api import Expired, RetryableSourceError, classify, is_too_large_rv

    cause = {"causes": [{"reason": "ResourceVersionTooLarge", "message": "zu neu"}], "retryAfterSeconds": 1}
    reworded = {"kind": "Status", "code": 504, "reason": "Timeout", "message": "Timeout: 900 > 12", "details": cause}
    assert is_too_large_rv(504, reworded)
    assert isinstance(classify(504, orjson.dumps(reworded), "GET /api/v1/pods"), Expired)
    sink_ = _Sink()
    r = Reflector(None, Resource("Pod", "", "v1", "pods"), sink_, lambda: T0)  # type: ignore[arg-type]
    with pytest.raises(Expired):
        r._apply({"type": "ERROR", "object": reworded})
    # Other timeouts are plain retryable errors, not a reason to drop our state and relist.
    other = {"kind": "Status", "code": 504, "reason": "Timeout", "message": "Timeout: request did not complete"}
    assert not is_too_large_rv(504, other)
    err = classify(504, orjson.dumps(other), "GET /api/v1/pods")
    assert isinstance(err, RetryableSourceError) and not isinstance(err, Expired)
    with pytest.raises(Exception) as raised:
        r._apply({"type": "ERROR", "object": other})
    assert not isinstance(raised.value, Expired)
    # The words alone count only on a timeout; a cause-less 500 that quotes them is not one.
    assert not is_too_large_rv(500, {"code": 500, "reason": "InternalError",
                                     "message": "Too large resource version: 9, current: 1"})
    assert is_too_large_rv(504, {"code": 504, "message": "Timeout: Too large resource version: 9, current: 1"})
    assert not is_too_large_rv(504, None)
