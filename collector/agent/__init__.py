"""The node agent (DaemonSet): GPU readings with pod attribution, XIDs, and node-local log evidence.

Imports nothing from Ray or the controller: it runs in its own small process on every GPU node.
"""

from collector.agent.agent import Agent, run_agent
from collector.agent.settings import AgentSettings, HangSettings, LogSettings

__all__ = ["Agent", "AgentSettings", "HangSettings", "LogSettings", "run_agent"]
