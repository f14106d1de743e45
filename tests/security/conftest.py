"""Real `flarebox serve` processes for the security tests (the helpers live in tests/standalone/e2e.py).

`secure_server` is one server per module with a KNOWN token (internet off, the default); every byte it writes to
stdout/stderr goes to its log file, which the token tests search.
"""

import pytest
from e2e import servers, serving

from standalone.cgroups import Cgroups


@pytest.fixture(scope="module")
def secure_server():
    with serving({"IDLE_SECONDS": "600", "ENABLE_INTERNET": "false"}) as proc:
        yield proc


@pytest.fixture
def start_server():
    """Start extra servers: start_server(env={...}, token=...). All are stopped (by PID) at teardown."""
    with servers() as start:
        yield start


@pytest.fixture(scope="module")
def limited_server():
    """A server whose sandboxes have the instance types' cgroup limits (skipped where cgroups cannot be used)."""
    manager, report = Cgroups.detect()
    if manager is None:
        pytest.skip(report)
    with serving({"ENABLE_INTERNET": "false"}) as srv:
        assert "memory, pids and CPU share" in srv.output()  # the server really enforces limits
        yield srv
