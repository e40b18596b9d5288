from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"  # see tests/fixtures/SOURCES.tsv


@pytest.fixture(scope="session")
def fixtures() -> Path:
    assert FIXTURES.is_dir(), f"fixtures not found at {FIXTURES}"
    return FIXTURES
