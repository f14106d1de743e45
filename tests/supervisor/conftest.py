"""Fixtures: a real supervisor process per test (see harness.py), always stopped by PID."""

import pytest

from .harness import Supervisor, start_supervisor


@pytest.fixture
def supervisor(tmp_path):
    yield from start_supervisor(tmp_path)


@pytest.fixture
def supervisor_factory(tmp_path):
    """Start a supervisor with extra environment (operator overrides); stopped at teardown."""
    started = []

    def start(env: dict) -> Supervisor:
        directory = tmp_path / f"s{len(started)}"
        directory.mkdir()
        gen = start_supervisor(directory, env)
        sup = next(gen)
        started.append(gen)
        return sup

    yield start
    for gen in started:
        gen.close()


@pytest.fixture(scope="module")
def shared_supervisor(tmp_path_factory):
    """One supervisor for a module of tests that leave nothing running behind (e.g. requests that are refused)."""
    yield from start_supervisor(tmp_path_factory.mktemp("shared"))
