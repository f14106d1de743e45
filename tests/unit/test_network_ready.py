"""The sandbox network's readiness read (standalone/network.py): it waits on a pipe whose descriptor a busy server
numbers past 1024, where select() refuses one."""

import os
import time

import pytest
from high_fds import move_past_select_limits, room_past_select_limits  # noqa: F401 - a fixture

from standalone.network import PrivateNetwork


def _pipe_numbered_high() -> tuple[int, int]:
    r, w = os.pipe()
    return move_past_select_limits(r), w


@pytest.mark.usefixtures("room_past_select_limits")
def test_the_ready_byte_is_read_from_a_descriptor_past_1024():
    r, w = _pipe_numbered_high()
    try:
        os.write(w, b"1")
        assert PrivateNetwork._read(r, time.monotonic() + 5, lambda: True) == b"1"
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.usefixtures("room_past_select_limits")
def test_a_writer_gone_without_the_byte_ends_the_wait_at_once():
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
