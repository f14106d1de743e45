"""One real `flarebox serve` for the whole fuzz session (reuses tests/standalone/e2e.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standalone"))
from e2e import ServerProcess, remove_temp_dir, short_temp_dir  # noqa: E402


@pytest.fixture(scope="session")
def fuzz_server():
    root = short_temp_dir()
    # a short idle time is not wanted: the fuzzer's workspaces must stay put while it runs
    proc = ServerProcess(root / "data", {"IDLE_SECONDS": "600"})
    try:
        yield proc.start()
    finally:
        proc.stop()
        remove_temp_dir(root)
