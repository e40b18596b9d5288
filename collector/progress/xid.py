"""NVIDIA XID events in kernel logs, and what they mean for a training run.

Meanings and actions are a short paraphrase of NVIDIA's published XID catalogue (the "resolution
bucket" columns: restart the application, reset the GPU, reboot the node, inspect hardware), limited
to the codes seen on data-centre GPUs in practice.
"""

from __future__ import annotations

import re

from collector.progress.numbers import XID_MAX, OutOfRange, bounded

UNKNOWN_MEANING = "unknown XID"
UNKNOWN_ACTION = "consult NVIDIA XID catalogue"

_RESTART_APP = "restart the application; if it recurs on this GPU across workloads, run GPU diagnostics"
_RESET_GPU = "drain the GPU and reset it; reboot the node if the reset fails; contact support if it recurs"

# code -> (meaning, recommended action)
XID_CATALOGUE: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing: a channel timed out", _RESTART_APP),
    13: (
        "graphics engine exception: usually the application (bad instruction or out-of-range access), "
        "rarely driver or hardware",
        _RESTART_APP,
    ),
    31: (
        "GPU memory page fault: a kernel accessed an unmapped or illegal address, usually an application bug",
        _RESTART_APP,
    ),
    32: (
        "corrupted command (push buffer) stream: PCIe or system-memory corruption, or a driver fault",
        "check the PCIe link and host memory errors, reset the GPU; inspect hardware if it recurs",
    ),
    43: (
        "GPU stopped processing a channel after a fault in the user's work; the GPU itself stays usable",
        "restart the application; no GPU action needed",
    ),
    45: (
        "preemptive cleanup: the driver tore down a channel because its process ended or an earlier error",
        "no action by itself; act on the XIDs logged just before it",
    ),
    48: (
        "uncorrectable double-bit ECC error in GPU memory",
        "drain the GPU and reset it so the page is retired or the row remapped; replace the GPU if it recurs",
    ),
    61: ("GPU internal micro-controller hit a breakpoint or warning", _RESET_GPU),
    62: ("GPU internal micro-controller halted", _RESET_GPU),
    63: (
        "ECC page retirement or row remapping recorded; it takes effect at the next GPU reset",
        "reset the GPU when it is idle to apply the remap; running work is not affected",
    ),
    64: (
        "ECC page retirement or row remapping could not be recorded",
        "drain the GPU and reset it; replace the GPU if it recurs",
    ),
    68: ("video decoder (NVDEC) exception", _RESTART_APP),
    69: ("graphics engine class error: invalid state or method sent to the engine", _RESTART_APP),
    74: (
        "NVLink error: a link faulted or exceeded its error threshold",
        "drain the GPUs on the link and reset them (or reboot the node); check NVLink/NVSwitch and "
        "Fabric Manager; inspect hardware if it recurs",
    ),
    79: (
        "GPU has fallen off the bus: no longer reachable over PCIe",
        "drain and reboot (power-cycle) the node; check PCIe seating, power and cooling; replace the GPU if it recurs",
    ),
    92: (
        "high rate of corrected single-bit ECC errors",
        "keep running; watch the ECC counters and schedule diagnostics if the rate stays high",
    ),
    94: (
        "contained uncorrectable ECC error: only the application that used the bad memory is affected",
        "restart the affected application; reset the GPU when convenient to remap the row",
    ),
    95: (
        "uncontained uncorrectable ECC error: every process on the GPU may have read corrupt data",
        "drain the GPU and reset it (reboot the node if needed); replace the GPU if it recurs",
    ),
    109: (
        "context switch timeout: work did not yield in time (application, driver or hardware)",
        _RESTART_APP,
    ),
    110: ("security fault detected by the GPU firmware", _RESET_GPU),
    119: ("GSP firmware did not answer a driver RPC in time", _RESET_GPU),
    120: ("GSP firmware reported an internal error", _RESET_GPU),
    121: (
        "corrected errors on the C2C link between Grace CPU and GPU; no immediate impact",
        "keep running; reset the GPU when convenient to retrain the link; inspect hardware if it recurs",
    ),
    140: (
        "uncorrectable ECC error the driver could not retire or remap",
        "drain the GPU and reset it; contact the hardware vendor if it persists",
    ),
    143: ("GPU failed to initialize", _RESET_GPU),
    154: (
        "GPU recovery action changed: the driver states what this GPU now needs (reset, reboot, drain)",
        "perform the recovery action named in the message",
    ),
}

# Current drivers print `NVRM: Xid (PCI:0000:9b:00): 119, pid=...`; older ones omit `PCI:`.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): (\d+)")


def describe(code: int) -> tuple[str, str]:
    """(meaning, action) for an XID code; unknown codes point at the catalogue."""
    return XID_CATALOGUE.get(code, (UNKNOWN_MEANING, UNKNOWN_ACTION))


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
