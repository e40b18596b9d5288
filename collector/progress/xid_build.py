"""Generates `xid_catalog.json` (what `collector.progress.xid` loads) from NVIDIA's XID catalogue.

`python -m collector.progress.xid_build` (or `make xids`) writes the file beside this one; `--check`
exits 1 when the checked-in file differs from what this script builds (tests/progress/test_xid_catalogue.py
runs the same comparison, so an edit to the table, the buckets or the curated entries that is not
regenerated fails CI).

Input: `xid_nvidia_catalog.tsv`, NVIDIA's "Xids" sheet transcribed cell by cell, with its provenance in
its header. The mapping from a code to its severity and action follows the table: each immediate
resolution bucket maps to one severity and one action in our words (BUCKETS; a bucket this script does
not know stops the build, so a new catalogue revision cannot slip through unmapped). CURATED holds
meanings and actions written for the codes seen in practice; an entry may be stricter than NVIDIA's
bucket (63 and 94 are node-risk signals here), never laxer: the build refuses a curated severity below
the bucket's. NVIDIA's prose is not copied: meanings of uncurated codes come from the short description
label and the mnemonic.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import msgspec

from collector.progress.xid import SEVERITY_RANK, AlertTier, Severity, XidCatalogue, XidEntry, XidSource

HERE = Path(__file__).resolve().parent
TABLE = HERE / "xid_nvidia_catalog.tsv"
OUT = HERE / "xid_catalog.json"
PRODUCTS = ("A100", "H100", "B100", "GB200")
MAX_TEXT = 256  # ADX's MAX_VALUE: a longer meaning or action would be cut in GpuXids
COLUMNS = ["code", "mnemonic", "description", "applies", "immediate", "investigatory", "xid154_linkage"]

# NVIDIA's immediate resolution bucket -> (severity, what to do, in our words).
BUCKETS: dict[str, tuple[Severity, str]] = {
    "IGNORE": ("info", "no action needed"),
    "RESTART_APP": ("app", "restart the application; the GPU stays usable"),
    "RESTART_VM": ("app", "restart the VM that owns the GPU"),
    "XID_154": ("secondary", "do the recovery action the message names"),
    "WORKFLOW_XID_45": ("secondary", "act on the XID logged before it; alone, restart Fabric Manager"),
    "CONTACT_SUPPORT": ("manual", "contact NVIDIA support with the full kernel-log line"),
    "UPDATE_SWFW": ("manual", "update the driver and firmware (guest and host drivers must match)"),
    "CHECK_MECHANICALS": ("manual", "check the board's seating and its power connectors"),
    "CHECK_UVM": ("gpu", "reset the GPU if UVM or vGPU is in use; otherwise no action"),
    "RESET_GPU": ("gpu", "drain the GPU and reset it; reboot the node if the reset fails, replace the GPU "
                         "if it recurs"),
    "WORKFLOW_XID_48": ("gpu", "reset the GPU; drain it first when XID 63 or 64 comes with it; run field "
                               "diagnostics if it recurs"),
    "WORKFLOW_NVLINK_ERR": ("gpu", "decode the NVLink error registers in the message, then reset the GPUs on "
                                   "the link or reboot the node"),
    "WORKFLOW_NVLINK5_ERR": ("gpu", "decode the message's intrInfo and errorStatus with NVIDIA's XID 144-150 "
                                    "sheet; fatal cases need a GPU reset"),
    "RESTART_BM": ("node", "drain and reboot the node"),
    "": ("unrated", "NVIDIA publishes no recovery action for it"),
}

_RESTART_APP = "restart the application; if it recurs on this GPU across workloads, run GPU diagnostics"
_RESET_GPU = "drain the GPU and reset it; reboot the node if the reset fails; contact support if it recurs"

# code -> (meaning, action, severity), written for this product; severity at least the bucket's.
CURATED: dict[int, tuple[str, str, Severity]] = {
    8: ("GPU stopped processing: a channel timed out", _RESTART_APP, "app"),
    13: ("graphics engine exception: usually the application (bad instruction or out-of-range access), "
         "rarely driver or hardware", _RESTART_APP, "app"),
    31: ("GPU memory page fault: a kernel accessed an unmapped or illegal address, usually an application bug",
         _RESTART_APP, "app"),
    32: ("corrupted command (push buffer) stream: PCIe or system-memory corruption, or a driver fault",
         "check the PCIe link and host memory errors, reset the GPU; inspect hardware if it recurs", "gpu"),
    43: ("GPU stopped processing a channel after a fault in the user's work; the GPU itself stays usable",
         "restart the application; no GPU action needed", "app"),
    45: ("preemptive cleanup: the driver tore down a channel because its process ended or an earlier error",
         "act on the XIDs logged just before it; alone, restart Fabric Manager", "secondary"),
    46: ("GPU stopped processing: the GPU timed out", _RESET_GPU, "gpu"),
    48: ("uncorrectable double-bit ECC error in GPU memory",
         "drain the GPU and reset it so the page is retired or the row remapped; replace the GPU if it recurs",
         "gpu"),
    54: ("auxiliary power is not connected to the GPU board",
         "check the board's power connectors and seating", "manual"),
    61: ("GPU internal micro-controller hit a breakpoint or warning (listed unused on A100 and newer)",
         _RESET_GPU, "gpu"),
    62: ("GPU internal micro-controller halted", _RESET_GPU, "gpu"),
    63: ("ECC page retirement or row remapping recorded; it takes effect at the next GPU reset",
         "reset the GPU when it is idle to apply the remap; running work is not affected", "gpu"),
    64: ("ECC page retirement or row remapping could not be recorded",
         "drain the GPU and reset it; replace the GPU if it recurs", "gpu"),
    68: ("video decoder (NVDEC 0) exception", _RESTART_APP, "app"),
    69: ("graphics engine class error: invalid state or method sent to the engine", _RESTART_APP, "app"),
    74: ("NVLink error: a link faulted or exceeded its error threshold",
         "drain the GPUs on the link and reset them (or reboot the node); check NVLink/NVSwitch and "
         "Fabric Manager; inspect hardware if it recurs", "gpu"),
    79: ("GPU has fallen off the bus: no longer reachable over PCIe",
         "drain and reboot (power-cycle) the node; check PCIe seating, power and cooling; replace the GPU if it "
         "recurs", "node"),
    80: ("data sent to the GPU arrived corrupted (push buffer CRC mismatch)", _RESTART_APP, "app"),
    92: ("high rate of corrected single-bit ECC errors",
         "keep running; watch the ECC counters and schedule diagnostics if the rate stays high", "info"),
    93: ("InfoROM could not be updated: its provisioned wear limit was reached",
         "no action for running work; clear the erase limit with nvflash if it was not intended", "info"),
    94: ("contained uncorrectable ECC error: only the application that used the bad memory is affected",
         "restart the affected application; reset the GPU when convenient to remap the row", "app"),
    95: ("uncontained uncorrectable ECC error: every process on the GPU may have read corrupt data",
         "drain the GPU and reset it (reboot the node if needed); replace the GPU if it recurs", "gpu"),
    109: ("context switch timeout: work did not yield in time (application, driver or hardware)",
          _RESET_GPU, "gpu"),
    110: ("security fault detected by the GPU firmware",
          "drain the GPU and reset it; revert recent hardware changes and cold-reset the node if it recurs",
          "gpu"),
    119: ("GSP firmware did not answer a driver RPC in time", _RESET_GPU, "gpu"),
    120: ("GSP firmware reported an internal error", _RESET_GPU, "gpu"),
    121: ("corrected errors on the C2C link between Grace CPU and GPU; no immediate impact",
          "keep running; reset the GPU when convenient to retrain the link; inspect hardware if it recurs", "info"),
    136: ("NVLink link training failed", _RESET_GPU, "gpu"),
    137: ("NVLink privilege error: an illegal peer-to-peer access over NVLink, usually an application bug",
          _RESTART_APP, "app"),
    140: ("uncorrectable ECC error the driver could not retire or remap",
          "drain the GPU and reset it; contact the hardware vendor if it persists", "gpu"),
    143: ("GPU failed to initialize", _RESET_GPU, "gpu"),
    154: ("GPU recovery action changed: the driver states what this GPU now needs (reset, reboot, drain)",
          "perform the recovery action named in the message", "secondary"),
    155: ("NVLink went down on purpose (software-defined link down, e.g. to sleep)",
          "reset the GPU; find out who took the link down if it was not expected", "gpu"),
    156: ("GPU resource retirement event", _RESET_GPU, "gpu"),
    157: ("GPU resource retirement failed: no spare resources left to repair with",
          "work may continue but the XID can return; plan to replace the GPU", "info"),
    158: ("GPU fatal timeout", _RESET_GPU, "gpu"),
    162: ("power smoothing circuitry re-engaged", "no GPU action: power smoothing works again", "unrated"),
    163: ("power smoothing circuitry disengaged (thermal events or a timeout)",
          "no reset needed for running work; to keep power smoothing, resolve the thermal events, or reload "
          "the driver or reset the GPU after a timeout", "unrated"),
    164: ("power smoothing circuitry close to the end of its lifetime",
          "watch the node's power swings; plan to replace the GPU if power smoothing is needed", "unrated"),
    165: ("power smoothing circuitry lifetime exhausted: smoothing is off and power swings will occur",
          "replace the GPU if the facility cannot absorb the power swings", "unrated"),
    166: ("confidential-computing traffic on an NVLink not yet set up for encryption",
          "confidential-computing mode only: check the link encryption setup", "unrated"),
    167: ("PCIe fatal timeout", "NVIDIA publishes no recovery action for it", "unrated"),
    168: ("errors in the GPU's write-protected memory region: reduced memory capacity",
          "expected only with ECC off: enable ECC so that rows can be remapped", "unrated"),
    169: ("internal micro-controller (SEC2) halted", "NVIDIA publishes no recovery action for it", "unrated"),
    170: ("unexpected interrupt in confidential-computing mode", "confidential-computing mode only: check the "
          "setup; NVIDIA publishes no recovery action", "unrated"),
    171: ("uncorrectable DRAM error: detail that accompanies XID 48", "follow XID 48", "unrated"),
    172: ("uncorrectable SRAM error: detail that accompanies XID 48", "follow XID 48", "unrated"),
}

# Kept from this product's triage (issue 28): these drive node risk whatever NVIDIA's bucket says.
NODE_RISK = frozenset({48, 63, 64, 74, 79, 94, 95})
# Needs a reset, but one that can wait for the GPU to idle (remaps pending, corrected-error rates, a
# contained error, a changed recovery action): a warning, not a page.
WATCH = frozenset({32, 63, 92, 94, 121, 154})


def alert_tier(code: int, severity: Severity, node_risk: bool) -> AlertTier:
    if code in WATCH:
        return "warning"
    if severity in ("gpu", "node"):
        return "critical"
    if node_risk or severity in ("manual", "unrated"):
        return "warning"
    return "info"

_ENGINES = (
    (re.compile(r"_CE(\d+)_ERROR$"), "copy engine {} exception"),
    (re.compile(r"_NVDEC(\d+)_ERROR$"), "video decoder (NVDEC {}) exception"),
    (re.compile(r"_NVJPG(\d+)_ERROR$"), "JPEG decoder (NVJPG {}) exception"),
    (re.compile(r"_NVENC(\d+)_ERROR$"), "video encoder (NVENC {}) exception"),
    (re.compile(r"_OFA(\d+)_ERROR$"), "optical flow accelerator (OFA {}) exception"),
    (re.compile(r"^NVLINK_(SAW|RLW|TLW|TREX|NVLPW_CTRL|NETIR|MSE)_ERROR$"), "NVLink 5 error in its {} unit"),
)


class TableError(ValueError):
    pass


def read_table(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    if not lines or lines[0].split("\t") != COLUMNS:
        raise TableError(f"{TABLE.name}: header must be {COLUMNS}")
    rows = []
    for n, ln in enumerate(lines[1:], 2):
        cells = ln.split("\t")
        if len(cells) != len(COLUMNS):
            raise TableError(f"{TABLE.name}: row {n} has {len(cells)} cells")
        rows.append(dict(zip(COLUMNS, (c.strip() for c in cells), strict=True)))
    return rows


def _meaning(mnemonic: str, description: str) -> str:
    if description == "Unused":
        return f"{mnemonic} (the catalogue lists it as unused)"
    for pattern, template in _ENGINES:
        m = pattern.search(mnemonic)
        if m:
            return template.format(m.group(1))
    return description


def _action(text: str, bucket: str, investigate: str) -> str:
    tags = bucket or "no bucket"
    if re.fullmatch(r"[A-Z0-9_/]+", investigate) and investigate != bucket:
        tags += f"; if it recurs: {investigate}"
    return f"{text} [NVIDIA: {tags}]"


def build_entry(row: dict[str, str]) -> XidEntry:
    code = int(row["code"])
    bucket = row["immediate"]
    if bucket not in BUCKETS:
        raise TableError(f"XID {code}: resolution bucket {bucket!r} has no mapping in BUCKETS")
    severity, action = BUCKETS[bucket]
    meaning = _meaning(row["mnemonic"], row["description"])
    curated = CURATED.get(code)
    if curated is not None:
        meaning, action, own = curated
        if SEVERITY_RANK[own] < SEVERITY_RANK[severity]:
            raise TableError(f"XID {code}: curated severity {own} is laxer than NVIDIA's {bucket} ({severity})")
        severity = own
    if len(meaning) > MAX_TEXT or len(action) > MAX_TEXT - 64:
        raise TableError(f"XID {code}: meaning or action too long for a metric label or an ADX cell")
    flags = row["applies"]
    if len(flags) != len(PRODUCTS) or set(flags) - {"Y", "N"}:
        raise TableError(f"XID {code}: applies {flags!r} is not four Y/N flags")
    return XidEntry(code=code, mnemonic=row["mnemonic"], meaning=meaning,
                    action=_action(action, bucket, row["investigatory"]), severity=severity, bucket=bucket,
                    investigate=row["investigatory"],
                    applies=tuple(p for p, f in zip(PRODUCTS, flags, strict=True) if f == "Y"),
                    node_risk=code in NODE_RISK, alert=alert_tier(code, severity, code in NODE_RISK),
                    curated=curated is not None)


def build(table_text: str) -> bytes:
    rows = read_table(table_text)
    entries = tuple(sorted((build_entry(r) for r in rows), key=lambda e: e.code))
    codes = [e.code for e in entries]
    if len(set(codes)) != len(codes):
        raise TableError("duplicate XID codes in the table")
    if missing := (set(CURATED) | NODE_RISK) - set(codes):
        raise TableError(f"curated or node-risk codes missing from the table: {sorted(missing)}")
    header = {k.strip(): v.strip() for k, _, v in
              (ln[1:].partition(":") for ln in table_text.splitlines() if ln.startswith("# ") and ":" in ln)}
    source = XidSource(url=header["source"].split()[0], retrieved=header["retrieved"].split(",")[0],
                       licence="NVIDIA documentation (c) NVIDIA Corporation; facts of the table only, "
                               "meanings and actions paraphrased",
                       table_sha256=hashlib.sha256(table_text.encode()).hexdigest())
    doc = msgspec.json.encode(XidCatalogue(source=source, entries=entries))
    return msgspec.json.format(doc, indent=1) + b"\n"


def main(argv: list[str]) -> int:
    built = build(TABLE.read_text(encoding="utf-8"))
    if "--check" in argv:
        if not OUT.exists() or OUT.read_bytes() != built:
            print(f"{OUT} differs from what {Path(__file__).name} builds from {TABLE.name}: run make xids",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_bytes(built)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
