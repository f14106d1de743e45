"""GET /processes and POST /processes/{pid}/signal: the sandbox user's processes, and only those, can be signalled."""

import json
import os
import pwd
import re
import signal
import subprocess
import time
from datetime import datetime

import pytest

from .harness import IS_ROOT, SANDBOX_USER, kill_group, needs_root, new_id, next_event, wait_until

pytestmark = pytest.mark.timeout(60)

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
SYSTEM_PYTHON = "/usr/bin/python3"  # the sandbox user cannot run the venv's (under /root when root)
NO_SUCH_PID = 4_194_304  # valid (MAX_PID) but never a pid: pids are below pid_max, which is at most this


@pytest.fixture
def reap():
    """Register process groups a test starts; they are killed at teardown whatever the test's outcome."""
    groups: list[int] = []
    yield groups.append
    for pgid in groups:
        kill_group(pgid)


def _alive(pid: int) -> bool:
    """Exists and is not a zombie (an exited process waiting for its parent counts as gone)."""
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def _listing(supervisor) -> dict:
    response = supervisor.client.get("/processes")
    assert response.status_code == 200, response.text
    return response.json()


def _entry(supervisor, pid: int) -> dict | None:
    return next((p for p in _listing(supervisor)["processes"] if p["pid"] == pid), None)


def _signal(supervisor, pid, sig: str = "TERM", group: bool = False):
    return supervisor.client.post(f"/processes/{pid}/signal", json={"signal": sig, "group": group})


def _error(response) -> str:
    return response.json()["error"]["code"]


def _background(supervisor, reap, command: str, request_id: str | None = None) -> list[int]:
    """Run an exec that leaves background jobs behind and prints their pids; their groups are reaped."""
    result = supervisor.exec(command, request_id=request_id or new_id())
    assert result.terminal["type"] == "exit" and result.terminal["exit_code"] == 0, result.events
    pids = [int(line) for line in result.output.split()]
    for pid in pids:
        reap(os.getpgid(pid))
    return pids


def _user(supervisor) -> str:
    return pwd.getpwuid(supervisor.uid).pw_name


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# --- the listing ---------------------------------------------------------------------------------------------------


def test_a_background_job_is_listed_with_its_request_and_ends_on_term(supervisor, reap):
    request_id = new_id()
    command = "sleep 300 >/dev/null 2>&1 & echo $!"
    [pid] = _background(supervisor, reap, command, request_id)
    answer = _listing(supervisor)
    assert set(answer) == {"commands", "processes", "truncated"} and answer["truncated"] is False
    entry = _entry(supervisor, pid)
    assert entry == {
        **entry,
        "pid": pid,
        "pgid": os.getpgid(pid),
        "user": _user(supervisor),
        "command": "sleep 300",
        "command_truncated": False,
        "state": "sleeping",
        "request_id": request_id,  # it stayed in its command's process group (and session)
    }
    assert isinstance(entry["ppid"], int)
    assert ISO.match(entry["started_at"]) and abs(_seconds(entry["started_at"]) - time.time()) < 10
    [listed] = [c for c in answer["commands"] if c["request_id"] == request_id]
    assert listed == {
        "request_id": request_id,
        "command": command,
        "command_truncated": False,
        "started_at": listed["started_at"],
        "state": "finished",
        "pid": None,
        "exit_code": 0,
    }
    assert ISO.match(listed["started_at"]) and abs(_seconds(listed["started_at"]) - time.time()) < 10

    response = _signal(supervisor, pid, "TERM")
    assert response.status_code == 200 and response.json() == {"pid": pid, "signal": "TERM", "group": False}
    assert wait_until(lambda: not _alive(pid), 5)
    entry = _entry(supervisor, pid)
    assert entry is None or entry["state"] == "zombie"


def test_commands_come_newest_first_and_a_signalled_command_ends_as_if_killed(supervisor, reap):
    first = new_id()
    assert supervisor.exec("exit 3", request_id=first).terminal["exit_code"] == 3
    running = new_id()
    body = {"request_id": running, "command": "echo $$; sleep 300; echo after"}
    with supervisor.stream("POST", "/exec", json=body) as response:
        lines = response.iter_lines()
        bash = int(next_event(lines)["data"])
        reap(bash)  # its group
        answer = _listing(supervisor)
        newest, older = answer["commands"][:2]
        assert newest == {**newest, "request_id": running, "state": "running", "pid": bash, "exit_code": None}
        assert older == {**older, "request_id": first, "state": "finished", "pid": None, "exit_code": 3}
        mine = [p for p in answer["processes"] if p["request_id"] == running]
        assert {p["pid"] for p in mine} >= {bash}
        [sleep] = [p for p in mine if p["ppid"] == bash]
        assert sleep["command"] == "sleep 300" and sleep["pgid"] == bash
        assert bash not in {c["pid"] for c in answer["commands"][1:]}

        # the whole group, through the sleep's pid: the stream ends as for any command killed by that signal
        signalled = _signal(supervisor, sleep["pid"], "TERM", group=True)
        assert signalled.json() == {"pid": sleep["pid"], "signal": "TERM", "group": True}
        events = [json.loads(line) for line in lines if line]
    terminal = events[-1]
    assert terminal == {**terminal, "type": "exit", "exit_code": 128 + signal.SIGTERM, "reason": "signal"}
    assert "after" not in "".join(e.get("data", "") for e in events)
    assert wait_until(lambda: not _alive(sleep["pid"]) and not _alive(bash), 5)
    [ended] = [c for c in _listing(supervisor)["commands"] if c["request_id"] == running]
    assert ended == {**ended, "state": "finished", "pid": None, "exit_code": 128 + signal.SIGTERM}


def test_stop_then_cont(supervisor, reap):
    [pid] = _background(supervisor, reap, "sleep 300 >/dev/null 2>&1 & echo $!")
    assert _signal(supervisor, pid, "STOP").status_code == 200
    assert wait_until(lambda: _entry(supervisor, pid)["state"] == "stopped", 5)
    assert _signal(supervisor, pid, "CONT").status_code == 200
    assert wait_until(lambda: _entry(supervisor, pid)["state"] == "sleeping", 5)
    assert _signal(supervisor, pid, "KILL").status_code == 200
    assert wait_until(lambda: not _alive(pid), 5)


def test_group_signal_ends_every_member(supervisor, reap):
    command = "for i in 1 2 3; do sleep 300 >/dev/null 2>&1 & echo $!; done"
    pids = _background(supervisor, reap, command)
    pgids = {os.getpgid(pid) for pid in pids}
    assert len(pgids) == 1 and pgids != set(pids)  # the command's group, led by its (gone) bash
    listed = {p["pid"]: p for p in _listing(supervisor)["processes"]}
    assert all(listed[pid]["pgid"] in pgids for pid in pids)
    response = _signal(supervisor, pids[1], "KILL", group=True)
    assert response.status_code == 200 and response.json() == {"pid": pids[1], "signal": "KILL", "group": True}
    assert wait_until(lambda: not any(_alive(pid) for pid in pids), 5)


def test_listing_details(supervisor, reap):
    long_arg = "é" * 3000  # 6000 bytes of UTF-8: the command line is cut, never inside a character
    command = (
        "setsid sleep 301 >/dev/null 2>&1 </dev/null & echo $!; "
        "sh -c 'sleep 0 & exec sleep 302' >/dev/null 2>&1 & echo $!; "  # its child becomes a zombie, never reaped
        f"bash -c 'sleep 303; :' {long_arg} >/dev/null 2>&1 & echo $!"
    )
    setsid, parent, long = _background(supervisor, reap, command)

    def zombie() -> dict | None:
        return next((p for p in _listing(supervisor)["processes"] if p["ppid"] == parent), None)

    assert wait_until(lambda: (zombie() or {}).get("state") == "zombie", 5)
    assert zombie()["command"] == "[sleep]"  # a zombie has no command line left: its name
    answer = _listing(supervisor)
    listed = {p["pid"]: p for p in answer["processes"]}
    assert listed[setsid]["request_id"] is None  # it left its command's session
    assert listed[setsid]["pgid"] == setsid and listed[setsid]["command"] == "sleep 301"
    cut = listed[long]
    assert cut["command_truncated"] is True
    assert cut["command"].startswith("bash -c sleep 303; : éé")
    assert 4093 <= len(cut["command"].encode()) <= 4096
    assert not any(p["command_truncated"] for pid, p in listed.items() if pid != long)
    assert [p["pid"] for p in answer["processes"]] == sorted(listed)


# --- what is never listed nor signalled ----------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat", "rb").read()
            except OSError:
                continue
            if int(stat[stat.rfind(b")") + 2 :].split()[1]) == pid:
                found.append(int(name))
    return found


def test_the_supervisor_and_its_helpers_are_neither_listed_nor_signalled(supervisor, reap):
    [job] = _background(supervisor, reap, "sleep 300 >/dev/null 2>&1 & echo $!")
    own = [supervisor.process.pid, os.getpid(), 1, *_children(supervisor.process.pid)]
    if IS_ROOT:  # the file agent: forked by the root supervisor, it runs as the sandbox user
        assert any(os.stat(f"/proc/{pid}").st_uid == supervisor.uid for pid in own[3:])
    listed = {p["pid"] for p in _listing(supervisor)["processes"]}
    assert job in listed and not listed & set(own)
    for pid in own:
        for group in (False, True):
            response = _signal(supervisor, pid, "KILL", group=group)
            assert response.status_code == 404 and _error(response) == "process_not_found", pid
    assert all(_alive(pid) for pid in own)
    assert supervisor.client.get("/health").status_code == 200
    # the file agent still serves (a write goes through it)
    assert supervisor.client.put("/files", params={"path": str(supervisor.workspace / "f")}, content=b"x").is_success


@needs_root
def test_a_process_of_another_user_is_refused(supervisor):
    foreign = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert foreign.pid not in {p["pid"] for p in _listing(supervisor)["processes"]}
        for group in (False, True):
            response = _signal(supervisor, foreign.pid, "KILL", group=group)
            assert response.status_code == 404 and _error(response) == "process_not_found"
        time.sleep(0.2)
        assert foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait()


@needs_root
def test_a_group_with_a_member_of_another_user_is_refused(supervisor):
    entry = pwd.getpwnam(SANDBOX_USER)
    ids = f"--reuid={entry.pw_uid} --regid={entry.pw_gid} --clear-groups"
    # root's bash leads the group (and session); the sleep it starts as the sandbox user is a member
    leader = subprocess.Popen(
        ["bash", "-c", f"setpriv {ids} sleep 300 & echo $!; sleep 300"],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        member = int(leader.stdout.readline())
        assert wait_until(lambda: (_entry(supervisor, member) or {}).get("command") == "sleep 300", 5)
        response = _signal(supervisor, member, "KILL", group=True)
        assert response.status_code == 404 and _error(response) == "process_not_found"
        time.sleep(0.2)
        assert leader.poll() is None and _alive(member)
        # the member alone is the sandbox user's to signal
        assert _signal(supervisor, member, "KILL").status_code == 200
        assert wait_until(lambda: not _alive(member), 5) and leader.poll() is None
    finally:
        kill_group(leader.pid)
        leader.wait()
        leader.stdout.close()


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs a system python3 the sandbox user can run")
def test_a_thread_id_is_not_a_process(supervisor, reap):
    # /proc/<tid> exists for every thread of a sandbox user's process (it is just not listed): no signal by its id
    script = (
        "import os, threading, time; t = threading.Thread(target=time.sleep, args=(300,), daemon=True); t.start();"
        " open('ids', 'w').write(f'{t.native_id}\\n'); time.sleep(300)"
    )
    [pid] = _background(supervisor, reap, f'{SYSTEM_PYTHON} -c "{script}" >/dev/null 2>&1 </dev/null & echo $!')
    ids = supervisor.workspace / "ids"
    assert wait_until(lambda: ids.exists() and ids.read_text().endswith("\n"), 10)
    tid = int(ids.read_text())
    assert tid != pid and os.path.exists(f"/proc/{tid}")
    assert tid not in {p["pid"] for p in _listing(supervisor)["processes"]}
    response = _signal(supervisor, tid, "KILL")
    assert response.status_code == 404 and _error(response) == "process_not_found"
    time.sleep(0.2)
    assert _alive(pid)


# --- refused requests ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("segment", ["abc", "0", "-1", "99999999", "4194305", "1.5", "%201"])
def test_invalid_pids_are_refused(shared_supervisor, segment):
    response = _signal(shared_supervisor, segment)
    assert response.status_code == 400 and _error(response) == "invalid_pid"


@pytest.mark.parametrize(
    "body, code",
    [
        ({"signal": "USR1"}, "invalid_signal"),
        ({"signal": "term"}, "invalid_signal"),
        ({"signal": 15}, "invalid_signal"),
        ({}, "invalid_signal"),
        ({"signal": "TERM", "group": "yes"}, "invalid_field"),
        ({"signal": "TERM", "force": True}, "unknown_field"),
    ],
)
def test_invalid_bodies_are_refused(shared_supervisor, body, code):
    response = shared_supervisor.client.post(f"/processes/{os.getpid()}/signal", json=body)
    assert response.status_code == 400 and _error(response) == code


def test_malformed_requests_are_refused(shared_supervisor):
    client = shared_supervisor.client
    assert _error(client.get("/processes", params={"all": "1"})) == "invalid_query"
    response = client.post("/processes/1/signal", params={"x": "1"}, json={"signal": "TERM"})
    assert _error(response) == "invalid_query"
    response = client.post("/processes/1/signal", content=b'{"signal": "TERM"}')
    assert response.status_code == 415
    response = client.post("/processes/1/signal", content=b"[", headers={"Content-Type": "application/json"})
    assert _error(response) == "invalid_json"
    assert client.get("/processes/1/signal").status_code == 405


def test_a_pid_that_does_not_exist_is_not_found(shared_supervisor):
    gone = subprocess.Popen(["true"])
    gone.wait()
    for pid in (NO_SUCH_PID, gone.pid):
        response = _signal(shared_supervisor, pid)
        assert response.status_code == 404 and _error(response) == "process_not_found"
