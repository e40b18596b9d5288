"""The kubelet pod-resources API (gRPC v1 `List`) over its unix socket, cached on its own schedule.

Only the message classes are generated (`podresources_v1_pb2.py`, from `podresources_v1.proto`);
the one method is one unary call over HTTP/2 (`unary.py`): no gRPC runtime, no generated stub.
Device-plugin devices and ResourceClaims' devices (DRA, `dra.py`) both become `Allocation`s.
Mount the socket's directory, not the socket: a kubelet restart re-creates the socket file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from collector.agent.podresources import podresources_v1_pb2, unary
from collector.agent.podresources.dra import (
    GPU_DRIVERS,
    MAX_ALLOCATIONS,
    MAX_CDI,
    MAX_CDI_PER_DEVICE,
    MAX_RESOURCE,
    Allocation,
    Bounds,
    device_from_cdi,
    driver_from_cdi,
    literal_uuid,
)

pb: Any = podresources_v1_pb2  # generated: message classes are made at import time

log = logging.getLogger("taugrid.agent.podresources")

LIST_METHOD = "/v1.PodResourcesLister/List"


class PodResourcesError(Exception):
    """The kubelet could not be asked (socket missing, kubelet restarting, timeout)."""


class PodResourcesClient:
    def __init__(self, socket: Path, *, timeout_s: float = 2.0, node: str = "") -> None:
        self.socket = socket
        self.node = node  # names a claim's device where the kubelet names no pool (before 1.31)
        self.timeout_s = timeout_s
        self.rejected: dict[str, int] = {}  # names cut or cleaned in the last answer, by reason

    def open(self) -> None:
        """Nothing to open: each call connects (a kubelet restart re-creates the socket)."""

    def close(self) -> None:
        """Nothing held between calls."""

    def list(self, prefixes: tuple[str, ...] = ("nvidia.com/",),
             drivers: tuple[str, ...] = GPU_DRIVERS) -> tuple[Allocation, ...]:
        """Every device allocation whose resource name starts with one of `prefixes` (device
        plugins), and every device of a ResourceClaim whose DRA driver is one of `drivers`.
        What was cut or cleaned on the way is counted in `rejected` (reason → count, this call)."""
        if not self.socket.exists():
            raise PodResourcesError(f"pod-resources socket {self.socket} does not exist (kubelet down or "
                                    "directory not mounted)")
        try:
            answer = unary.call(str(self.socket), LIST_METHOD, pb.ListPodResourcesRequest().SerializeToString(),
                                timeout_s=self.timeout_s)
            resp = pb.ListPodResourcesResponse.FromString(answer)
        except unary.UnaryError as e:
            raise PodResourcesError(f"pod-resources List on {self.socket}: {e}") from e
        except DecodeError as e:  # a message that is not a ListPodResourcesResponse
            raise PodResourcesError(f"pod-resources List on {self.socket}: INTERNAL: undecodable answer: "
                                    f"{type(e).__name__}") from e
        b = Bounds()
        out: list[Allocation] = []
        for pod in resp.pod_resources:
            ns, name = b.name(pod.namespace), b.name(pod.name)
            for c in pod.containers:
                cname = b.name(c.name)
                for d in c.devices:
                    if not d.resource_name.startswith(prefixes):
                        continue
                    resource = b.name(d.resource_name, MAX_RESOURCE)
                    for dev in d.device_ids:
                        # time-slicing and MPS replicas are announced as "<uuid>::<n>"
                        uuid, replica, _ = dev.partition("::")
                        out.append(Allocation(ns, name, cname, resource, b.name(uuid), shared=bool(replica)))
                for dr in c.dynamic_resources:
                    claim = f"{b.name(dr.claim_namespace or pod.namespace)}/{b.name(dr.claim_name)}"
                    out.extend(_claim_devices(ns, name, cname, claim, dr.claim_resources, drivers, b, self.node))
        if len(out) > MAX_ALLOCATIONS:
            b.rejected["too-many"] += len(out) - MAX_ALLOCATIONS
            out = out[:MAX_ALLOCATIONS]
        self.rejected = dict(b.rejected)
        return tuple(out)


def _claim_devices(ns: str, pod: str, container: str, claim: str, resources: Any, drivers: tuple[str, ...],
                   b: Bounds, node: str) -> list[Allocation]:
    """The GPUs of one ResourceClaim a container references (other drivers' devices left out)."""
    out = []
    for r in resources:
        if len(r.cdi_devices) > MAX_CDI_PER_DEVICE:
            b.rejected["too-many"] += len(r.cdi_devices) - MAX_CDI_PER_DEVICE
        cdi = [b.name(x.name, MAX_CDI) for x in r.cdi_devices[:MAX_CDI_PER_DEVICE]]
        # a kubelet before 1.31 sends only the CDI names: the driver and device are read from them
        driver = b.name(r.driver_name, MAX_RESOURCE) or next((driver_from_cdi(x) for x in cdi if x), "")
        if driver not in drivers:
            continue
        device = b.name(r.device_name) or next((d for x in cdi if (d := device_from_cdi(x))), "")
        pool = b.name(r.pool_name)
        if not device:
            b.rejected["malformed"] += 1
            continue
        uuid = literal_uuid(device, *cdi)
        # unresolved: keyed by driver, pool (or node) and device, unique in the cluster as a UUID is
        out.append(Allocation(ns, pod, container, driver, uuid or f"{driver}/{pool or node}/{device}", claim=claim,
                              driver=driver, pool=pool, dra_device=device, shared=r.HasField("share_id"),
                              resolved=bool(uuid)))
    return out


class AttributionCache:
    """Refreshes allocations every `interval_s` on its own thread; readers never call the kubelet.

    A failed refresh keeps the last good answer until it is `max_age_s` old, then drops it (fail
    closed: a kubelet gone for long may have moved pods).
    """

    def __init__(self, client: PodResourcesClient, *, interval_s: float = 10.0, max_age_s: float = 120.0,
                 prefixes: tuple[str, ...] = ("nvidia.com/",), drivers: tuple[str, ...] = GPU_DRIVERS,
                 resolver: Callable[[tuple[Allocation, ...]], tuple[Allocation, ...]] | None = None) -> None:
        self.client = client
        self.interval_s = interval_s
        self.max_age_s = max_age_s
        self.prefixes = prefixes
        self.drivers = drivers
        self.resolver = resolver  # DRA devices → GPU UUIDs (`dra.DraResolver`)
        self.rejected: Counter[str] = Counter()  # names cut or cleaned since start, by reason
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
            allocs = self.client.list(self.prefixes, self.drivers)
        except PodResourcesError as e:
            self.errors += 1
            if self.error != str(e):
                log.warning("pod-resources unavailable", extra={"error": str(e)})
            self.error = str(e)
            if self.last_success and time.time() - self.last_success > self.max_age_s:
                self._set(())
            return
        self.rejected.update(self.client.rejected)
        if self.resolver is not None:
            try:
                allocs = self.resolver(allocs)
            except Exception:  # a resolver failing must not cost the device-plugin attribution
                log.exception("DRA device resolution failed")
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
