"""One real `flarebox serve` for the whole fuzz session (reuses tests/standalone/e2e.py)."""

import pytest
from e2e import serving


@pytest.fixture(scope="session")
def fuzz_server():
    # a short idle time is not wanted: the fuzzer's workspaces must stay put while it runs
    with serving() as proc:
        yield proc
