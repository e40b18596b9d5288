"""index.html: a self-contained page (inline SVG, no network) a person reads at a glance.

Built from `timeline.json` (already redacted), so `bundle redact` can rebuild it. The page's
Content-Security-Policy forbids every fetch; its one inline script only checks that the charts
rendered and records the result on the page (the browser test reads it).
"""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any

from collector.kube import parse_time
from collector.model import CLAIM_NAMES

W, LEFT, RIGHT = 1100, 150, 20
COLORS = {"true": "#2e7d32", "false": "#c62828", "unknown": "#9e9e9e", "": "#e0e0e0"}
STAGE_COLORS = {"target-resolution": "#6a1b9a", "queue-admission": "#ef6c00", "pod-scheduling": "#1565c0",
                "device-allocation": "#00838f", "node-scaling": "#5d4037"}

_CHECK = """
(function () {
  var charts = document.querySelectorAll('svg.chart');
  var drawn = 0;
  charts.forEach(function (svg) {
    var box = svg.getBoundingClientRect();
    if (box.width > 0 && box.height > 0 && svg.querySelectorAll('[data-mark]').length > 0) { drawn++; }
  });
  var fetched = (performance.getEntriesByType('resource') || []).length;
  var out = document.getElementById('selfcheck');
  out.setAttribute('data-charts', String(charts.length));
  out.setAttribute('data-drawn', String(drawn));
  out.setAttribute('data-fetched', String(fetched));
  out.setAttribute('data-status', drawn === charts.length && fetched === 0 ? 'ok' : 'incomplete');
  out.textContent = drawn + ' of ' + charts.length + ' charts rendered, ' + fetched + ' network fetches';
})();
"""

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#212121}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 6px}
.meta{color:#616161} table{border-collapse:collapse;margin-top:6px}
td,th{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;vertical-align:top;font-size:13px}
.v-verified,.v-true{color:#2e7d32}.v-contradicted,.v-false{color:#c62828}.v-unknown,.v-unconfirmed{color:#757575}
svg text{font:11px system-ui,sans-serif;fill:#424242} .missing{color:#c62828}
#selfcheck{color:#9e9e9e;font-size:11px;margin-top:24px}
"""


def _t(s: str | None) -> datetime | None:
    if not s:
        return None
    try:
        return parse_time(s)
    except ValueError:
        return None


class _Scale:
    def __init__(self, start: datetime, end: datetime) -> None:
        self.start = start
        self.span = max((end - start).total_seconds(), 1.0)

    def x(self, t: datetime | None) -> float:
        if t is None:
            return LEFT
        f = (t - self.start).total_seconds() / self.span
        return LEFT + max(0.0, min(1.0, f)) * (W - LEFT - RIGHT)


def _axis(sc: _Scale, y: float, end: datetime) -> str:
    out = [f'<line x1="{LEFT}" y1="{y}" x2="{W - RIGHT}" y2="{y}" stroke="#bdbdbd"/>']
    for i in range(6):
        t = sc.start + (end - sc.start) * (i / 5)
        x = sc.x(t)
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#bdbdbd"/>'
                   f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle">{t.strftime("%m-%d %H:%M:%S")}</text>')
    return "".join(out)


def _claims_chart(d: dict[str, Any], sc: _Scale, end: datetime) -> str:
    lanes = d.get("lanes") or []
    rows = len(lanes) + 2
    h = rows * 28 + 30
    out = [f'<svg class="chart" id="claims-chart" width="{W}" height="{h}" role="img" '
           f'aria-label="claims timeline">']
    y = 8
    for lane in lanes:
        out.append(f'<text x="8" y="{y + 14}">{escape(str(lane.get("claim", "")))}</text>')
        for seg in lane.get("segments") or []:
            x1, x2 = sc.x(_t(seg.get("from"))), sc.x(_t(seg.get("to")) or end)
            obs = str(seg.get("observed", ""))
            tip = f'{lane.get("claim")}: {seg.get("verdict")} (observed {obs}) from {seg.get("from")} — ' \
                  f'{seg.get("reason", "")}'
            out.append(f'<rect data-mark="claim" x="{x1:.1f}" y="{y}" width="{max(x2 - x1, 1.5):.1f}" height="20" '
                       f'fill="{COLORS.get(obs, "#e0e0e0")}"><title>{escape(tip)}</title></rect>')
        y += 28
    out.append(f'<text x="8" y="{y + 14}">blocked stage</text>')
    for seg in d.get("blocked") or []:
        x1, x2 = sc.x(_t(seg.get("from"))), sc.x(_t(seg.get("to")) or end)
        stage = str(seg.get("stage", ""))
        out.append(f'<rect data-mark="blocked" x="{x1:.1f}" y="{y}" width="{max(x2 - x1, 1.5):.1f}" height="20" '
                   f'fill="{STAGE_COLORS.get(stage, "#9e9e9e")}"><title>{escape(stage)}: '
                   f'{escape(str(seg.get("reason", "")))}</title></rect>'
                   f'<text x="{x1 + 4:.1f}" y="{y + 14}" style="fill:#fff">{escape(stage)}</text>')
    y += 28
    out.append(f'<text x="8" y="{y + 14}">events</text>')
    for ev in d.get("events") or []:
        x = sc.x(_t(ev.get("at")))
        color = "#c62828" if ev.get("type") == "Warning" else "#1565c0"
        out.append(f'<circle data-mark="event" cx="{x:.1f}" cy="{y + 10}" r="5" fill="{color}" fill-opacity="0.7">'
                   f'<title>{escape(str(ev.get("at")))} {escape(str(ev.get("reason")))} '
                   f'{escape(str(ev.get("object")))}: {escape(str(ev.get("message", ""))[:300])}</title></circle>')
    y += 28
    out.append(_axis(sc, y, end))
    out.append("</svg>")
    return "".join(out)


def _line_chart(chart_id: str, series: list[tuple[str, list[tuple[datetime, float]]]], sc: _Scale, end: datetime,
                unit: str, height: int = 180) -> str:
    values = [v for _, pts in series for _, v in pts]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi <= lo:
        hi = lo + 1.0
    top, bottom = 10, height - 30

    def y(v: float) -> float:
        return bottom - (v - lo) / (hi - lo) * (bottom - top)

    palette = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#ad1457"]
    out = [f'<svg class="chart" id="{chart_id}" width="{W}" height="{height}" role="img" aria-label="{chart_id}">',
           f'<text x="8" y="{top + 10}">{hi:,.4g} {escape(unit)}</text><text x="8" y="{bottom}">{lo:,.4g}</text>']
    for i, (label, pts) in enumerate(series[:16]):
        color = palette[i % len(palette)]
        coords = " ".join(f"{sc.x(t):.1f},{y(v):.1f}" for t, v in pts)
        if len(pts) == 1:
            t, v = pts[0]
            out.append(f'<circle data-mark="point" cx="{sc.x(t):.1f}" cy="{y(v):.1f}" r="3" fill="{color}">'
                       f'<title>{escape(label)}: {v:,.4g}</title></circle>')
        elif pts:
            out.append(f'<polyline data-mark="line" fill="none" stroke="{color}" stroke-width="1.5" '
                       f'points="{coords}"><title>{escape(label)}</title></polyline>')
        out.append(f'<text x="{W - RIGHT - 260}" y="{top + 12 + 13 * i}" style="fill:{color}">'
                   f'{escape(label[:48])}</text>')
    out.append(_axis(sc, bottom, end))
    out.append("</svg>")
    return "".join(out)


def _progress_series(d: dict[str, Any]) -> tuple[list[tuple[str, list[tuple[datetime, float]]]],
                                                 list[tuple[str, list[tuple[datetime, float]]]]]:
    by_source: dict[str, list[tuple[datetime, float]]] = {}
    for p in d.get("progress") or []:
        t = _t(p.get("at"))
        if t is not None and isinstance(p.get("step"), int | float):
            by_source.setdefault(str(p.get("source")), []).append((t, float(p["step"])))
    steps, rates = [], []
    for src, pts in sorted(by_source.items()):
        pts.sort()
        steps.append((src, pts))
        r = []
        for (t0, s0), (t1, s1) in zip(pts, pts[1:], strict=False):
            dt = (t1 - t0).total_seconds()
            if dt > 0:
                r.append((t1, max(0.0, (s1 - s0) / dt * 60)))
        if r:
            rates.append((src, r))
    return steps, rates


def render_page(d: dict[str, Any]) -> str:
    end = _t(d.get("end")) or _t(d.get("captured_at"))
    start = _t(d.get("start")) or end
    if end is None or start is None:
        raise ValueError("timeline.json: no time range")
    sc = _Scale(start, end)
    parts = [
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">",
        f"<title>{escape(str(d.get('run')))} evidence</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(str(d.get('run')))}</h1>",
        f"<div class=\"meta\">{escape(str(d.get('kind', '')))} · captured {escape(str(d.get('captured_at')))} "
        f"({escape(str(d.get('trigger', '')))}) · {escape(str(d.get('start')))} → {escape(str(d.get('end')))}</div>",
        "<h2>Claims now</h2><table><tr><th>claim</th><th>verdict</th><th>observed</th><th>reason</th></tr>",
    ]
    now = d.get("claims_now") or {}
    for name, c in sorted(now.items(), key=lambda kv: (CLAIM_NAMES + (kv[0],)).index(kv[0])):
        v, o = str(c.get("verdict")), str(c.get("observed"))
        parts.append(f"<tr><td>{escape(name)}</td><td class=\"v-{escape(v)}\">{escape(v)}</td>"
                     f"<td class=\"v-{escape(o)}\">{escape(o)}</td><td>{escape(str(c.get('reason', '')))}</td></tr>")
    parts.append("</table>")
    if d.get("hang"):
        parts.append(f"<h2>Hang analysis (NCCL flight recorder)</h2><p>{escape(str(d['hang']))}</p>")
    parts.append("<h2>Timeline: claims, blocked stages, events</h2>")
    parts.append(_claims_chart(d, sc, end))
    steps, rates = _progress_series(d)
    parts.append("<h2>Progress</h2>")
    if steps:
        parts.append(_line_chart("progress-steps", steps, sc, end, "step"))
        if rates:
            parts.append(_line_chart("progress-rate", rates, sc, end, "steps/min", 150))
    else:
        parts.append("<p class=\"missing\">no dated progress samples</p>")
    parts.append("<h2>GPU activity</h2>")
    gpu = d.get("gpu")
    if gpu:
        util: dict[str, list[tuple[datetime, float]]] = {}
        power: dict[str, list[tuple[datetime, float]]] = {}
        for g in gpu:
            t = _t(g.get("at"))
            if t is None:
                continue
            label = f"{g.get('node')}/{g.get('gpu')}"
            if isinstance(g.get("utilization"), int | float):
                util.setdefault(label, []).append((t, float(g["utilization"])))
            if isinstance(g.get("power_w"), int | float):
                power.setdefault(label, []).append((t, float(g["power_w"])))
        if util:
            parts.append(_line_chart("gpu-utilization", sorted(util.items()), sc, end, "% util", 150))
        if power:
            parts.append(_line_chart("gpu-power", sorted(power.items()), sc, end, "W", 150))
    else:
        parts.append(f"<p class=\"missing\">missing: {escape(str(d.get('gpu_missing') or 'no agent'))}</p>")
    parts.append("<h2>Events</h2><table><tr><th>last seen</th><th>type</th><th>reason</th><th>object</th>"
                 "<th>count</th><th>message</th></tr>")
    for ev in (d.get("events") or [])[-200:]:
        parts.append(f"<tr><td>{escape(str(ev.get('at')))}</td><td>{escape(str(ev.get('type')))}</td>"
                     f"<td>{escape(str(ev.get('reason')))}</td><td>{escape(str(ev.get('object')))}</td>"
                     f"<td>{escape(str(ev.get('count')))}</td><td>{escape(str(ev.get('message', ''))[:500])}</td></tr>")
    parts.append("</table>")
    if d.get("missing"):
        parts.append("<h2>Missing from this bundle</h2><ul>")
        parts += [f"<li>{escape(str(m.get('what')))}: {escape(str(m.get('why')))}</li>" for m in d["missing"]]
        parts.append("</ul>")
    parts.append("<div id=\"selfcheck\" data-status=\"pending\">charts not checked</div>")
    parts.append(f"<script>{_CHECK}</script></body></html>\n")
    return "".join(parts)
