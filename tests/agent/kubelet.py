"""A real gRPC server speaking the kubelet's pod-resources v1 `List` on a unix socket (loopback only),
with device-plugin devices and ResourceClaims' devices (`dynamic_resources`, DRA)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from collector.agent.podresources import podresources_v1_pb2

pb: Any = podresources_v1_pb2

# A ResourceClaim a container references: (claim namespace, claim name, [device]), each device a dict
# with `driver`, `pool`, `device` (absent: a kubelet before 1.31), `cdi` ([CDI names]), `share_id`.
ClaimSpec = tuple[str, str, list[dict[str, Any]]]
# (namespace, pod, [(container, resource, [device ids]) or (container, resource, [device ids], [claims])])
ContainerSpec = tuple[str, str, list[str]] | tuple[str, str, list[str], list[ClaimSpec]]
PodSpec = tuple[str, str, list[ContainerSpec]]


class PodResourcesServer:
    """`pods` may be replaced at any time; `stop()`/`start()` play a kubelet restart."""

    def __init__(self, pods: list[PodSpec] | None = None) -> None:
        # unix socket paths must be short (≤ 107 bytes): not under pytest's deep tmp_path
        self.dir = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
        self.socket = self.dir / "kubelet.sock"
        self.pods = pods or []
        self.calls = 0
        self.delay_s = 0.0  # answer this late (a kubelet under load)
        self.abort: tuple[Any, str] | None = None  # answer with this gRPC status and message instead
        self._lock = threading.Lock()
        self._server: Any = None

    def _list(self, request: Any, context: Any) -> Any:
        with self._lock:
            self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.abort is not None:
            context.abort(*self.abort)
        resp = pb.ListPodResourcesResponse()
        for ns, name, containers in self.pods:
            pr = resp.pod_resources.add(name=name, namespace=ns)
            for spec in containers:
                cname, resource, devices = spec[:3]
                c = pr.containers.add(name=cname)
                if devices:
                    c.devices.add(resource_name=resource, device_ids=devices)
                for claim_ns, claim, devs in (spec[3] if len(spec) > 3 else []):  # type: ignore[misc,unused-ignore]
                    dr = c.dynamic_resources.add(claim_name=claim, claim_namespace=claim_ns)
                    for d in devs:
                        cr = dr.claim_resources.add(driver_name=d.get("driver", ""), pool_name=d.get("pool", ""),
                                                    device_name=d.get("device", ""))
                        for name in d.get("cdi", []):
                            cr.cdi_devices.add(name=name)
                        if d.get("share_id") is not None:
                            cr.share_id = d["share_id"]
        return resp

    def start(self) -> PodResourcesServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=pb.ListPodResourcesRequest.FromString,
                response_serializer=pb.ListPodResourcesResponse.SerializeToString),
        })
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        if self.socket.exists():
            os.unlink(self.socket)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
