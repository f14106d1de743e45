"""Running commands: output, exit codes, environment, identity, UTF-8, stdin, heartbeats."""

import hashlib
import json

import pytest

from protocol.limits import MAX_OUTPUT_FRAME_CHARS

from .harness import IS_ROOT, LEAK_CANARY, SANDBOX_USER, needs_root, new_id, next_event, parse_ndjson

pytestmark = pytest.mark.timeout(60)


def test_exit_code_and_merged_output(supervisor):
    result = supervisor.exec("echo out; echo err >&2; exit 7")
    assert result.output == "out\nerr\n"
    assert result.terminal["type"] == "exit"
    assert result.terminal["exit_code"] == 7
    assert result.terminal["reason"] == "exited"
    assert isinstance(result.terminal["duration_ms"], int)
    # the supervisor never writes status/started events: the workspace object does
    assert {e["type"] for e in result.events} <= {"output", "exit", "heartbeat"}


def test_output_arrives_while_the_command_runs(supervisor):
    release = supervisor.workspace / "release"
    body = {"request_id": new_id(), "command": "echo first; while [ ! -e release ]; do sleep 0.05; done; echo second"}
    with supervisor.stream("POST", "/exec", json=body) as response:
        lines = response.iter_lines()
        first = next_event(lines)
        assert first == {"type": "output", "data": "first\n", "offset": 0}
        # the command cannot have finished: it waits for the file we have not created yet
        assert supervisor.client.get("/health").json()["running"] == 1
        release.touch()
        rest = [json.loads(line) for line in lines if line]
    assert "".join(e["data"] for e in rest if e["type"] == "output") == "second\n"
    assert rest[-1]["type"] == "exit" and rest[-1]["exit_code"] == 0


def test_clean_environment_and_requested_env(supervisor):
    result = supervisor.exec("env", env={"GREETING": "hi there", "PATH": "/usr/bin:/bin"})
    env = dict(line.split("=", 1) for line in result.output.splitlines() if "=" in line)
    assert LEAK_CANARY not in result.output  # nothing of the supervisor's own environment (e.g. the API token)
    assert "SANDBOX_API_TOKEN" not in env and "FLAREBOX_LEAK_CANARY" not in env
    assert env["GREETING"] == "hi there"
    assert env["PATH"] == "/usr/bin:/bin"
    assert env["SHELL"] == "/bin/bash" and env["LANG"] == "C.UTF-8" and env["TERM"] == "dumb"
    assert env["USER"] == env["LOGNAME"]
    if IS_ROOT:
        assert env["USER"] == SANDBOX_USER


def test_login_shell_flag(supervisor):
    assert supervisor.exec("shopt -q login_shell && echo login || echo plain").output == "plain\n"
    assert supervisor.exec("shopt -q login_shell && echo login || echo plain", login=True).output.endswith("login\n")


def test_cwd_default_and_explicit(supervisor):
    (supervisor.workspace / "sub").mkdir()
    assert supervisor.exec("pwd").output == f"{supervisor.workspace}\n"
    assert supervisor.exec("pwd", cwd=str(supervisor.workspace / "sub")).output == f"{supervisor.workspace}/sub\n"


@needs_root
def test_commands_run_as_the_sandbox_user(supervisor):
    result = supervisor.exec("id -u; id -g; touch made-by-command; cat /etc/shadow >/dev/null 2>&1 || echo denied")
    uid, _gid, denied = result.output.splitlines()
    assert int(uid) == supervisor.uid
    assert denied == "denied"
    assert (supervisor.workspace / "made-by-command").stat().st_uid == supervisor.uid


def test_code_point_split_across_reads_survives(supervisor):
    # U+1F600 is F0 9F 98 80: the pipe delivers its halves in two reads 0.3 s apart
    result = supervisor.exec(r"printf 'a\xf0\x9f'; sleep 0.3; printf '\x98\x80b'")
    assert result.output == "a\U0001f600b"
    assert "\ufffd" not in result.output


def test_invalid_utf8_is_replaced_not_dropped(supervisor):
    assert supervisor.exec(r"printf 'a\xffb\xc3'").output == "a\ufffdb\ufffd"


def test_frames_are_bounded_and_offsets_count_code_points(supervisor):
    result = supervisor.exec("head -c 100000 /dev/zero | tr '\\0' 'é'; printf 'ü%.0s' $(seq 1 30000)")
    frames = [e for e in result.events if e["type"] == "output"]
    position = 0
    for frame in frames:
        assert frame["offset"] == position
        assert 0 < len(frame["data"]) <= MAX_OUTPUT_FRAME_CHARS
        position += len(frame["data"])
    assert result.output.count("ü") == 30000
    assert result.terminal["exit_code"] == 0


def test_large_stdin_round_trips_byte_exact(supervisor):
    # The largest stdin a 1 MiB JSON body allows, multi-byte text included; `cat` echoes it while we still write,
    # so both pipes exceed their buffers and a non-concurrent implementation would deadlock.
    unit = "line of text, ünïcödé ✓ and 😀\n"
    text = unit * (1_000_000 // len(unit.encode()))
    result = supervisor.exec("cat", stdin=text, timeout=30)
    assert result.status == 200, result.events
    assert result.terminal["exit_code"] == 0
    assert hashlib.sha256(result.output.encode()).hexdigest() == hashlib.sha256(text.encode()).hexdigest()


def test_stdin_the_command_never_reads_is_dropped_without_harm(supervisor):
    # more than the pipe holds, and the command exits without reading: the writer must stop at EPIPE, not hang
    result = supervisor.exec("echo ignored", stdin="x" * 900_000, timeout=30)
    assert result.output == "ignored\n"
    assert result.terminal["exit_code"] == 0
    assert supervisor.exec("echo still fine").output == "still fine\n"


def test_stdin_absent_reads_dev_null(supervisor):
    result = supervisor.exec("cat; echo done", timeout=5)
    assert result.output == "done\n"
    assert result.terminal["reason"] == "exited"


def test_signal_exit_code(supervisor):
    result = supervisor.exec("kill -9 $$")
    assert result.terminal["exit_code"] == 128 + 9
    assert result.terminal["reason"] == "signal"


def test_heartbeat_during_silence(supervisor):
    # the fixture sets FLAREBOX_HEARTBEAT_SECONDS=1
    result = supervisor.exec("sleep 2.5; echo done")
    assert result.heartbeats >= 1
    assert result.output == "done\n"


def test_health_reports_running_and_user(supervisor):
    health = supervisor.client.get("/health").json()
    assert health["ok"] is True and health["running"] == 0
    assert isinstance(health["version"], str)
    if IS_ROOT:
        assert health["user"] == SANDBOX_USER


def test_sync(supervisor):
    response = supervisor.client.post("/sync")
    assert response.status_code == 200 and response.json() == {"ok": True}


def test_many_requests_on_one_connection(supervisor):
    for i in range(20):
        assert supervisor.exec(f"echo {i}").output == f"{i}\n"
    assert parse_ndjson(supervisor.post_exec({"request_id": new_id(), "command": "true"}).text)[-1]["exit_code"] == 0


def test_the_head_of_a_silent_command_is_not_held_back_until_it_ends(supervisor):
    """The head may wait briefly to go out with the first event, never until the command's end."""
    request_id = new_id()
    body = json.dumps({"request_id": request_id, "command": "sleep 30"}).encode()
    headers = {"Content-Type": "application/json"}
    with supervisor.stream("POST", "/exec", content=body, headers=headers, timeout=20) as response:
        assert response.status_code == 200  # the head came while `sleep 30` runs
        assert supervisor.client.post(f"/exec/{request_id}/cancel").json()["state"] == "cancelled"
        events = [json.loads(line) for line in response.iter_lines() if line]
    assert events[-1]["type"] == "exit" and events[-1]["reason"] == "cancelled"


def test_a_quick_command_ends_its_stream_with_the_terminal_event(supervisor):
    result = supervisor.exec("printf x")
    assert result.output == "x"
    assert [e["type"] for e in result.events if e["type"] != "heartbeat"] == ["output", "exit"]
