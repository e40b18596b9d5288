"""What the controller's API log reading costs the API server, pass by pass: GETs and bytes, the
operator's ceiling on them, what a ceiling left for the next pass and what was not read, and why
(collector/sources/logs.py). Plain numbers in: exporters see no sources."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge

SKIP_REASONS = ("agent", "rotation", "claims")


class LogPassMetrics:
    def __init__(self, registry: CollectorRegistry, *, max_gets: int, max_bytes: int) -> None:
        self._gets = Gauge("taugrid_collector_log_gets_per_pass",
                           "GETs of container logs through the API server (kubelet-proxied) in the last API log "
                           "pass, previous logs included.", registry=registry)
        self._bytes = Gauge("taugrid_collector_log_bytes_per_pass",
                            "Bytes of container logs read through the API server in the last API log pass.",
                            registry=registry)
        self._ceiling = Gauge("taugrid_collector_log_pass_ceiling",
                              "The most one API log pass may ask (limit: gets, bytes); 0: no ceiling.",
                              ["limit"], registry=registry)
        self._due = Gauge("taugrid_collector_log_due_per_pass",
                          "Containers due for an API log read in the last pass (after the skips).", registry=registry)
        self._deferred = Gauge("taugrid_collector_log_deferred_per_pass",
                               "Containers due in the last API log pass and not read because a ceiling was reached "
                               "(read first in the next pass; their evidence ages meanwhile).", registry=registry)
        self._skipped = Gauge("taugrid_collector_log_skipped_per_pass",
                              "Containers polled through the API and not read in the last pass, by reason (agent: a "
                              "node agent reads them; rotation: a quiet container's turn is another pass; claims: "
                              "its run's claims need no read before the next pass).", ["reason"], registry=registry)
        self._ceiling.labels("gets").set(max_gets)
        self._ceiling.labels("bytes").set(max_bytes)
        for r in SKIP_REASONS:
            self._skipped.labels(r)

    def update(self, *, gets: int, read_bytes: int, due: int, deferred: int, skipped: Mapping[str, int]) -> None:
        self._gets.set(gets)
        self._bytes.set(read_bytes)
        self._due.set(due)
        self._deferred.set(deferred)
        for r in SKIP_REASONS:
            self._skipped.labels(r).set(skipped.get(r, 0))
