"""The sandbox network's readiness read (standalone/network.py): it waits on a pipe whose descriptor a busy server
numbers past 1024, where select() refuses one."""

import os
import resource
import time

import pytest

from standalone.network import PrivateNetwork


def _free_fd_past_select_limits() -> int:
    for fd in range(1100, 1600):
        try:
            os.fstat(fd)
        except OSError:
            return fd
    pytest.skip("no free descriptor between 1100 and 1600")


@pytest.fixture
def high_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1600:
        pytest.skip("the descriptor limit is too low to place one past 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1600), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _pipe_numbered_high() -> tuple[int, int]:
    r, w = os.pipe()
    high = _free_fd_past_select_limits()
    os.dup2(r, high)
    os.close(r)
    return high, w


def test_the_ready_byte_is_read_from_a_descriptor_past_1024(high_limit):
    r, w = _pipe_numbered_high()
    try:
        os.write(w, b"1")
        assert PrivateNetwork._read(r, time.monotonic() + 5, lambda: True) == b"1"
    finally:
        os.close(r)
        os.close(w)


def test_a_writer_gone_without_the_byte_ends_the_wait_at_once(high_limit):
    r, w = _pipe_numbered_high()
    try:
        os.close(w)
        started = time.monotonic()
        assert PrivateNetwork._read(r, started + 30, lambda: True) == b""  # the caller reports the failure
        assert time.monotonic() - started < 25  # not the deadline: EOF woke it
    finally:
        os.close(r)


def test_a_silent_writer_times_out_with_the_network_named():
    r, w = os.pipe()
    try:
        with pytest.raises(OSError, match="network was not ready"):
            PrivateNetwork._read(r, time.monotonic() + 0.3, lambda: True)
    finally:
        os.close(r)
        os.close(w)
