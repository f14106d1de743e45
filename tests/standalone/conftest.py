"""A real `flarebox serve` subprocess for end-to-end tests.

`server` is module-scoped (one server per test module); `start_server` starts extra ones with their own settings
and data dir. Each runs in its own session on a free loopback port with a temp data dir and a known token; it is
stopped by PID (SIGTERM, then SIGKILL) and its session swept in finally, so no sandbox outlives a test.
The class and helpers live in e2e.py (importable by test modules; conftest.py is not).
"""

import pytest
from e2e import servers, serving


@pytest.fixture(scope="module")
def server():
    """One real server per test module (IDLE_SECONDS high: nothing idles away under a test's feet)."""
    with serving() as proc:
        yield proc


@pytest.fixture
def start_server():
    """Start extra servers: start_server(env={...}, token=..., data_dir=...). All are stopped at teardown."""
    with servers({}) as start:
        yield start
