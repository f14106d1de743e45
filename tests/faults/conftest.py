"""Fault tests against a real `flarebox serve`: the e2e helpers of tests/standalone are shared (not copied)."""

from pathlib import Path

import pytest
from e2e import remove_temp_dir, servers, short_temp_dir


@pytest.fixture
def start_server():
    """start_server(env={...}, data_dir=...) -> a started ServerProcess (IDLE_SECONDS=600 unless `env` says
    otherwise); every one is stopped at teardown. `start_server.root` is a short temp dir for a data dir the test
    prepares (e.g. mounts a tmpfs on) before starting the server."""
    root = short_temp_dir()
    try:
        with servers() as start:

            def start_in(env: dict[str, str] | None = None, data_dir: Path | None = None):
                return start(env=env, data_dir=data_dir)

            start_in.root = root
            yield start_in
    finally:
        remove_temp_dir(root)
