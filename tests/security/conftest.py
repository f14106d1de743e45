"""Real `flarebox serve` processes for the security tests (the helpers live in tests/standalone/e2e.py).

`secure_server` is one server per module with a KNOWN token (internet off, the default); every byte it writes to
stdout/stderr goes to its log file, which the token tests search.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standalone"))
from e2e import TOKEN, ServerProcess, remove_temp_dir, short_temp_dir  # noqa: E402


@pytest.fixture(scope="module")
def secure_server():
    root = short_temp_dir()
    proc = ServerProcess(root / "data", {"IDLE_SECONDS": "600", "ENABLE_INTERNET": "false"})
    try:
        yield proc.start()
    finally:
        proc.stop()
        remove_temp_dir(root)


@pytest.fixture
def start_server():
    """Start extra servers: start_server(env={...}, token=...). All are stopped (by PID) at teardown."""
    root = short_temp_dir()
    started: list[ServerProcess] = []

    def start(env: dict[str, str] | None = None, token: str | None = TOKEN) -> ServerProcess:
        proc = ServerProcess(root / f"data{len(started)}", {"IDLE_SECONDS": "600", **(env or {})}, token)
        started.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()
        remove_temp_dir(root)
