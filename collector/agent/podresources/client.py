"""The kubelet pod-resources API (gRPC v1 `List`) over its unix socket, cached on its own schedule.

Only the message classes are generated (`podresources_v1_pb2.py`, from `podresources_v1.proto`);
the one method is called through `grpc.Channel.unary_unary`, so no generated stub module is needed.
Mount the socket's directory, not the socket: a kubelet restart re-creates the socket file.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from collector.agent.podresources import podresources_v1_pb2

pb: Any = podresources_v1_pb2  # generated: message classes are made at import time

log = logging.getLogger("taugrid.agent.podresources")

LIST_METHOD = "/v1.PodResourcesLister/List"


class PodResourcesError(Exception):
    """The kubelet could not be asked (socket missing, kubelet restarting, timeout)."""


@dataclass(frozen=True, slots=True)
class Allocation:
    namespace: str
    pod: str
    container: str
    resource: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", ...
    device: str  # a GPU or MIG UUID as the device plugin names it (a `::N` replica suffix removed)


class PodResourcesClient:
    def __init__(self, socket: Path, *, timeout_s: float = 2.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self._channel: grpc.Channel | None = None
        self._list: grpc.UnaryUnaryMultiCallable | None = None

    def open(self) -> None:
        self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        self._list = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=pb.ListPodResourcesRequest.SerializeToString,
            response_deserializer=pb.ListPodResourcesResponse.FromString,
        )

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._list = None

    def list(self, prefixes: tuple[str, ...] = ("nvidia.com/",)) -> tuple[Allocation, ...]:
        """Every device allocation whose resource name starts with one of `prefixes`."""
        if not self.socket.exists():
            raise PodResourcesError(f"pod-resources socket {self.socket} does not exist (kubelet down or "
                                    "directory not mounted)")
        if self._list is None:
            self.open()
        assert self._list is not None
        try:
            resp = self._list(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            raise PodResourcesError(f"pod-resources List on {self.socket}: {code}: "
                                    f"{e.details() if hasattr(e, 'details') else e}") from e
        out = []
        for pod in resp.pod_resources:
            for c in pod.containers:
                for d in c.devices:
                    if not d.resource_name.startswith(prefixes):
                        continue
                    for dev in d.device_ids:
                        # time-slicing replicas are announced as "<uuid>::<n>"
                        out.append(Allocation(pod.namespace, pod.name, c.name, d.resource_name,
                                              dev.split("::", 1)[0]))
        return tuple(out)


class AttributionCache:
    """Refreshes allocations every `interval_s` on its own thread; readers never call the kubelet.

    A failed refresh keeps the last good answer until it is `max_age_s` old, then drops it (fail
    closed: a kubelet gone for long may have moved pods).
    """

    def __init__(self, client: PodResourcesClient, *, interval_s: float = 10.0, max_age_s: float = 120.0,
                 prefixes: tuple[str, ...] = ("nvidia.com/",)) -> None:
        self.client = client
        self.interval_s = interval_s
        self.max_age_s = max_age_s
        self.prefixes = prefixes
        self._allocations: tuple[Allocation, ...] = ()
        self._by_device: dict[str, tuple[Allocation, ...]] = {}
        self.last_success = 0.0  # unix seconds
        self.error = ""
        self.errors = 0
        self.refreshes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pod-resources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.interval_s)

    def refresh(self) -> None:
        try:
            allocs = self.client.list(self.prefixes)
        except PodResourcesError as e:
            self.errors += 1
            if self.error != str(e):
                log.warning("pod-resources unavailable", extra={"error": str(e)})
            self.error = str(e)
            # a channel to a socket that was re-created must be rebuilt
            self.client.close()
            if self.last_success and time.time() - self.last_success > self.max_age_s:
                self._set(())
            return
        self.error = ""
        self.refreshes += 1
        self.last_success = time.time()
        self._set(allocs)

    def _set(self, allocs: tuple[Allocation, ...]) -> None:
        by: dict[str, list[Allocation]] = {}
        for a in allocs:
            by.setdefault(a.device, []).append(a)
        # swapped whole: readers on other threads see the old or the new map, never a mix
        self._by_device = {k: tuple(sorted(v, key=lambda a: (a.namespace, a.pod, a.container)))
                           for k, v in by.items()}
        self._allocations = allocs

    @property
    def up(self) -> bool:
        return self.last_success > 0 and not self.error

    def allocations(self) -> tuple[Allocation, ...]:
        return self._allocations

    def holders(self, device: str) -> tuple[Allocation, ...]:
        return self._by_device.get(device, ())

    def pods(self) -> set[tuple[str, str]]:
        """(namespace, pod) of every pod holding a device."""
        return {(a.namespace, a.pod) for a in self._allocations}
