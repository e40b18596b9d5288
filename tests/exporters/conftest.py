"""Shared fixtures for the exporter tests."""

from __future__ import annotations

import sys
from pathlib import Path

# tests/ holds helpers shared across test packages (promserver); tests/ is not a package.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from promserver import prometheus_server  # noqa: E402  (a fixture, re-exported for pytest)

__all__ = ["prometheus_server"]
