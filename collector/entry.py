"""The `taugrid-evidence` console script: `agent` runs without loading the rest of the CLI.

The node agent runs on every GPU node; importing the controller's modules (kubernetes client,
claims, exporters) would cost it ~25 MiB of RSS for nothing (docs/benchmarks.md, node agent).
"""

from __future__ import annotations

import sys


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "agent":
        from collector.agent.command import agent

        agent(sys.argv[2:], prog_name="taugrid-evidence agent")
        return
    from collector.cli import main as cli

    cli()
