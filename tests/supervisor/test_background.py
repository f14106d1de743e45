"""Background jobs outlive their command: the stream ends promptly, the job keeps running and its pipe is drained."""

import os
import time

import pytest

from protocol.limits import DRAIN_MAX_SECONDS

from .harness import kill_group, wait_until

pytestmark = pytest.mark.timeout(60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = open(f"/proc/{pid}/stat", "rb").read()
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def test_background_job_survives_and_is_drained_after_the_stream_ends(supervisor):
    # The job stays quiet until the stream has ended, then writes 3 MB (more than the pipe holds and more than the
    # output limit) into the pipe the supervisor owns; it must neither block nor die of SIGPIPE.
    command = (
        "( while [ ! -e go ]; do sleep 0.05; done; head -c 3000000 /dev/zero; echo written > marker; sleep 60 ) "
        "& echo $!"
    )
    started = time.monotonic()
    result = supervisor.exec(command, timeout=30)
    assert result.terminal["type"] == "exit" and result.terminal["exit_code"] == 0
    assert time.monotonic() - started < DRAIN_MAX_SECONDS + 5
    pid = int(result.output)
    try:
        assert _alive(pid)
        (supervisor.workspace / "go").touch()
        assert wait_until(lambda: (supervisor.workspace / "marker").exists(), 15)
        assert _alive(pid)
        # the supervisor is still fine and the job is still there after more output
        assert supervisor.exec("echo ok").output == "ok\n"
        assert _alive(pid)
    finally:
        kill_group(os.getpgid(pid) if _alive(pid) else pid)


def test_hermes_background_pattern_returns_promptly(supervisor):
    command = (
        "mkdir -p bg && ( nohup bash -lc 'echo tick; sleep 60' > bg/log 2>&1; rc=$?; printf '%s\\n' \"$rc\" > bg/exit )"
        " & echo $! > bg/pid && cat bg/pid"
    )
    assert supervisor.exec("mkdir bg").terminal["exit_code"] == 0  # Hermes' temp dir exists before it spawns
    started = time.monotonic()
    result = supervisor.exec(command, timeout=10, login=False)
    elapsed = time.monotonic() - started
    pid = int(result.output)
    try:
        assert result.terminal["exit_code"] == 0
        assert elapsed < DRAIN_MAX_SECONDS  # nothing holds the stream open
        assert _alive(pid)
        assert wait_until(lambda: (supervisor.workspace / "bg/log").read_text() == "tick\n", 10)
    finally:
        kill_group(os.getpgid(pid) if _alive(pid) else pid)


def test_background_output_is_relayed_until_silence(supervisor):
    # the job prints as soon as the command's own bash is gone (builtins only, so no fork delays it)
    result = supervisor.exec("( while kill -0 $$ 2>/dev/null; do :; done; echo late ) & echo early")
    assert result.output == "early\nlate\n"
    assert result.terminal["exit_code"] == 0


def test_chatty_background_job_is_cut_off_at_the_drain_cap(supervisor):
    command = "( while true; do echo tick; sleep 0.01; done ) & echo $!"  # never DRAIN_IDLE_SECONDS of silence
    started = time.monotonic()
    result = supervisor.exec(command, timeout=60)
    elapsed = time.monotonic() - started
    # the job's first tick may come before the shell's `echo $!`: the pid is the one all-digit line
    pid = next(int(line) for line in result.output.splitlines() if line.isdigit())
    try:
        assert result.terminal["type"] == "exit" and result.terminal["exit_code"] == 0
        assert "tick" in result.output
        assert elapsed < DRAIN_MAX_SECONDS + 5  # the stream ends although the job never stops printing
        assert elapsed >= DRAIN_MAX_SECONDS - 1.5  # and it was relayed while it kept printing
        assert _alive(pid)
    finally:
        kill_group(os.getpgid(pid) if _alive(pid) else pid)
