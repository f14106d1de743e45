"""One real `flarebox serve` for the whole fuzz session (reuses tests/standalone/e2e.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standalone"))
from e2e import serving  # noqa: E402


@pytest.fixture(scope="session")
def fuzz_server():
    # a short idle time is not wanted: the fuzzer's workspaces must stay put while it runs
    with serving() as proc:
        yield proc
