"""Ray scraping cannot be pointed at other hosts or forged by look-alike pods (issues 8 and 26).

A tenant writes RayJob status (`dashboardURL`), RayCluster status (`endpoints.metrics`) and can
create pods carrying any labels. Only the RayCluster's own head service is asked, only worker pods
the RayCluster owns are scraped, and a worker's URL is built from its pod IP, a port number and a
fixed path: status text never chooses a host or a path. What a tenant's endpoint answers comes
back in diagnostics only as a short, redacted snippet.
"""

from __future__ import annotations

from typing import Any

import pytest

from collector.controller import Controller
from collector.kube import normalize
from collector.model import Ref
from collector.planes.ray_heads import ray_targets_of
from collector.sources.kube_api import KubeApi, api_client_for
from collector.sources.ray import RayHead, RayPoller, RaySourceError, count_alive
from collector.sources.ray_urls import dashboard_url_for
from tests.controller.test_controller import T0, settings
from tests.security.hostile_http import http_server, ray_head

HEAD = "http://rc-head-svc.ns.svc.cluster.local:8265"


def worker(name: str, ip: str, *, owner: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                            "labels": {"ray.io/cluster": "rc", "ray.io/node-type": "worker"}}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "ray.io/v1", "controller": True, **owner}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": "n"},
            "status": {"phase": "Running", "podIP": ip}}


def targets(dashboard_url: str, pods: list[dict[str, Any]], *, metrics_port: str = "8080", **kw: Any) -> Any:
    c = Controller(KubeApi(api_client_for("http://127.0.0.1:9")), settings(**kw), lambda: T0)
    rj = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj", "namespace": "ns", "uid": "uid-rj"},
          "spec": {}, "status": {"rayClusterName": "rc", "jobId": "rj-abc", "dashboardURL": dashboard_url}}
    rcl = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
           "metadata": {"name": "rc", "namespace": "ns", "uid": "uid-rc",
                        "ownerReferences": [{"kind": "RayJob", "name": "rj", "uid": "uid-rj"}]},
           "spec": {}, "status": {"head": {"serviceName": "rc-head-svc"}, "endpoints": {"metrics": metrics_port}}}
    for obj in (rj, rcl, *pods):
        rec = normalize(obj).record
        assert rec is not None
        c.index.upsert(rec)
    [(_, target)] = ray_targets_of(c.index.evidence(Ref("RayJob", "ns", "rj")), c.cfg)
    return target


def test_only_pods_the_raycluster_owns_are_scraped() -> None:
    t = targets("rc-head-svc.ns.svc.cluster.local:8265", [
        worker("rc-worker-0", "10.1.0.1", owner={"kind": "RayCluster", "name": "rc", "uid": "uid-rc"}),
        worker("lookalike", "10.9.9.9", owner=None),  # labelled like a worker of rc, owned by nobody
        worker("other", "10.9.9.8", owner={"kind": "RayCluster", "name": "other-rc", "uid": "uid-x"}),
        worker("by-job", "10.9.9.6", owner={"kind": "Job", "name": "rc", "uid": "uid-j"}),
    ])
    assert t.worker_metrics_urls == ("http://10.1.0.1:8080/metrics",)


@pytest.mark.parametrize("url", [
    "169.254.169.254:80",  # cloud instance metadata
    "http://169.254.169.254/metadata/identity/oauth2/token",
    "kubernetes.default.svc:443",  # the API server
    "127.0.0.1:8265",
    "rc-head-svc.other-ns.svc.cluster.local:8265",  # a head service, of another namespace
    "attacker-svc.ns.svc.cluster.local:8265",  # another service in the run's namespace
    "rc-head-svc.ns.svc.cluster.local.attacker.example:8265",
    "http://user:pw@rc-head-svc.ns.svc.cluster.local:8265",
])
def test_a_dashboard_url_naming_another_host_is_refused(url: str) -> None:
    t = targets(url, [])
    assert t.dashboard_url == HEAD  # the run's own head service, from the RayCluster's status
    assert dashboard_url_for("ns", "rc", rayjob_dashboard_url=url) is None  # nothing else to fall back on


def test_the_head_service_in_its_usual_forms_is_accepted() -> None:
    for url in ("rc-head-svc.ns.svc.cluster.local:8265", "rc-head-svc.ns.svc:8265", "rc-head-svc.ns:8265",
                "http://rc-head-svc.ns.svc.cluster.local:8265/"):
        assert dashboard_url_for("ns", "rc", rayjob_dashboard_url=url) == HEAD
    assert dashboard_url_for("ns", "rc", rayjob_dashboard_url="rc-head-svc.ns.svc.cluster.local:9000") == \
        "http://rc-head-svc.ns.svc.cluster.local:9000"


OWNED = {"kind": "RayCluster", "name": "rc", "uid": "uid-rc"}


@pytest.mark.parametrize("port", [
    "1@169.254.169.254:80/any?",  # issue 26: userinfo, then the metadata host and a path of the tenant's
    "8080@169.254.169.254",
    "8080/../../latest/meta-data?",
    "8080#",
    "８０８０",  # full-width digits: int() takes them, a URL does not
    "²",  # str.isdigit() says yes, int() raises
    "99999",
    "0",
    "-1",
])
def test_a_metrics_port_in_status_never_chooses_the_host_or_the_path(port: str) -> None:
    t = targets("rc-head-svc.ns.svc.cluster.local:8265",
                [worker("rc-worker-0", "10.1.0.1", owner=OWNED)], metrics_port=port)
    assert t.worker_metrics_urls == ()  # refused, not repaired
    assert t.metrics_url is None  # the head's, from the same status field, too


@pytest.mark.parametrize("ip", ["169.254.169.254", "127.0.0.1", "0.0.0.0", "::ffff:169.254.169.254", "fe80::1",
                                "10.1.0.1:80@evil.example", "evil.example", "10.1.0.1/32"])
def test_a_worker_pod_ip_that_is_not_a_pod_address_is_not_scraped(ip: str) -> None:
    t = targets("rc-head-svc.ns.svc.cluster.local:8265", [worker("rc-worker-0", ip, owner=OWNED)])
    assert t.worker_metrics_urls == ()


def test_ipv6_workers_are_scraped_at_their_address() -> None:
    t = targets("rc-head-svc.ns.svc.cluster.local:8265", [worker("rc-worker-0", "fd00::1:5", owner=OWNED)],
                metrics_port="9100")
    assert t.worker_metrics_urls == ("http://[fd00::1:5]:9100/metrics",)


def test_a_hostile_metrics_port_sends_nothing_to_the_host_it_names() -> None:
    """The whole path, with real servers: the RayCluster's status names a "metadata" server on
    loopback through the userinfo trick. That server is never asked, and its answer (a token) is
    nowhere in what the poller returns."""
    imds_calls: list[str] = []
    token = b'{"access_token":"IMDS-SECRET-7f3a","expires_in":"3599","token_type":"Bearer"}'
    with http_server(lambda _: (200, "text/plain", token), imds_calls) as imds, \
            http_server(ray_head(step=7)) as head:
        imds_port = imds.rsplit(":", 1)[1]
        t = targets("", [worker("rc-worker-0", "10.1.0.1", owner=OWNED)],
                    metrics_port=f"1@127.0.0.1:{imds_port}/latest/meta-data?",
                    ray_dashboards={"ns/rc": head}, ray_metrics={"ns/rc": f"{head}/metrics"})
        [(_, runtime, sig)] = RayPoller().poll([t], T0)
    assert imds_calls == []
    assert "IMDS-SECRET" not in repr(runtime) + repr(sig)
    assert sig is not None and [s.step for s in sig.scan.samples] == [7]  # the head alone, scraped as usual


def test_what_a_tenant_endpoint_answers_is_quoted_short_and_redacted() -> None:
    """Diagnostics and errors quote a tenant's answer only as a bounded, redacted snippet: neither a
    credential the body names nor text past the first few dozen characters comes back."""
    pad = b"." * 80
    answers = {
        "/token": (200, "text/plain", b'{"access_token":"eyJ-SECRET-token-value","expires_in":"3599"}'),
        "/forbidden": (403, "text/html", b"<html>Forbidden " + pad + b" SECRET-PAST-THE-SNIPPET</html>"),
        "/garbage": (200, "text/plain", b"# comment\nnot a metric line " + pad + b" SECRET-PAST-THE-SNIPPET\n"),
    }
    with http_server(lambda path: answers.get(path, (404, "text/plain", b""))) as base:
        head = RayHead(base)
        for path in answers:
            with pytest.raises(RaySourceError) as e:
                head.metrics(base + path)
            message = str(e.value)
            assert "SECRET" not in message, message
            assert len(message) < len(base + path) + 200, message
    with pytest.raises(RaySourceError) as e:  # the state API's own message, as a hostile head writes it
        count_alive({"result": False, "msg": "refused " + "x" * 5000 + " SECRET"})
    assert "SECRET" not in str(e.value) and len(str(e.value)) < 120
