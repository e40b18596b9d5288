"""The run families that grow with the clock, rendered at the exporter's clock (issue 30).

Goodput, the run's time by bucket and its work at risk grow between evaluations: an evaluation says
what grows and from when (`Goodput.at`, `WorkAtRisk.at`), so the controller need not re-evaluate every
run to keep them current. Each run's lines in these families are prepared once per evaluation as rows:
bytes where nothing grows, else a small spec that writes its line at a clock, with the same arithmetic
as an evaluation at that instant (integer microseconds, as `timedelta.total_seconds` divides them), so
the text is what an evaluation then would export, byte for byte (tests/exporters/test_accrual_exposition.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from prometheus_client.utils import floatToGoString

from collector.model import RunClaims
from collector.timeunits import epoch_us
from exporters.prometheus_families import GOODPUT, RUN_TIME, TEMPLATES

CLOCK_FAMILIES = frozenset({"goodput", "run_time", "work_at_risk", "drain_exposure"})
MAX_EXPOSED_NODES = 8  # taugrid_run_drain_exposure_gpu_hours series per run, riskiest nodes first




def _fmt(v: float) -> bytes:
    return str(floatToGoString(v)).encode()  # type: ignore[no-untyped-call]


def _secs(now_us: int, since_us: int) -> float:
    return max(0.0, (now_us - since_us) / 10**6)  # = max(0.0, (now - since).total_seconds())


# Each spec holds its line as evaluated (`still`, at `at_us`): at or before that instant it is the line.


class Grows(NamedTuple):
    """A bucket of taugrid_run_time_seconds: `base` and a second a second since `since_us`; no line while
    it is 0 unless `always` (productive)."""

    still: bytes
    at_us: int
    series: bytes
    base: float
    since_us: int
    always: bool

    def line(self, now_us: int) -> bytes:
        if now_us <= self.at_us:
            return self.still
        v = self.base + _secs(now_us, self.since_us)
        return self.series + b" " + _fmt(v) + b"\n" if v or self.always else b""


class Ratio(NamedTuple):
    """taugrid_run_goodput_ratio: productive (fixed, or growing from `since_us`) over the allocation."""

    still: bytes
    at_us: int
    series: bytes
    productive: float
    since_us: int | None
    allocated_us: int

    def line(self, now_us: int) -> bytes:
        if now_us <= self.at_us:
            return self.still
        p = self.productive if self.since_us is None else self.productive + _secs(now_us, self.since_us)
        a = _secs(now_us, self.allocated_us)
        return self.series + b" " + _fmt(p / a) + b"\n" if a > 0 else b""


class AtRisk(NamedTuple):
    """GPU-hours at risk since `since_us` on the run's `gpus` GPUs (a node's share: `n` of them)."""

    still: bytes
    at_us: int
    series: bytes
    since_us: int
    gpus: int
    n: int | None

    def line(self, now_us: int) -> bytes:
        if now_us <= self.at_us:
            return self.still
        hours = _secs(now_us, self.since_us) / 3600 * self.gpus  # = riskfacts.gpu_hours
        v = hours if self.n is None else hours * self.n / self.gpus
        return self.series + b" " + _fmt(round(v, 4)) + b"\n"


Row = bytes | Grows | Ratio | AtRisk


def render(rows: list[Row], now_us: int) -> bytes:
    return b"".join(r if r.__class__ is bytes else r.line(now_us) for r in rows)  # type: ignore[union-attr]


def _line(series: bytes, value: float | None) -> bytes:
    return b"" if value is None else series + b" " + _fmt(value) + b"\n"


def clocked_rows(rc: RunClaims, body: str, run: dict[str, str], esc: Callable[[str], str]
                 ) -> dict[str, tuple[Row, ...]]:
    """The run's rows in CLOCK_FAMILIES. `body`: its run labels as written (`RUN_BODY`); `run`: the
    label values escaped; `esc`: how a label value is escaped."""
    out: dict[str, tuple[Row, ...]] = {}
    at = epoch_us(rc.evaluated_at)
    g = rc.goodput
    if g is not None:
        since = epoch_us(g.accrues_from) if g.accrues and g.accrues_from is not None else None
        series = f"{GOODPUT}{{{body}}}".encode()
        if g.rated and g.allocated_from is not None:
            p_grows = since if g.accrues == "productive" else None
            out["goodput"] = (Ratio(_line(series, g.ratio), at, series,
                                    g.accrues_base if p_grows is not None else g.productive_s, p_grows,
                                    epoch_us(g.allocated_from)),)
        elif g.ratio is not None:
            out["goodput"] = (_line(series, g.ratio),)
        rows: list[Row] = []
        for bucket, secs in (("productive", g.productive_s), *g.badput_s.items()):
            line = f'{RUN_TIME}{{bucket="{bucket}",{body}}}'.encode()  # (causes are fixed words)
            # A cause with no time yet adds nothing to any sum: no series until it has some.
            still = _line(line, secs) if secs or bucket == "productive" else b""
            if since is not None and bucket == g.accrues:
                rows.append(Grows(still, at, line, g.accrues_base, since, bucket == "productive"))
            elif still:
                rows.append(still)
        out["run_time"] = tuple(rows)
    w = rc.work_at_risk
    if w is not None and w.gpu_hours is not None:  # (a node's share is known only then)
        since_us = epoch_us(w.since) if w.grows and w.since is not None else None
        series = (TEMPLATES["work_at_risk"] % run).encode()
        still = _line(series, round(w.gpu_hours, 4))
        out["work_at_risk"] = (still if since_us is None else AtRisk(still, at, series, since_us, w.gpus, None),)
        exposed = [n for n in w.nodes if n.score > 0 and n.gpu_hours is not None][:MAX_EXPOSED_NODES]
        if exposed:
            rows = []
            for n in exposed:
                series = (TEMPLATES["drain_exposure"] % {**run, "node": esc(n.node)}).encode()
                still = _line(series, round(n.gpu_hours or 0.0, 4))
                rows.append(still if since_us is None else AtRisk(still, at, series, since_us, w.gpus, n.gpus))
            out["drain_exposure"] = tuple(rows)
    return out
