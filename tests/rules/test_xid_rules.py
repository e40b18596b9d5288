"""The node agent's XID alerts rate each code as NVIDIA's catalogue does (collector/progress/xid_catalog.json):
the code lists in the rules are the catalogue's critical and info tiers, the warning alert takes every other
code, unknown ones included. A catalogue update that moves a code fails here until the rules follow."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from collector.progress import xid

ROOT = Path(__file__).resolve().parents[2]
AGENT_RULES = ROOT / "charts" / "taugrid-evidence" / "rules" / "taugrid-evidence-agent.rules.yaml"
_MATCHER = re.compile(r'taugrid_gpu_xid_errors_total\{code(=~|!~)"([0-9|]+)"\}')


def matchers() -> dict[str, set[tuple[str, frozenset[int]]]]:
    out: dict[str, set[tuple[str, frozenset[int]]]] = {}
    for group in yaml.safe_load(AGENT_RULES.read_text())["groups"]:
        for rule in group["rules"]:
            found = {(op, frozenset(int(c) for c in codes.split("|"))) for op, codes in _MATCHER.findall(rule["expr"])}
            if found:
                out[rule["alert"]] = found
    return out


def tier(name: str) -> frozenset[int]:
    return frozenset(e.code for e in xid.CATALOGUE.entries if e.alert == name)


def test_agent_xid_alerts_follow_the_catalogue() -> None:
    m = matchers()
    assert m["TaugridGpuXidCritical"] == {("=~", tier("critical"))}
    assert m["TaugridGpuXidApplication"] == {("=~", tier("info"))}
    assert m["TaugridGpuXidWarning"] == {("!~", tier("critical") | tier("info"))}
    # every listed code lands in exactly one alert; a code the catalogue lacks is a warning
    assert not tier("critical") & tier("info")
    assert tier("critical") | tier("info") | tier("warning") == set(xid.ENTRIES)


def test_tiers_follow_nvidia_buckets() -> None:
    for e in xid.CATALOGUE.entries:
        if e.alert == "critical":
            assert e.severity in ("gpu", "node"), e.code
        if e.alert == "info":
            assert e.severity in ("info", "app", "secondary") and not e.node_risk, e.code
    assert {79, 48, 95, 119} <= tier("critical") and {13, 31, 43} <= tier("info")
