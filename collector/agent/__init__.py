"""The node agent (DaemonSet): GPU readings with pod attribution, XIDs, and node-local log evidence.

Imports nothing from Ray or the controller: it runs in its own small process on every GPU node.
The names below load on first use: the controller's CLI registers the `agent` command and imports
this package, and the agent's modules (pod-resources gRPC, protobuf, h2, NVML) would add ~4.5 MiB
to every controller.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collector.agent.agent import Agent, run_agent
    from collector.agent.settings import AgentSettings, HangSettings, LogSettings

__all__ = ["Agent", "AgentSettings", "HangSettings", "LogSettings", "run_agent"]

_HOME = {"Agent": "collector.agent.agent", "run_agent": "collector.agent.agent",
         "AgentSettings": "collector.agent.settings", "HangSettings": "collector.agent.settings",
         "LogSettings": "collector.agent.settings"}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
