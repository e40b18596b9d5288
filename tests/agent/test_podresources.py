"""Attribution through a real gRPC pod-resources server on a unix socket."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from collector.agent.podresources import AttributionCache, PodResourcesClient, PodResourcesError
from tests.agent.kubelet import PodResourcesServer

G0 = "GPU-0a1b2c3d-0000-0000-0000-000000000000"
G1 = "GPU-0a1b2c3d-0000-0000-0000-000000000001"
MIG = "MIG-4f1e2d3c-0000-0000-0000-000000000000"


def _pods() -> list:
    return [
        ("research", "llm-worker-0", [("trainer", "nvidia.com/gpu", [G0, G1]), ("sidecar", "cpu", [])]),
        ("research", "small-0", [("main", "nvidia.com/mig-1g.10gb", [MIG])]),
        ("infra", "nic-user", [("app", "rdma/hca", ["mlx5_0"])]),  # not a GPU
        ("timeslice", "ts-0", [("a", "nvidia.com/gpu", [f"{G1}::1"])]),  # time-slicing replica of G1
    ]


def test_list_maps_devices_to_containers() -> None:
    with PodResourcesServer(_pods()) as kubelet:
        client = PodResourcesClient(kubelet.socket)
        try:
            allocs = client.list()
        finally:
            client.close()
    by = {(a.device, a.pod) for a in allocs}
    assert by == {(G0, "llm-worker-0"), (G1, "llm-worker-0"), (MIG, "small-0"), (G1, "ts-0")}
    a = next(x for x in allocs if x.device == MIG)
    assert (a.namespace, a.container, a.resource) == ("research", "main", "nvidia.com/mig-1g.10gb")


def test_missing_socket_is_a_clear_error(tmp_path: Path) -> None:
    client = PodResourcesClient(tmp_path / "kubelet.sock")
    with pytest.raises(PodResourcesError, match="does not exist"):
        client.list()


def test_cache_refreshes_on_its_schedule_and_survives_a_kubelet_restart() -> None:
    kubelet = PodResourcesServer(_pods()).start()
    cache = AttributionCache(PodResourcesClient(kubelet.socket, timeout_s=1), interval_s=0.1, max_age_s=60)
    try:
        cache.start()
        deadline = time.monotonic() + 5
        while not cache.up and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cache.up and [a.pod for a in cache.holders(G1)] == ["llm-worker-0", "ts-0"]
        # readers never call the kubelet: many reads, few calls
        calls = kubelet.calls
        for _ in range(1000):
            cache.holders(G0)
            cache.pods()
        assert kubelet.calls - calls <= 3
        kubelet.stop()  # kubelet restarting: socket gone
        while cache.up and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not cache.up and "does not exist" in cache.error
        assert cache.holders(G0), "last good answer kept within max_age"
        kubelet.pods = [("research", "llm-worker-1", [("trainer", "nvidia.com/gpu", [G0])])]
        kubelet.start()  # a new socket file: the client must reconnect
        deadline = time.monotonic() + 10
        while (not cache.up or cache.pods() != {("research", "llm-worker-1")}) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cache.up and [a.pod for a in cache.holders(G0)] == ["llm-worker-1"] and not cache.holders(G1)
    finally:
        cache.stop()
        kubelet.close()


def test_stale_attribution_is_dropped_after_max_age() -> None:
    with PodResourcesServer(_pods()) as kubelet:
        cache = AttributionCache(PodResourcesClient(kubelet.socket), interval_s=3600, max_age_s=0.2)
        cache.refresh()
        assert cache.holders(G0)
        kubelet.stop()
        cache.refresh()
        assert cache.holders(G0), "kept while younger than max_age"
        time.sleep(0.3)
        cache.refresh()
        assert not cache.holders(G0) and not cache.allocations(), "fail closed: too old to trust"
        cache.stop()


def test_a_dead_socket_is_unavailable_not_a_hang() -> None:
    """The kubelet died and left its socket file behind: List fails fast with UNAVAILABLE."""
    import socket as so
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
    path = d / "kubelet.sock"
    s = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    s.bind(str(path))  # bound, never listening: connections are refused
    client = PodResourcesClient(path, timeout_s=1)
    try:
        t0 = time.monotonic()
        with pytest.raises(PodResourcesError, match="UNAVAILABLE|DEADLINE"):
            client.list()
        assert time.monotonic() - t0 < 5
    finally:
        client.close()
        s.close()
        path.unlink()
        d.rmdir()


def test_the_call_speaks_grpc_to_a_real_grpc_server_errors_and_deadlines_included() -> None:
    """The agent's unary call over HTTP/2 (no gRPC runtime) against grpcio's own server: a status the
    server answers with is named, a kubelet slower than the timeout is a deadline, and an answer past
    HTTP/2's first flow-control window (64 KiB: 400 pods of 8 GPUs, ~100 KB) arrives whole."""
    import grpc

    big = [("research", f"p{i}", [("main", "nvidia.com/gpu", [f"GPU-{i:08d}-{g:04d}" for g in range(8)])])
           for i in range(400)]
    with PodResourcesServer(big) as kubelet:
        client = PodResourcesClient(kubelet.socket, timeout_s=5)
        assert len(client.list()) == 3_200
        kubelet.abort = (grpc.StatusCode.UNAVAILABLE, "kubelet is starting")
        with pytest.raises(PodResourcesError, match="UNAVAILABLE: kubelet is starting"):
            client.list()
        kubelet.abort, kubelet.delay_s = None, 1.0
        slow = PodResourcesClient(kubelet.socket, timeout_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(PodResourcesError, match="DEADLINE_EXCEEDED"):
            slow.list()
        assert time.monotonic() - t0 < 1.0


def test_an_answer_over_the_bound_or_not_grpc_costs_one_failed_call(tmp_path: Path) -> None:
    """A peer on the socket that floods, or speaks something else, fails the call with its reason
    within the deadline; the next call is unaffected."""
    import socket
    import threading

    from collector.agent.podresources import podresources_v1_pb2, unary
    from collector.agent.podresources.client import LIST_METHOD

    request = podresources_v1_pb2.ListPodResourcesRequest().SerializeToString()  # type: ignore[attr-defined]
    big = [("research", f"p{i}", [("main", "nvidia.com/gpu", [f"GPU-{i:08d}"])]) for i in range(500)]
    with PodResourcesServer(big) as kubelet:
        with pytest.raises(unary.UnaryError, match="RESOURCE_EXHAUSTED"):
            unary.call(str(kubelet.socket), LIST_METHOD, request, timeout_s=5, max_bytes=1024)
        assert len(unary.call(str(kubelet.socket), LIST_METHOD, request, timeout_s=5)) > 1024

    path = Path(kubelet.dir.parent / f"notgrpc-{tmp_path.name[:20]}.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def http1() -> None:
        conn, _ = srv.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        conn.close()

    t = threading.Thread(target=http1, daemon=True)
    t.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(unary.UnaryError) as err:
            unary.call(str(path), LIST_METHOD, request, timeout_s=2)
        assert err.value.code in ("INTERNAL", "UNAVAILABLE") and time.monotonic() - t0 < 2
    finally:
        srv.close()
        path.unlink(missing_ok=True)
