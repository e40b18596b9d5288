"""Serving a registry: its own registry (not the global one), the HTTP endpoint, and collectors that
yield prepared metric families (`exporters.prometheus.render` uses them around the claims' text)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Metric, start_http_server
from prometheus_client.registry import Collector

__all__ = ["Fixed", "Group", "new_registry", "serve", "shutdown"]


def new_registry() -> CollectorRegistry:
    """A registry of our own: the global one would mix in process/platform collectors."""
    return CollectorRegistry(auto_describe=True)


class Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


class Group(Collector):
    def __init__(self, collectors: list[Collector]) -> None:
        self._collectors = collectors

    def collect(self) -> Iterable[Metric]:
        for c in self._collectors:
            yield from c.collect()


def serve(
    registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0
) -> tuple[WSGIServer, threading.Thread]:
    """Serve `registry` on http://host:port/metrics from a daemon thread; port 0 picks a free one.

    The bound port is `server.server_port`. Loopback by default: exposing it is a deployment choice.
    """
    return start_http_server(port, addr=host, registry=registry)


def shutdown(server: WSGIServer, thread: threading.Thread, timeout: float = 5.0) -> None:
    """Stop a server started by `serve` and release its socket."""
    server.shutdown()
    server.server_close()
    thread.join(timeout)
