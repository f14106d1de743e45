"""A real `flarebox serve` subprocess for end-to-end tests.

`server` is module-scoped (one server per test module); `start_server` starts extra ones with their own settings
and data dir. Each runs in its own session on a free loopback port with a temp data dir and a known token; it is
stopped by PID (SIGTERM, then SIGKILL) and its session swept in finally, so no sandbox outlives a test.
The class and helpers live in e2e.py (importable by test modules; conftest.py is not).
"""

from pathlib import Path

import pytest
from e2e import TOKEN, ServerProcess, remove_temp_dir, short_temp_dir


@pytest.fixture(scope="module")
def server():
    """One real server per test module (IDLE_SECONDS high: nothing idles away under a test's feet)."""
    root = short_temp_dir()
    proc = ServerProcess(root / "data", {"IDLE_SECONDS": "600"})
    try:
        yield proc.start()
    finally:
        proc.stop()
        remove_temp_dir(root)


@pytest.fixture
def start_server():
    """Start extra servers: start_server(env={...}, token=..., data_dir=...). All are stopped at teardown."""
    root = short_temp_dir()
    started: list[ServerProcess] = []

    def start(env: dict[str, str] | None = None, token: str | None = TOKEN, data_dir: Path | None = None):
        proc = ServerProcess(data_dir or root / f"data{len(started)}", env or {}, token)
        started.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()
        remove_temp_dir(root)
