"""NVIDIA's XID catalogue: the generated file matches its table byte for byte, every code's action follows
NVIDIA's resolution bucket (stricter allowed, laxer refused), and every surface explains known codes while
an unknown code stays unknown."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from collector.agent.xids import XidCounter
from collector.progress import scan_text, xid, xid_build
from exporters.adx.rows import GpuXid, xid_row

ROOT = Path(__file__).resolve().parents[2]


def table_rows() -> list[dict[str, str]]:
    """The TSV read independently of the generator (csv, not xid_build.read_table)."""
    text = xid_build.TABLE.read_text(encoding="utf-8")
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    return list(csv.DictReader(io.StringIO(body), delimiter="\t", quoting=csv.QUOTE_NONE))


def test_regenerating_gives_the_same_bytes() -> None:
    assert xid.LOAD_ERROR == "" and len(xid.ENTRIES) == 172
    assert xid_build.build(xid_build.TABLE.read_text(encoding="utf-8")) == xid_build.OUT.read_bytes()
    # the Makefile's entry point, as CI would run it (PYTHONPATH = this tree, not the editable install)
    res = subprocess.run([sys.executable, "-m", "collector.progress.xid_build", "--check"], cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr


def test_check_catches_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "t.tsv"
    out = tmp_path / "c.json"
    text = xid_build.TABLE.read_text(encoding="utf-8")
    table.write_text(text)
    out.write_bytes(xid_build.OUT.read_bytes())
    monkeypatch.setattr(xid_build, "TABLE", table)
    monkeypatch.setattr(xid_build, "OUT", out)
    assert xid_build.main(["--check"]) == 0
    # NVIDIA moves XID 79 from a node reboot to a GPU reset: the checked-in file is now stale
    table.write_text(text.replace("\tRESTART_BM\t", "\tRESET_GPU\t"))
    assert xid_build.main(["--check"]) == 1
    assert xid_build.main([]) == 0 and xid_build.main(["--check"]) == 0
    assert msgspec.json.decode(out.read_bytes(), type=xid.XidCatalogue).entries[78].bucket == "RESET_GPU"


def test_table_is_nvidia_full_catalogue_with_provenance() -> None:
    rows = table_rows()
    assert [int(r["code"]) for r in rows] == list(range(1, 173))  # every code NVIDIA lists, none invented
    head = xid_build.TABLE.read_text(encoding="utf-8").split("\ncode\t")[0]
    for needed in ("https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html", "retrieved: 20",
                   "licence:", "are not copied"):
        assert needed in head
    src = xid.CATALOGUE.source
    assert src.url.startswith("https://docs.nvidia.com/") and src.retrieved[:2] == "20"
    assert len(src.table_sha256) == 64


def test_every_code_follows_nvidia_bucket() -> None:
    for r in table_rows():
        e = xid.ENTRIES[int(r["code"])]
        assert e.mnemonic == r["mnemonic"] and e.bucket == r["immediate"] and e.investigate == r["investigatory"]
        floor, _ = xid_build.BUCKETS[r["immediate"]]
        assert xid.SEVERITY_RANK[e.severity] >= xid.SEVERITY_RANK[floor], e.code
        if not e.curated:
            assert e.severity == floor
        assert e.action.endswith("]") and f"[NVIDIA: {r['immediate'] or 'no bucket'}" in e.action
        assert e.meaning and "unknown" not in e.meaning.lower()
    # the buckets that decide a drain, as NVIDIA publishes them
    assert {c: xid.ENTRIES[c].bucket for c in (48, 79, 95, 109, 119)} == {
        48: "WORKFLOW_XID_48", 79: "RESTART_BM", 95: "RESET_GPU", 109: "RESET_GPU", 119: "RESET_GPU"}
    assert xid.ENTRIES[79].severity == "node" and xid.ENTRIES[13].severity == "app"


def test_hand_picked_node_risk_kept_where_stricter() -> None:
    assert sorted(xid.NODE_RISK_XIDS) == [48, 63, 64, 74, 79, 94, 95]
    assert xid.ENTRIES[63].bucket == "IGNORE" and xid.ENTRIES[63].severity == "gpu"  # stricter than NVIDIA
    assert xid.ENTRIES[94].bucket == "RESTART_APP" and xid.ENTRIES[94].node_risk


def test_build_refuses_unknown_bucket_and_laxer_curation(monkeypatch: pytest.MonkeyPatch) -> None:
    text = xid_build.TABLE.read_text(encoding="utf-8")
    with pytest.raises(xid_build.TableError, match="RESEAT_GPU"):
        xid_build.build(text.replace("\tRESTART_BM\t", "\tRESEAT_GPU\t"))
    laxer = dict(xid_build.CURATED)
    laxer[79] = ("GPU has fallen off the bus", "restart the application", "app")
    monkeypatch.setattr(xid_build, "CURATED", laxer)
    with pytest.raises(xid_build.TableError, match="laxer"):
        xid_build.build(text)


def test_loader_fails_loudly_on_a_malformed_catalogue() -> None:
    good = xid_build.OUT.read_bytes()
    with pytest.raises(msgspec.ValidationError):
        xid.load_catalogue(good.replace(b'"node_risk"', b'"risky"', 1))
    doc = msgspec.json.decode(good)
    doc["entries"].append(doc["entries"][0])
    with pytest.raises(ValueError, match="duplicate"):
        xid.load_catalogue(msgspec.json.encode(doc))


def test_unknown_codes_stay_unknown() -> None:
    for code in (0, 173, 999, 13000):
        meaning, action = xid.describe(code)
        assert meaning == f"unknown XID {code}" and "not in NVIDIA's XID catalogue" in action
        assert xid.entry(code) is None


def test_every_surface_explains_from_the_catalogue() -> None:
    # explain and bundles read LogScan.xids (scan); the agent's metrics and evidence read XidCounter events
    scan = scan_text("NVRM: Xid (PCI:0000:9b:00): 149, pid=7, NETIR_LINK_EVT Link 3\n"
                     "NVRM: Xid (PCI:0000:9b:00): 173, pid=7, who knows\n", source="t")
    a, b = scan.xids
    assert (a.meaning, a.action) == xid.describe(149) and "NVLink" in a.meaning
    assert b.meaning == "unknown XID 173"
    ev = XidCounter().add(86, uuid="GPU-1", origin="nvml")
    assert (ev.meaning, ev.action) == xid.describe(86) and "optical flow" in ev.meaning
    # GpuXids rows: a record that carries no meaning is explained; one that does keeps its own
    at = datetime(2026, 1, 1, tzinfo=UTC)
    row = xid_row(GpuXid(at, "n1", 95, 0, "GPU-1"), "c1")
    assert (row["Meaning"], row["Action"]) == xid.describe(95)
    assert xid_row(GpuXid(at, "n1", 95, meaning="m", action="a"), "c1")["Meaning"] == "m"
    assert xid_row(GpuXid(at, "n1", 999), "c1")["Meaning"] == "unknown XID 999"
