"""Grafana 11 dashboards as code: `python dashboards/build.py` writes the JSON files beside it and
the chart's copy (charts/taugrid-evidence/dashboards/), `--check` exits 1 when a file differs from
what this script builds (CI keeps them in step).

Plain dicts in Grafana's dashboard JSON model (schemaVersion 39, Grafana 11), over the `taugrid_`
families of docs/metrics.md. Every PromQL here is evaluated against a real Prometheus in
tests/dashboards, which scrapes the controller (simulator scenario) and a node agent (NVML scripted
at the pynvml boundary, a real gRPC pod-resources server) and must get data for each.
The fleet (ADX) dashboard runs the KQL files of queries/ verbatim in Azure Data Explorer panels:
tests/adx checks each file with Microsoft's parser and runs it on duckdb-kql, and tests/dashboards
checks that every ADX panel is exactly one of those files.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
# Multi-cluster Prometheus (Thanos, Mimir, a federating Prometheus): each series names its cluster in
# `cluster` (an external or target label, the kubernetes-mixin convention). Every selector of every
# query matches `$cluster`; its "All" (`.*`) also matches series without the label (one cluster).
# Aggregations that keep a run or a node keep `cluster` too: two clusters may hold a run or a node
# of the same name.
CLUSTER = 'cluster=~"$cluster"'
_SELECTOR = re.compile(r"\b(taugrid_[a-z0-9_]+|up)\b(\{([^}]*)\})?")
RUN = 'namespace="$namespace", run="$run"'
AGENT_POD = 'namespace="$namespace", pod=~"$run-.*"'  # the agent labels GPUs by pod, not by run
CONTROLLER_JOB = 'job=~".*taugrid-evidence-controller"'
AGENT_JOB = 'job=~".*taugrid-evidence-agent"'

ADX = {"type": "grafana-azure-data-explorer-datasource", "uid": "${adx}"}
QUERIES = HERE.parent / "queries"
# The chart ships them as ConfigMaps for Grafana's sidecar (grafanaDashboards): a copy inside the chart.
CHART_COPY = HERE.parent / "charts" / "taugrid-evidence" / "dashboards"

Panel = dict[str, Any]


def scoped(expr: str) -> str:
    """`expr` with the cluster matcher in every vector selector."""
    def add(m: re.Match[str]) -> str:
        inner = m.group(3)
        return f"{m.group(1)}{{{CLUSTER}{', ' + inner if inner else ''}}}"
    return _SELECTOR.sub(add, expr)


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"refId": ref, "datasource": DS, "expr": scoped(expr), "legendFormat": legend or "__auto"}
    if instant:
        t.update(instant=True, range=False, format="table")
    return t


def panel(kind: str, title: str, targets: list[dict[str, Any]], *, unit: str, description: str, w: int = 12,
          h: int = 8, options: dict[str, Any] | None = None, **defaults: Any) -> Panel:
    """Every panel says what it shows and in which unit (Grafana's unit ids: "s", "percentunit",
    "short" for a plain count, "none" for a 0/1 or label-only value)."""
    if not unit or not description:
        raise ValueError(f"panel {title!r}: a unit and a description are required")
    field_defaults: dict[str, Any] = dict(defaults)
    field_defaults["unit"] = unit
    return {
        "type": kind, "title": title, "datasource": DS, "targets": targets, "description": description,
        "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
        "fieldConfig": {"defaults": field_defaults, "overrides": []},
        "options": options or {},
    }


def stat(title: str, expr: str, **kw: Any) -> Panel:
    return panel("stat", title, [target(expr)], w=kw.pop("w", 4), h=kw.pop("h", 4),
                 options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "colorMode": "value", "graphMode": "area"}, **kw)


def series(title: str, *exprs: tuple[str, str], **kw: Any) -> Panel:
    targets = [target(e, legend, ref=chr(ord("A") + i)) for i, (e, legend) in enumerate(exprs)]
    return panel("timeseries", title, targets, options={"legend": {"displayMode": "list", "placement": "bottom",
                                                                    "showLegend": True},
                                                         "tooltip": {"mode": "multi", "sort": "desc"}}, **kw)


def table(title: str, expr: str, **kw: Any) -> Panel:
    return panel("table", title, [target(expr, instant=True)], w=kw.pop("w", 24),
                 options={"showHeader": True, "cellHeight": "sm"}, **kw)


def layout(panels: list[Panel]) -> list[Panel]:
    """Ids in order, and grid positions filled left to right, top to bottom (24 columns)."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        g = p["gridPos"]
        if x + g["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        g["x"], g["y"] = x, y
        x += g["w"]
        row_h = max(row_h, g["h"])
        p["id"] = i
    return panels


def var_datasource() -> dict[str, Any]:
    return {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus",
            "hide": 0, "refresh": 1, "options": [], "regex": ""}


def var_query(name: str, query: str, *, multi: bool = False) -> dict[str, Any]:
    v: dict[str, Any] = {"type": "query", "name": name, "label": name, "datasource": DS,
                         "query": {"query": scoped(query), "refId": f"var-{name}", "qryType": 1},
                         "definition": scoped(query), "refresh": 2, "sort": 1, "options": [],
                         "hide": 0, "multi": multi, "includeAll": multi, "regex": ""}
    if multi:
        v["allValue"] = ".*"
    return v


def var_cluster() -> dict[str, Any]:
    """`cluster`, from the collector's and agents' own scrape targets; All by default, so that a
    single-cluster Prometheus (no `cluster` label anywhere) shows everything."""
    query = 'label_values(up{job=~".*taugrid-evidence-(controller|agent)"}, cluster)'
    return {"type": "query", "name": "cluster", "label": "cluster", "datasource": DS,
            "query": {"query": query, "refId": "var-cluster", "qryType": 1}, "definition": query,
            "refresh": 2, "sort": 1, "options": [], "hide": 0, "multi": True, "includeAll": True,
            "allValue": ".*", "regex": "", "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}


def dashboard(uid: str, title: str, description: str, panels: list[Panel],
              variables: list[dict[str, Any]], time_from: str = "now-6h") -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["taugrid", "gpu", "training"],
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "timezone": "browser",
        "refresh": "30s", "time": {"from": time_from, "to": "now"}, "timepicker": {},
        "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
        "templating": {"list": [var_datasource(), var_cluster(), *variables]},
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [{"title": "TauGrid", "type": "dashboards", "tags": ["taugrid"], "asDropdown": True,
                   "icon": "external link", "includeVars": True, "keepTime": True, "targetBlank": False,
                   "tooltip": "", "url": ""}],
        "panels": layout(panels),
    }


def fleet() -> dict[str, Any]:
    live = "unless on (cluster, namespace, run, kind) taugrid_run_finished == 1"
    return dashboard("taugrid-fleet", "TauGrid / Fleet overview",
                     "Every run's claims, where waits are and who owns them, and where GPU time goes.", [
        stat("Runs tracked", "max(taugrid_collector_runs_tracked)", unit="short",
             description="Runs in the collector's index, finished ones included (the leader's count)."),
        stat("Contradicted", 'count(max by (cluster, namespace, run, kind) '
             f'(taugrid_run_claim_state{{verdict="contradicted"}} == 1) {live}) or vector(0)', unit="short",
             description="Unfinished runs whose status asserts something the evidence contradicts."),
        stat("Stalled", 'count(max by (cluster, namespace, run, kind) '
             f'(taugrid_run_claim_state{{claim="progressing", observed="false"}} == 1) {live}) or vector(0)',
             unit="short", description="Unfinished runs whose progressing claim is observed false (stalled, hung, "
                                       "not running, or replaying after a restart)."),
        stat("Blocked", f"count(max by (cluster, namespace, run, kind) (taugrid_run_blocked == 1) {live}) or vector(0)",
             unit="short", description="Unfinished runs waiting to be scheduled, whatever the stage."),
        stat("Fleet goodput", 'sum(taugrid_run_time_seconds{bucket="productive"}) / sum(taugrid_run_time_seconds)',
             unit="percentunit", description="Productive time over allocated time, all runs."),
        stat("Evaluation lag", "time() - min(taugrid_run_evaluated_timestamp_seconds)", unit="s",
             description="Age of the oldest claim evaluation: grows when the collector's loop falls behind."),
        series("Runs by claim and verdict",
               ("count by (claim, verdict) (taugrid_run_claim_state == 1)", "{{claim}} {{verdict}}"), w=24,
               unit="short", description="Runs per claim (scheduled, running, progressing) and verdict over time."),
        panel("bargauge", "Blocked runs by owner", [target("count by (owner) (taugrid_run_blocked == 1)",
                                                           "{{owner}}", instant=True)], unit="short",
              description="Runs waiting to be scheduled, by who owns the wait (TauGrid, Kueue, Kubernetes, "
                          "device plugin/DRA, node scaling).",
              options={"orientation": "horizontal", "displayMode": "gradient",
                       "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}),
        series("Blocked runs by stage", ("count by (stage) (taugrid_run_blocked == 1)", "{{stage}}"), unit="short",
               description="Runs waiting to be scheduled, by the stage that owns the wait."),
        panel("bargauge", "Goodput by namespace", [target(
            'sum by (namespace) (taugrid_run_time_seconds{bucket="productive"}) '
            "/ sum by (namespace) (taugrid_run_time_seconds)", "{{namespace}}", instant=True)],
              unit="percentunit", min=0, max=1,
              description="Productive time over allocated time, per namespace (all its runs).",
              options={"orientation": "horizontal", "displayMode": "gradient",
                       "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}),
        panel("piechart", "Where allocated time went", [target("sum by (bucket) (taugrid_run_time_seconds)",
                                                               "{{bucket}}", instant=True)], unit="s",
              description="All runs' time by bucket: productive, or the badput cause (queued, starting, "
                          "stalled, restarting, replaying, unobserved).",
              options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                       "pieType": "donut", "legend": {"displayMode": "table", "placement": "right",
                                                      "showLegend": True, "values": ["value", "percent"]}}),
        table("Runs needing attention", 'max by (cluster, namespace, run, kind, claim, verdict) '
              f'(taugrid_run_claim_state{{verdict=~"contradicted|unconfirmed"}} == 1) {live}', unit="none",
              description="Unfinished runs with a claim contradicted by the evidence or not confirmed by it "
                          "(`taugrid-evidence explain` shows why)."),
        table("Longest waits", "topk(20, max by (cluster, namespace, run, kind, stage, owner) "
              "(taugrid_run_blocked_age_seconds))", unit="s",
              description="The 20 runs waiting longest to be scheduled, with the stage and owner of the wait."),
    ], [], time_from="now-24h")


def run() -> dict[str, Any]:
    return dashboard("taugrid-run", "TauGrid / Run drill-down",
                     "One run: its claims over time, progress and its rate, where its time went, evidence "
                     "freshness, GPU activity of its pods.", [
        panel("state-timeline", "Claims: verdict", [target(
            f"max by (claim, verdict) (taugrid_run_claim_state{{{RUN}}})", "{{claim}}: {{verdict}}")], w=24,
              unit="none", description="Each claim's verdict over time: its status compared with the evidence.",
              options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8}),
        panel("state-timeline", "Claims: observed", [target(
            f"max by (claim, observed) (taugrid_run_claim_state{{{RUN}}})", "{{claim}}: {{observed}}")], w=24,
              unit="none", description="What the independent evidence shows for each claim: true, false or unknown.",
              options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8}),
        series("Newest step", (f"max(taugrid_run_progress_last_step{{{RUN}}})", "step"), w=8, unit="short",
               description="The newest training step seen advancing (log line, Ray counter or checkpoint)."),
        series("Step rate", (f"clamp_min(deriv(taugrid_run_progress_last_step{{{RUN}}}[5m]), 0)", "steps/s"), w=8,
               unit="short",
               description="Steps per second over 5 minutes. TaugridRunSlowedDown fires 10 min under 85% of the "
                           "run's median rate of the hour before (recording rule "
                           "taugrid:run_step_rate_baseline:median1h)."),
        table("Straggler suspects",
              f"max by (rank, pod, node, uuid, basis) (taugrid_run_straggler{{{RUN}}})", unit="percentunit",
              description="The rank, pod or GPU holding the run back, from outside the trainer: how much slower "
                          "per step than its peers (arrival: last to print each step; pace: its own steps take "
                          "longer; gpu-spread: a GPU whose readings sit apart while the run is slower than its "
                          "baseline). At most 3 per run; `taugrid-evidence explain` gives the evidence, "
                          "TaugridRunStraggler and TaugridGpuFailSlow alert on them (docs/runbooks.md)."),
        stat("Since last progress", f"time() - max(taugrid_run_last_progress_timestamp_seconds{{{RUN}}})",
             unit="s", w=4, description="Time since the newest step was seen."),
        stat("Goodput", f"max(taugrid_run_goodput_ratio{{{RUN}}})", unit="percentunit", w=4,
             description="Productive time over allocated time for this run."),
        series("Time by bucket", (f"max by (bucket) (taugrid_run_time_seconds{{{RUN}}})", "{{bucket}}"),
               unit="s", w=8, description="The run's life so far, by bucket: productive or a badput cause."),
        series("Evidence age by plane", (f"max by (plane) (taugrid_run_evidence_age_seconds{{{RUN}}})",
                                         "{{plane}}"), unit="s", w=8,
               description="Age of the newest evidence from each plane; past its bound a claim turns unknown."),
        series("Waiting to be scheduled", (f"max by (stage, owner) (taugrid_run_blocked_age_seconds{{{RUN}}})",
                                           "{{stage}} ({{owner}})"), unit="s", w=8,
               description="How long the run has waited in its current stage, and who owns the wait."),
        series("Place in the Kueue queue", (f"max by (queue) (taugrid_run_queue_position{{{RUN}}})", "{{queue}}"),
               unit="short", w=8,
               description="While the run waits for Kueue quota: its 0-based position in its ClusterQueue (cluster) "
                           "and LocalQueue (local), from Kueue's visibility API. The admission estimate is "
                           "taugrid_run_admission_eta_seconds and `taugrid-evidence explain` (docs/queue-eta.md)."),
        series("Claim changes", (f"sum by (claim) (changes(taugrid_run_claim_since_timestamp_seconds{{{RUN}}}[5m]))",
                                 "{{claim}}"), w=8, unit="short",
               description="Transitions of each claim's observed value (events in Kubernetes terms "
                           "are in `taugrid-evidence explain`)."),
        series("GPU utilization per pod", (f"avg by (pod, gpu) (taugrid_gpu_utilization_ratio{{{AGENT_POD}}})",
                                           "{{pod}} gpu {{gpu}}"), unit="percentunit", w=8,
               description="NVML utilization of each GPU the run's pods hold (near 100% in a hung collective too)."),
        series("GPU power per pod", (f"sum by (pod) (taugrid_gpu_power_watts{{{AGENT_POD}}})", "{{pod}}"),
               unit="watt", w=8, description="Power drawn by each pod's GPUs: low power at high utilization "
                                             "points to a hang."),
        series("Hang hint per pod", (f"max by (pod, gpu) (taugrid_gpu_hang_hint{{{AGENT_POD}}})",
                                     "{{pod}} gpu {{gpu}}"), w=8, unit="none",
               description="1: utilization high while power and SM activity stay low (suspected collective hang)."),
    ], [var_query("namespace", "label_values(taugrid_run_finished, namespace)"),
        var_query("run", 'label_values(taugrid_run_finished{namespace="$namespace"}, run)')])


def gpu() -> dict[str, Any]:
    sel, nd = 'node=~"$node"', "cluster, node"
    return dashboard("taugrid-gpu", "TauGrid / GPU health",
                     "XIDs, lost GPUs, throttling and activity per node, from the node agents.", [
        stat("GPUs lost", f"sum(taugrid_gpu_lost{{{sel}}})", w=6, unit="short",
             description="GPUs NVML reports lost (fallen off the bus)."),
        stat("XIDs (1h)", f"sum(increase(taugrid_gpu_xid_errors_total{{{sel}}}[1h]))", w=6, unit="short",
             description="XID events in the last hour, all codes."),
        stat("Agents up", f"sum(up{{{AGENT_JOB}}})", w=6, unit="short",
             description="Node agents Prometheus scrapes successfully."),
        stat("Rows pending remap", f"sum(taugrid_gpu_row_remap_pending{{{sel}}})", w=6, unit="short",
             description="GPUs with a row remap waiting for a GPU reset."),
        table("XIDs by node, GPU and code (1h)",
              f"sum by ({nd}, uuid, code) (increase(taugrid_gpu_xid_errors_total{{{sel}}}[1h])) > 0", unit="short",
              description="XID events in the last hour per GPU and code (`taugrid-evidence scan` explains a code)."),
        series("Throttle reasons active", (f"count by ({nd}, reason) (taugrid_gpu_clocks_event_active{{{sel}}} == 1)",
                                           "{{node}} {{reason}}"), unit="short",
               description="GPUs per node whose clocks a clocks-event (throttle) reason holds down."),
        series("Utilization", (f"avg by ({nd}, gpu) (taugrid_gpu_utilization_ratio{{{sel}}})", "{{node}}/{{gpu}}"),
               unit="percentunit", description="NVML utilization: share of time any kernel ran."),
        series("Power over limit", (f"max by ({nd}, gpu) (taugrid_gpu_power_watts{{{sel}}} "
                                    f"/ taugrid_gpu_power_limit_watts{{{sel}}})", "{{node}}/{{gpu}}"),
               unit="percentunit", description="Power draw as a share of the enforced power limit."),
        series("Temperature", (f"max by ({nd}, gpu) (taugrid_gpu_temperature_celsius{{{sel}}})", "{{node}}/{{gpu}}"),
               unit="celsius", description="GPU core temperature."),
        table("Lost GPUs", f"max by ({nd}, gpu, uuid, pod, namespace) (taugrid_gpu_lost{{{sel}}}) == 1",
              unit="none", description="Each lost GPU and the pod that held it."),
        series("Hang hints", (f"max by ({nd}, gpu, pod) (taugrid_gpu_hang_hint{{{sel}}})", "{{node}}/{{gpu}} {{pod}}"),
               unit="none", description="1: utilization high while power and SM activity stay low "
                                        "(suspected collective hang)."),
    ], [var_query("node", "label_values(taugrid_gpu_utilization_ratio, node)", multi=True)])


def collector() -> dict[str, Any]:
    return dashboard("taugrid-collector", "TauGrid / Collector health",
                     "The controller's own health: scrapes, watches, errors, evaluation time.", [
        stat("Controller replicas up", f"sum(up{{{CONTROLLER_JOB}}})", w=6, unit="short",
             description="Controller replicas Prometheus scrapes successfully (one leads, the others stand by)."),
        stat("Runs tracked", "max(taugrid_collector_runs_tracked)", w=6, unit="short",
             description="Runs in the collector's index, finished ones included."),
        stat("Oldest evaluation", "time() - min(taugrid_run_evaluated_timestamp_seconds)", unit="s", w=6,
             description="Age of the oldest claim evaluation: grows when the loop falls behind."),
        table("Version", "count by (version) (taugrid_collector_build_info)", w=6, h=4, unit="short",
              description="Controller replicas per collector version (two during a rollout)."),
        series("Events applied / s", ("sum by (resource) (rate(taugrid_collector_events_processed_total"
                                      "[$__rate_interval]))", "{{resource}}"), unit="ops",
               description="Watch events and relist differences applied to the run index, per resource."),
        series("Since last successful sync", ("time() - max by (resource) "
                                              "(taugrid_collector_last_sync_timestamp_seconds)", "{{resource}}"),
               unit="s", description="Time since a list or watch of each resource last succeeded "
                                     "(TaugridEvidenceStale past 15 minutes)."),
        series("Watch restarts and relists (1h)",
               ("sum by (resource) (increase(taugrid_collector_watch_restarts_total[1h]))", "restarts {{resource}}"),
               ("sum by (resource) (increase(taugrid_collector_relists_total[1h]))", "relists {{resource}}"),
               unit="short", description="Watch streams re-opened and full relists in the last hour, per resource."),
        series("Errors by source and class (1h)",
               ("sum by (source, class) (increase(taugrid_collector_errors_total[1h]))", "{{source}} {{class}}"),
               unit="short", description="Errors in the last hour, by source and whether they are retried "
                                         "(retryable) or the input skipped (permanent)."),
        series("Threads started again (1h)",
               ("max by (thread) (increase(taugrid_collector_thread_restarts_total[1h]))", "{{thread}}"),
               unit="short",
               description="A controller thread that raised is logged with its traceback and started again "
                           "after a back-off; its source's evidence is missing while it is down."),
        series("Claim evaluation time",
               ("histogram_quantile(0.5, sum by (le) (rate(taugrid_collector_evaluation_duration_seconds_bucket"
                "[$__rate_interval])))", "p50"),
               ("histogram_quantile(0.99, sum by (le) (rate(taugrid_collector_evaluation_duration_seconds_bucket"
                "[$__rate_interval])))", "p99"), unit="s",
               description="Time to evaluate the claims of one pass, median and 99th percentile."),
        series("Poll pass length", ("max by (source) (taugrid_collector_poll_pass_seconds)", "{{source}}"), unit="s",
               description="How long the last pass over polled sources took (logs: API log reads; agents: node "
                           "agents). Past the poll interval (30 s by default) the source is read less often "
                           "than configured and its evidence ages towards unknown."),
        series("Node agents up", (f"sum(up{{{AGENT_JOB}}})", "up"), (f"count(up{{{AGENT_JOB}}})", "targets"),
               unit="short", description="Node agents scraped successfully, against the agent targets Prometheus "
                                         "knows."),
        stat("Environment supported", "min(taugrid_environment_supported)", w=6, unit="bool",
             description="1: the manager and every worker satisfy the supported-environment contract "
                         "(docs/environment.md); 0: some row fails, see the table and `explain`."),
        table("Environment contract violations",
              "max by (checked_cluster, check, reason) (taugrid_environment_violation == 1)", w=18, h=4, unit="none",
              description="Each failing contract row, per checked cluster (MultiKueue manager or worker) and "
                          "reason."),
    ], [], time_from="now-6h")


def kql(name: str, title: str, *, w: int = 24, h: int = 8, unit: str = "none", description: str = "") -> Panel:
    """A table of one queries/NAME.kql, run as written (its declared parameters take their defaults)."""
    text = (QUERIES / f"{name}.kql").read_text()
    p = panel("table", title, [{"refId": "A", "datasource": ADX, "query": text, "queryType": "KQL",
                                "resultFormat": "table", "database": "${database}", "rawMode": True}],
              w=w, h=h, unit=unit, description=description or _first_comment(text),
              options={"showHeader": True, "cellHeight": "sm"})
    p["datasource"] = ADX
    return p


def _first_comment(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[2:].strip())
    return " ".join(lines)


def fleet_adx() -> dict[str, Any]:
    d = dashboard("taugrid-fleet-adx", "TauGrid / Fleet (ADX)",
                  "Fleet questions in KQL over the collector's ADX tables (queries/; docs/adx.md).", [
        kql("running_not_progressing", "Running but not progressing, by cluster and queue"),
        kql("contradictions_by_plane", "Contradictions by plane", w=12),
        kql("stalls_by_cause", "Stalls by cause", w=12),
        kql("time_to_schedule", "Time to schedule p50/p95 by queue and blocked stage"),
        kql("admission_eta_backtest", "Admission estimate backtest: real admissions inside the band"),
        kql("goodput_by_queue_team", "Goodput by queue and team", w=12),
        kql("gpu_xids", "GPUs by XID count and code", w=12),
        kql("drain_advisor", "Drain advisor: nodes to drain first, runs to checkpoint before", w=12),
        kql("gpu_lemons", "Lemon GPUs: trouble that recurs on the same device across runs", w=12),
        kql("evidence_freshness", "Collector evidence freshness"),
        kql("claim_transitions", "Claim transitions by claim and verdict"),
        kql("progress_rate_adxmon", "Progress rate (adx-mon tables)", w=12),
        kql("source_sync_adxmon", "Source sync (adx-mon tables)", w=12),
    ], [], time_from="now-7d")
    d["templating"]["list"] = [
        {"type": "datasource", "name": "adx", "label": "Azure Data Explorer",
         "query": "grafana-azure-data-explorer-datasource", "hide": 0, "refresh": 1, "options": [], "regex": ""},
        {"type": "textbox", "name": "database", "label": "Database", "query": "taugrid", "hide": 0,
         "options": [], "current": {"text": "taugrid", "value": "taugrid"}},
    ]
    return d


DASHBOARDS = {"fleet-overview.json": fleet, "run-drilldown.json": run, "gpu-health.json": gpu,
              "collector-health.json": collector, "fleet-adx.json": fleet_adx}


def render(name: str) -> str:
    return json.dumps(DASHBOARDS[name](), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for name in DASHBOARDS:
        text = render(name)
        for path in (HERE / name, CHART_COPY / name):
            if "--check" in argv:
                if not path.exists() or path.read_text() != text:
                    stale.append(str(path.relative_to(HERE.parent)))
            else:
                path.parent.mkdir(exist_ok=True)
                path.write_text(text)
    if stale:
        print(f"out of date (run python dashboards/build.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
