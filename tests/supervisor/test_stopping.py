"""Timeouts, cancels and the output limit: the whole process group goes, the right terminal event comes."""

import json
import time

import pytest

from protocol.limits import CANCELLED_EXIT_CODE, KILL_GRACE_SECONDS, MAX_OUTPUT_CHARS, TIMEOUT_EXIT_CODE

from .harness import group_alive, kill_group, new_id, next_event, parse_ndjson, wait_until

pytestmark = pytest.mark.timeout(60)


def test_timeout_kills_a_process_that_ignores_sigterm(supervisor):
    command = "trap '' TERM; echo $$ > pgid; echo ready; sleep 30; echo survived"
    started = time.monotonic()
    result = supervisor.exec(command, timeout=1)
    elapsed = time.monotonic() - started
    pgid = int((supervisor.workspace / "pgid").read_text())
    try:
        assert result.terminal == {
            **result.terminal,
            "type": "exit",
            "exit_code": TIMEOUT_EXIT_CODE,
            "reason": "timeout",
        }
        assert "survived" not in result.output
        # SIGTERM was ignored: only the SIGKILL KILL_GRACE_SECONDS later ended it
        assert result.terminal["duration_ms"] >= (1 + KILL_GRACE_SECONDS) * 1000 - 200
        assert elapsed < 1 + KILL_GRACE_SECONDS + 10
        assert wait_until(lambda: not group_alive(pgid), 5)
    finally:
        kill_group(pgid)


def test_timeout_does_not_wait_for_the_grace_period_when_the_group_is_gone(supervisor):
    result = supervisor.exec("sleep 30 & sleep 30", timeout=0.5)
    assert result.terminal["exit_code"] == TIMEOUT_EXIT_CODE and result.terminal["reason"] == "timeout"
    # both sleeps die of SIGTERM at once, so SIGKILL is not awaited
    assert result.terminal["duration_ms"] < 500 + KILL_GRACE_SECONDS * 1000


def test_cancel_during_a_command(supervisor):
    request_id = new_id()
    body = {"request_id": request_id, "command": "echo $$ > pgid; sleep 30 & echo started; sleep 30"}
    with supervisor.stream("POST", "/exec", json=body) as response:
        lines = response.iter_lines()
        assert next_event(lines)["data"] == "started\n"
        cancelled = supervisor.client.post(f"/exec/{request_id}/cancel")
        assert cancelled.json() == {"request_id": request_id, "state": "cancelled"}
        events = [json.loads(line) for line in lines if line]
    pgid = int((supervisor.workspace / "pgid").read_text())
    try:
        assert events[-1]["type"] == "exit"
        assert events[-1]["exit_code"] == CANCELLED_EXIT_CODE and events[-1]["reason"] == "cancelled"
        assert wait_until(lambda: not group_alive(pgid), 5)  # the background sleep went too
        again = supervisor.client.post(f"/exec/{request_id}/cancel")
        assert again.json()["state"] == "finished"
    finally:
        kill_group(pgid)


def test_cancel_before_the_exec_arrives(supervisor):
    request_id = new_id()
    early = supervisor.client.post(f"/exec/{request_id}/cancel")
    assert early.status_code == 200 and early.json() == {"request_id": request_id, "state": "pending"}
    response = supervisor.post_exec({"request_id": request_id, "command": "touch ran"})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "command_cancelled"
    assert not (supervisor.workspace / "ran").exists()
    assert supervisor.client.get(f"/exec/{request_id}").json()["error"]["code"] == "request_not_found"


def test_output_over_the_limit_kills_the_group_and_never_succeeds(supervisor):
    command = f"echo $$ > pgid; sleep 60 & head -c {MAX_OUTPUT_CHARS + 1} /dev/zero | tr '\\0' a; sleep 60"
    result = supervisor.exec(command, timeout=120)
    pgid = int((supervisor.workspace / "pgid").read_text())
    try:
        assert result.terminal["type"] == "error" and result.terminal["code"] == "output_limit"
        assert not any(e["type"] == "exit" for e in result.events)
        assert len(result.output) <= MAX_OUTPUT_CHARS
        assert set(result.output) == {"a"}
        assert wait_until(lambda: not group_alive(pgid), 5)
    finally:
        kill_group(pgid)


def test_output_exactly_at_the_limit_succeeds(supervisor):
    result = supervisor.exec(f"head -c {MAX_OUTPUT_CHARS} /dev/zero | tr '\\0' a")
    assert result.terminal["type"] == "exit" and result.terminal["exit_code"] == 0
    assert len(result.output) == MAX_OUTPUT_CHARS


def test_output_limit_counts_code_points_not_bytes(supervisor):
    # 1,000,000 two-byte characters are 2,000,000 bytes but only half the limit
    result = supervisor.exec("head -c 1000000 /dev/zero | tr '\\0' '\\1' | sed 's/\\x01/é/g'")
    assert result.terminal["type"] == "exit", result.terminal
    assert len(result.output) == 1_000_000


def test_terminal_event_is_last_and_unique(supervisor):
    for command in ("true", "exit 3", "kill -TERM $$"):
        events = parse_ndjson(supervisor.post_exec({"request_id": new_id(), "command": command}).text)
        terminals = [e for e in events if e["type"] in ("exit", "error")]
        assert len(terminals) == 1 and terminals[0] is events[-1]
