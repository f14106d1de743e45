"""The real supervisor: a follower sees output as soon as it is written (not at the next heartbeat), and running
commands leaks no file descriptors."""

import json
import os
import time

import pytest

from .harness import new_id, next_event

pytestmark = pytest.mark.timeout(120)


def test_output_reaches_the_stream_long_before_a_heartbeat_would(supervisor_factory):
    sup = supervisor_factory({"FLAREBOX_HEARTBEAT_SECONDS": "10"})
    release = sup.workspace / "release"
    command = "echo first; while [ ! -e release ]; do sleep 0.05; done; echo second"
    with sup.stream("POST", "/exec", json={"request_id": new_id(), "command": command}) as response:
        lines = response.iter_lines()
        started = time.monotonic()
        assert next_event(lines)["data"] == "first\n"
        first_after = time.monotonic() - started
        release.touch()
        released = time.monotonic()
        second = next_event(lines)
        second_after = time.monotonic() - released
        rest = [json.loads(line) for line in lines if line]
    assert second["data"] == "second\n"
    assert rest[-1]["type"] == "exit"
    # a bound on behaviour (10 s heartbeat): woken by the output itself, not by the heartbeat's timeout
    assert first_after < 3 and second_after < 3, (first_after, second_after)


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_hundred_commands_leak_no_descriptors(supervisor):
    pid = supervisor.process.pid
    assert supervisor.exec("echo warm-up").terminal["exit_code"] == 0
    before = _fd_count(pid)
    for n in range(100):
        result = supervisor.exec(f"echo {n}; echo {n} >&2")
        assert result.terminal["exit_code"] == 0 and result.output == f"{n}\n{n}\n"
    after = _fd_count(pid)
    assert after - before < 10, (before, after, sorted(os.listdir(f"/proc/{pid}/fd")))
