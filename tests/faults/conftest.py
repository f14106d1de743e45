"""Fault tests against a real `flarebox serve`: the e2e helpers of tests/standalone are shared (not copied)."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standalone"))

from e2e import TOKEN, ServerProcess, remove_temp_dir, short_temp_dir  # noqa: E402


@pytest.fixture
def start_server():
    """start_server(env={...}, data_dir=...) -> a started ServerProcess; every one is stopped at teardown, and
    `root` is a temp dir the test may mount things under before starting (unmounted by the test's own fixture)."""
    root = short_temp_dir()
    started: list[ServerProcess] = []

    def start(env: dict[str, str] | None = None, data_dir: Path | None = None) -> ServerProcess:
        proc = ServerProcess(data_dir or root / f"data{len(started)}", {"IDLE_SECONDS": "600", **(env or {})}, TOKEN)
        started.append(proc)
        return proc.start()

    start.root = root
    try:
        yield start
    finally:
        for proc in started:
            proc.stop()
        if os.environ.get("FBX_KEEP") is None:
            remove_temp_dir(root)
