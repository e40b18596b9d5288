"""A writer the crash test kills with SIGKILL: appends rows forever, seals every 50 rows, and writes
the highest acknowledged row number to a file after each seal (what the spool promised to keep)."""

from __future__ import annotations

import sys
from pathlib import Path

from exporters.adx.spool import Spool, SpoolSettings


def main() -> None:
    spool = Spool(Path(sys.argv[1]), SpoolSettings(max_bytes=64 << 20, segment_bytes=64 << 10),
                  critical_tables=("RunClaims",))
    spool.open()
    acks = open(sys.argv[2], "a")  # noqa: SIM115 — written until killed
    n = 0
    while True:
        n += 1
        table = "RunClaims" if n % 3 == 0 else "KubeEvents"
        spool.append(table, [{"RowId": f"r{n}", "Timestamp": "2026-01-10T10:00:00Z", "Reason": "x" * (n % 200)}])
        if n % 50 == 0:
            spool.seal()
            acks.write(f"{n}\n")
            acks.flush()


if __name__ == "__main__":
    main()
