"""docs/metrics.md and the exposition agree: every exported family and label is documented, and
every documented controller family is exported."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from exporter_samples import T0, blocked_run, crashlooping_run
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.envcontract import check, inventory
from collector.model import Energy, Observed, Straggler, Stragglers
from collector.riskfacts import NodeRisk, WorkAtRisk
from exporters.prometheus import ClaimsExporter, new_registry
from exporters.prometheus_envcontract import EnvironmentExporter
from exporters.prometheus_health import HealthMetrics
from exporters.prometheus_logs import LogPassMetrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _tables(text: str) -> list[list[dict[str, str]]]:
    """Every Markdown table in `text`, as rows keyed by the lower-cased header cells."""
    tables: list[list[dict[str, str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines) - 1:
        if lines[i].lstrip().startswith("|") and re.fullmatch(r"\s*\|(\s*:?-+:?\s*\|)+\s*", lines[i + 1]):
            header = [c.strip().lower() for c in lines[i].strip().strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                rows.append(dict(zip(header, cells, strict=False)))
                i += 1
            tables.append(rows)
        else:
            i += 1
    return tables


def _name(cell: str) -> str:
    """`taugrid_x` → taugrid_x; `kind` (errors) → kind."""
    m = re.match(r"`([^`]+)`", cell)
    return m.group(1) if m else cell.split()[0] if cell.split() else ""


def documented(text: str) -> tuple[dict[str, tuple[str, str, frozenset[str]]], set[str]]:
    """family → (type, component, labels) and the set of documented labels."""
    families: dict[str, tuple[str, str, frozenset[str]]] = {}
    labels: set[str] = set()
    for table in _tables(text):
        for row in table:
            if "family" in row:
                labs = frozenset(x.strip() for x in row.get("labels", "").split(",") if x.strip())
                families[_name(row["family"])] = (row.get("type", ""), row.get("component", ""), labs)
            elif "label" in row:
                labels.add(_name(row["label"]))
    return families, labels


def exported() -> dict[str, tuple[str, frozenset[str]]]:
    """Family name as users query it (counters with `_total`) → (type, labels seen)."""
    registry = new_registry()
    base = crashlooping_run(name="elastic")
    replaying = replace(base, progressing=replace(base.progressing, observed=Observed.FALSE, cause="replaying"),
                        stragglers=Stragglers((Straggler("rank", "3", "elastic-3", "node-1", 0.2, T0, "arrival",
                                                                         "last"),), 8, 40, "last"),
                        work_at_risk=WorkAtRisk(3.5, 16, T0, "checkpoint", "x", 100, T0, (
                            NodeRisk("node-1", 30.0, ("cordoned",), ("cordoned",), 8, 1.75),
                            NodeRisk("node-2", 0.0, (), (), 8, 1.75))),
                        energy=Energy(41_000.0, 4_100.0, 8, 30.0, 300.0, "41,000 J per step", 0.25))
    ClaimsExporter(registry, retention=timedelta(hours=1)).update(
        [crashlooping_run(), crashlooping_run(name="done", finished=True), blocked_run(), replaying], T0
    )
    health = HealthMetrics(registry, resources=["pods"], sources=["kubernetes"])
    health.watch_restarted("pods")
    health.relisted("pods")
    health.events_processed("pods")
    health.error("ray", "retryable")
    health.synced("pods", T0)
    health.set_runs_tracked(3)
    health.set_runs_untracked({"team-a": 2})
    health.set_failing({"pods": T0})
    health.set_leader("collector-0-abc123", True)
    health.observe_evaluation(0.01)
    health.poll_pass("logs", 2.5)
    LogPassMetrics(registry, max_gets=2000, max_bytes=64 << 20).update(
        gets=120, read_bytes=90_000, due=130, deferred=10, skipped={"agent": 5, "rotation": 300, "claims": 40})
    EnvironmentExporter(registry).update(check([inventory("manager", None, [], None)]), T0)
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        out[name] = (fam.type, frozenset(k for s in fam.samples for k in s.labels))
        assert fam.samples, f"{name}: populate it in this test so its labels are checked"
    return out


def problems(text: str) -> list[str]:
    """Disagreements between the doc `text` and the exposition, both directions."""
    families, labels = documented(text)
    if not families or not labels:
        return ["no family/label tables parsed from docs/metrics.md"]
    found = []
    exp = exported()
    for name, (typ, labs) in sorted(exp.items()):
        if name not in families:
            found.append(f"{name}: exported but not in docs/metrics.md")
            continue
        doc_type, component, doc_labels = families[name]
        if doc_type != typ:
            found.append(f"{name}: exported as {typ}, documented as {doc_type}")
        if component != "controller":
            found.append(f"{name}: exported by the controller, documented for {component!r}")
        if labs != doc_labels:
            found.append(f"{name}: labels {sorted(labs)} exported, {sorted(doc_labels)} documented")
        found += [f"{name}: label {lab!r} missing from the labels table" for lab in sorted(labs - labels)]
    # Other components' rows (e.g. the node agent's) are checked by their own tests.
    listed = {name for name, (_, component, _) in families.items() if component == "controller"}
    found += [f"{name}: documented for the controller but not exported" for name in sorted(listed - set(exp))]
    return found


def test_docs_and_exposition_agree() -> None:
    found = problems(DOC.read_text())
    assert not found, "docs/metrics.md is out of step with the exporter:\n" + "\n".join(found)


def test_the_check_catches_drift() -> None:
    doc = DOC.read_text()
    bogus_row = "| `taugrid_run_bogus` | gauge | controller | run | x | 1 |\n"
    mutations = {
        "a family label dropped": doc.replace("| namespace, run, kind, plane |", "| namespace, run, kind |"),
        "a label row dropped": re.sub(r"^\| `plane` \|.*\n", "", doc, flags=re.M),
        "a family row dropped": re.sub(r"^\| `taugrid_run_finished` \|.*\n", "", doc, flags=re.M),
        "a family not exported": doc.replace(
            "| `taugrid_collector_build_info` |", bogus_row + "| `taugrid_collector_build_info` |", 1
        ),
    }
    for what, text in mutations.items():
        assert text != doc, what
        assert problems(text), f"{what}: not detected"
