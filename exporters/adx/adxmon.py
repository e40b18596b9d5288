"""adx-mon's table shape, written from a Prometheus registry: the embedded default's stand-in for
adx-mon, so the queries that read metric tables (`*_adxmon.kql`) answer on a laptop too.

adx-mon scrapes `/metrics` and writes one table per metric, named by the metric in CamelCase, with
`Timestamp`, `SeriesId` (a hash of the labels), `Labels` (dynamic) and `Value`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry

from exporters.adx.rows import row_id
from exporters.adx.schema import ADX_MON_METRICS, adx_mon_table_name


def scrape(registry: CollectorRegistry, at: datetime,
           metrics: tuple[str, ...] = ADX_MON_METRICS) -> dict[str, list[dict[str, Any]]]:
    """One scrape of `registry` as adx-mon would store it: table → rows."""
    out: dict[str, list[dict[str, Any]]] = {}
    stamp = at.isoformat().replace("+00:00", "Z")
    for fam in registry.collect():
        for s in fam.samples:
            if s.name in metrics:
                labels = dict(sorted(s.labels.items()))
                out.setdefault(adx_mon_table_name(s.name), []).append({
                    "Timestamp": stamp, "SeriesId": int(row_id(s.name, labels)[:15], 16), "Labels": labels,
                    "Value": float(s.value)})
    return out
