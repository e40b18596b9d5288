from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.azurite import Azurite


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """One real Azurite blob service for the module (stopped by pid at teardown)."""
    with Azurite.start(tmp_path_factory.mktemp("azurite")) as az:
        yield az
