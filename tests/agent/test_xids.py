"""XIDs from the kernel log (`/dev/kmsg` records built from real dmesg captures) and their counting."""

from __future__ import annotations

import re
import time
from pathlib import Path

from collector.agent.xids import KmsgReader, XidCounter, parse_kmsg
from collector.progress.xid import describe

GPU4 = "GPU-509665ad-b600-ac93-3616-d754b23d636d"


def kmsg_from_dmesg(text: str, first_seq: int = 100) -> list[str]:
    """`dmesg -T` lines → `/dev/kmsg` records (`PRIO,SEQ,USEC,FLAGS;MESSAGE`)."""
    out = []
    for i, line in enumerate(text.splitlines()):
        msg = re.sub(r"^\[[^\]]*\]\s*", "", line)
        out.append(f"4,{first_seq + i},{(1000 + i) * 1_000_000},-;{msg}")
    return out


def test_parse_kmsg() -> None:
    r = parse_kmsg("4,1234,5678901,-;NVRM: Xid (PCI:0000:9b:00): 119, pid=1")
    assert r is not None and (r.priority, r.seq, r.usec) == (4, 1234, 5678901) and r.message.startswith("NVRM")
    assert parse_kmsg("4,1234,5678901,-,caller=T1;text") is not None  # extra header fields
    for bad in ("", "no header", "a,b,c,d;x", "4,1;x"):
        assert parse_kmsg(bad) is None


def test_kernel_log_xids_counted_with_meaning(tmp_path: Path, fixtures: Path) -> None:
    text = (fixtures / "xid_nvsmi" / "dmesg_xid119_gsp_rpc_timeout_h100_gpud.log").read_text()
    records = kmsg_from_dmesg(text)
    records[3:3] = ["\x00\x01 garbage \xff", " SUBSYSTEM=pci", "not;a;record"]  # garbage and a continuation
    segv = (fixtures / "xid_nvsmi" / "dmesg_nccl_segfault_libnccl_gpud.log").read_text()
    records += kmsg_from_dmesg(segv, first_seq=10_000)
    xid63 = (fixtures / "xid_nvsmi" / "xid63_row_remapper_line_ml_engineering.txt").read_text().strip()
    records.append(f"3,20000,3000000000,-;{xid63}")
    records.append("3,20000,3000000000,-;" + xid63)  # the same sequence number again: not recounted
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(records[:5]) + "\n")
    counter = XidCounter(pci_to_uuid=lambda: {"0000:9b:00": GPU4})
    reader = KmsgReader(kmsg, counter, poll_s=0.02, boot_time=1_700_000_000.0)
    reader.start()
    try:
        with open(kmsg, "a") as f:  # followed as it grows
            f.write("\n".join(records[5:]) + "\n")
        deadline = time.monotonic() + 5
        while len(counter.counts()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
    finally:
        reader.stop()
    counts = counter.counts()
    assert counts == {(GPU4, 119, "kmsg"): 5, ("0000:10:1c", 63, "kmsg"): 1}  # the capture repeats 119 five times
    assert reader.malformed == 2  # the binary garbage and "not;a;record" (continuations are not records)
    ev = next(e for e in counter.recent() if e.code == 119)
    assert (ev.meaning, ev.action) == describe(119) and ev.uuid == GPU4 and ev.pci == "0000:9b:00"
    assert ev.at == 1_700_000_000.0 + 1002.0
    assert ev.message.startswith("pid=2024380") and len(ev.message) <= 200


def test_unreadable_kernel_log_is_a_status(tmp_path: Path) -> None:
    reader = KmsgReader(tmp_path / "missing", XidCounter(), poll_s=0.02)
    reader.start()
    try:
        deadline = time.monotonic() + 5
        while not reader.error and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "cannot open" in reader.error and not reader.up
    finally:
        reader.stop()


def test_counter_keeps_repeats_and_bounds_recent() -> None:
    c = XidCounter(recent=4)
    for _ in range(10):
        c.add(79, uuid="GPU-x", origin="nvml")
    assert c.counts() == {("GPU-x", 79, "nvml"): 10}
    assert len(c.recent()) == 4
