"""The web console's tests: one real `flarebox serve` per module (tests/standalone/e2e.py)."""

import pytest
from e2e import serving


@pytest.fixture(scope="module")
def server():
    with serving() as proc:
        yield proc
