"""Descriptors numbered past select()'s FD_SETSIZE (1024), as a server with many workspaces holds them."""

import os
import resource

import pytest

_LOW, _HIGH = 1100, 1600


@pytest.fixture
def room_past_select_limits():
    """The soft descriptor limit raised to let a descriptor sit past 1024, restored after (skips where the hard
    limit is lower)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < _HIGH:
        pytest.skip("the descriptor limit is too low to place one past 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, _HIGH), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def move_past_select_limits(fd: int) -> int:
    """`fd` moved to a free number past 1024 (never one the test process uses); returns the new number."""
    for high in range(_LOW, _HIGH):
        try:
            os.fstat(high)
        except OSError:
            os.dup2(fd, high)
            os.close(fd)
            return high
    pytest.skip(f"no free descriptor between {_LOW} and {_HIGH}")
