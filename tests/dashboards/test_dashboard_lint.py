"""Dashboard lint, as monitoring mixins lint theirs: every dashboard has the multi-cluster `cluster`
variable and every PromQL selector filters by it; every panel has a unit and a description.
Static and fast (no Prometheus); tests/dashboards/test_dashboards.py checks the same filter
semantically, on a real Prometheus holding another cluster's series."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
CLUSTER = 'cluster=~"$cluster"'
# The ADX dashboard runs queries/*.kql verbatim on ADX tables, whose rows name their cluster in a
# column the queries group by; it has no Prometheus query and no `cluster` variable.
KQL_ONLY = {"fleet-adx.json"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = GROUPING | {"and", "or", "unless", "offset", "bool", "atan2", "inf", "nan"}
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\{[^}]*\}|\[[^\]]*\]|[A-Za-z_:][A-Za-z0-9_:]*|\(|\)|\S')


def unfiltered_selectors(expr: str) -> list[str]:
    """The vector selectors of `expr` that do not match `cluster=~"$cluster"` (a small PromQL
    scanner: enough for the functions, aggregations and binary operators the dashboards use)."""
    tokens = _TOKEN.findall(expr)
    problems = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if tok.lower() in GROUPING and nxt == "(":  # a label list, not selectors
            i = tokens.index(")", i)
        elif re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok) and tok.lower() not in KEYWORDS and nxt != "(" \
                and nxt.lower() not in ("by", "without"):  # not a function, not `sum by (...)`
            if not (nxt.startswith("{") and CLUSTER in nxt):
                problems.append(tok + (nxt if nxt.startswith("{") else ""))
        elif tok.startswith("{") and (i == 0 or not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tokens[i - 1])) \
                and CLUSTER not in tok:
            problems.append(tok)  # a selector without a metric name
        i += 1
    return problems


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def test_the_scanner_finds_what_it_should() -> None:
    ok = ('sum by (namespace) (rate(x_total{cluster=~"$cluster", a="b"}[5m])) / ignoring (le) max without (a) '
          '(y{cluster=~"$cluster"}) unless on (namespace, run) z{cluster=~"$cluster"} == 1 or vector(0)')
    assert unfiltered_selectors(ok) == []
    assert unfiltered_selectors('time() - max(a{cluster=~"$cluster"}) > 0 and b') == ["b"]
    assert unfiltered_selectors('sum(c{job="x"}) / {__name__="d", cluster=~"$cluster"}') == ['c{job="x"}']
    assert unfiltered_selectors('histogram_quantile(0.9, sum by (le) (rate(h_bucket{x="cluster"}[1m])))') == [
        'h_bucket{x="cluster"}']


@pytest.mark.parametrize("name", sorted(set(dashboards()) - KQL_ONLY))
def test_every_dashboard_has_the_cluster_variable_and_every_query_uses_it(name: str) -> None:
    dash = dashboards()[name]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    cluster = variables.get("cluster")
    assert cluster is not None, f"{name}: no `cluster` variable"
    assert cluster["type"] == "query" and cluster["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert re.fullmatch(r"label_values\(.+, cluster\)", cluster["query"]["query"])
    # All by default, matching series without the label too: one cluster needs no setup.
    assert cluster["includeAll"] and cluster["multi"] and cluster["allValue"] == ".*"
    assert [v["name"] for v in dash["templating"]["list"]][:2] == ["datasource", "cluster"]
    problems = []
    for v in dash["templating"]["list"]:
        if v["type"] == "query" and v["name"] != "cluster":
            m = re.fullmatch(r"label_values\((.+), \w+\)", v["query"]["query"])
            assert m, f"{name} ${v['name']}: only label_values(selector, label) is used"
            problems += [f"${v['name']}: {s}" for s in unfiltered_selectors(m.group(1))]
    for p in dash["panels"]:
        for t in p.get("targets", []):
            problems += [f"{p['title']}/{t['refId']}: {s}" for s in unfiltered_selectors(t["expr"])]
    assert problems == [], f"{name}: selectors that ignore $cluster:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_every_panel_has_a_unit_and_a_description(name: str) -> None:
    missing = [p["title"] for p in dashboards()[name]["panels"]
               if not p.get("description", "").strip() or not p["fieldConfig"]["defaults"].get("unit")]
    assert missing == [], f"{name}: panels without a unit or a description: {missing}"


def test_the_kql_only_dashboard_has_no_prometheus_query() -> None:
    for name in KQL_ONLY:
        assert not [t for p in dashboards()[name]["panels"] for t in p.get("targets", []) if "expr" in t]
