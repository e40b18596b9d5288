"""NVIDIA XID events in kernel logs, and what they mean for a training run.

Every code of NVIDIA's published XID catalogue is explained from `xid_catalog.json`, which
`collector/progress/xid_build.py` generates from the catalogue's table (`xid_nvidia_catalog.tsv`, with its
provenance): NVIDIA's mnemonic and resolution buckets (immediate and investigatory action) as published, a
short meaning and action in our words, a severity derived from the immediate bucket, and the codes this
product treats as node risk. A code the catalogue does not list stays "unknown XID n" (fail closed: no
meaning is invented for it).
"""

from __future__ import annotations

import logging
import re
from importlib import resources
from typing import Literal

import msgspec

from tests.progress.scan_1b82892.numbers import XID_MAX, OutOfRange, bounded

log = logging.getLogger("taugrid.progress.xid")

UNKNOWN_MEANING = "unknown XID"
UNKNOWN_ACTION = "not in NVIDIA's XID catalogue: consult NVIDIA support with the full kernel-log line"

# What a code needs, from NVIDIA's immediate resolution bucket (xid_build.BUCKETS holds the mapping):
# info (no action), secondary (follows another XID), app (restart the application), manual (a person acts:
# support, software update, seating), gpu (reset the GPU), node (reboot the node), unrated (NVIDIA published
# no bucket). `xid_build` lets a hand-written entry be stricter than NVIDIA's bucket, never laxer.
Severity = Literal["info", "secondary", "app", "manual", "gpu", "unrated", "node"]
# critical: the GPU must be reset or the node rebooted now (TaugridGpuXidCritical); warning: a person looks,
# or hardware to watch (TaugridGpuXidWarning, which also takes every code the catalogue lacks); info: the
# application faulted or nothing is needed (TaugridGpuXidApplication).
AlertTier = Literal["critical", "warning", "info"]
SEVERITY_RANK: dict[str, int] = {"info": 0, "secondary": 1, "app": 1, "manual": 2, "gpu": 2, "unrated": 2,
                                 "node": 3}


class XidEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    code: int
    mnemonic: str  # NVIDIA's, as published
    meaning: str  # ours: a short paraphrase
    action: str  # ours, ending with NVIDIA's bucket(s) in brackets
    severity: Severity
    bucket: str  # NVIDIA's immediate resolution bucket, "" where none is published
    investigate: str  # NVIDIA's investigatory bucket, as published ("" where none)
    applies: tuple[str, ...]  # GPUs the catalogue says raise it (A100, H100, B100, GB200)
    node_risk: bool  # this product's choice: the node is at risk (drain advisor, alerts)
    alert: AlertTier  # the node agent's XID alert it raises (charts/taugrid-evidence/rules, agent rules)
    curated: bool  # meaning and action written for this code, not derived from the bucket


class XidSource(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: str
    retrieved: str
    licence: str
    table_sha256: str  # of xid_nvidia_catalog.tsv, the transcribed table this file was generated from


class XidCatalogue(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    source: XidSource
    entries: tuple[XidEntry, ...]


CATALOGUE_FILE = "xid_catalog.json"


def load_catalogue(data: bytes | None = None) -> XidCatalogue:
    """The generated catalogue (the packaged file unless `data` is given); a malformed one raises."""
    if data is None:
        data = resources.files("collector.progress").joinpath(CATALOGUE_FILE).read_bytes()
    cat = msgspec.json.decode(data, type=XidCatalogue)
    codes = [e.code for e in cat.entries]
    if len(set(codes)) != len(codes) or any(not 0 <= c <= XID_MAX for c in codes):
        raise ValueError("XID catalogue: duplicate or out-of-range codes")
    return cat


def _packaged() -> tuple[XidCatalogue, str]:
    """The packaged catalogue, or an empty one and why: every code then reads "unknown XID n" (fail
    closed; tests/progress/test_xid_catalogue.py keeps the packaged file loadable, and `xid_build` can
    still regenerate a file whose schema changed)."""
    try:
        return load_catalogue(), ""
    except (OSError, ValueError) as e:  # msgspec's DecodeError and ValidationError are ValueErrors
        log.error("XID catalogue not loaded: every XID reads unknown", extra={"error": str(e)[:300]})
        return XidCatalogue(XidSource("", "", "", ""), ()), str(e)[:300]


CATALOGUE, LOAD_ERROR = _packaged()
ENTRIES: dict[int, XidEntry] = {e.code: e for e in CATALOGUE.entries}
# code -> (meaning, recommended action), every code of NVIDIA's catalogue
XID_CATALOGUE: dict[int, tuple[str, str]] = {e.code: (e.meaning, e.action) for e in CATALOGUE.entries}
# Uncorrectable or uncontained memory errors, remap events and failures, NVLink faults and a GPU off the bus:
# kept from this product's own triage where it is stricter than NVIDIA's bucket (63 is IGNORE there).
NODE_RISK_XIDS: frozenset[int] = frozenset(e.code for e in CATALOGUE.entries if e.node_risk)


def entry(code: int) -> XidEntry | None:
    return ENTRIES.get(code)


def describe(code: int) -> tuple[str, str]:
    """(meaning, action) for an XID code; a code the catalogue lacks is "unknown XID n"."""
    return XID_CATALOGUE.get(code) or (f"{UNKNOWN_MEANING} {code}", UNKNOWN_ACTION)


# Current drivers print `NVRM: Xid (PCI:0000:9b:00): 119, pid=...`; older ones omit `PCI:`.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): (\d+)")


def match_xid(line: str) -> tuple[int, str] | None:
    """(code, pci) when `line` is an XID event; None too when the code is past any real XID (a
    forged line cannot carry a number no exporter can write)."""
    m = _XID.search(line)
    if m is None:
        return None
    try:
        code = bounded(m.group(2), XID_MAX, "XID code")
    except OutOfRange:
        return None
    return code, m.group(1).lower()
