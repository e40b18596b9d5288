from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"


@pytest.fixture(scope="session")
def fixtures() -> Path:
    assert FIXTURES.is_dir(), f"shared fixtures not found at {FIXTURES}"
    return FIXTURES
