"""A workspace whose pids limit is full answers `process_limit` (what to do), not `exec_failed` ("retry"), and the
advice works: cancelling the command that holds the processes, or stopping the workspace, lets commands run again
(issue 17, defect 9). Through a real `flarebox serve` with cgroup limits (lite: 128 pids)."""

import json
import threading
import time

import pytest
from e2e import exec_events, rid, run_ok, started, terminal, ws_url

pytestmark = pytest.mark.timeout(180)

NS = "plim"
# Fills the sandbox's pids limit with sleepers (their output to /dev/null), says "full", then for HOLD seconds takes
# every pid that frees up again, so the limit stays full while the test runs its next command.
FILL = """
import os, sys, time
hold = float(sys.argv[1])
null = os.open("/dev/null", os.O_RDWR)
def spawn():
    if os.fork() == 0:
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.execv("/bin/sleep", ["sleep", "600"])
n = 0
while True:
    try:
        spawn()
        n += 1
    except BlockingIOError:
        break
print("full", n, flush=True)
end = time.monotonic() + hold
while time.monotonic() < end:
    try:
        spawn()
    except BlockingIOError:
        time.sleep(0.01)
"""


def _workspace(client, name: str) -> None:
    assert client.put(ws_url(NS, name), json={"instance": "lite"}).status_code == 201
    put = client.put(ws_url(NS, name, "files"), params={"path": "/workspace/fill.py"}, content=FILL.encode())
    assert put.status_code == 200, put.text
    run_ok(client, NS, name, "true")


def _refused(client, name: str) -> list:
    events = exec_events(client, NS, name, "echo should-not-run")
    end = terminal(events)
    assert end == {**end, "type": "error", "code": "process_limit"}, events
    assert started(events)["container"] == "continuing"  # the same container, only full
    assert "stop" in end["message"] and "cancel" in end["message"]  # says what to do
    assert "should-not-run" not in json.dumps(events)
    return events


def test_a_full_pids_limit_answers_process_limit_and_cancel_frees_it(limited_server):
    with limited_server.client() as client:
        _workspace(client, "cancel")
        request_id, lines, full = rid(), [], threading.Event()

        def filler() -> None:
            body = {"request_id": request_id, "command": "python3 /workspace/fill.py 90", "timeout": 120}
            with limited_server.client() as own, own.stream("POST", ws_url(NS, "cancel", "exec"), json=body) as resp:
                for line in resp.iter_lines():
                    if line.strip():
                        lines.append(json.loads(line))
                        if '"full' in line:
                            full.set()

        thread = threading.Thread(target=filler)
        thread.start()
        try:
            assert full.wait(60), lines
            _refused(client, "cancel")
            _refused(client, "cancel")  # it repeats: retrying as is does not help
            cancel = client.post(ws_url(NS, "cancel", "exec", request_id, "cancel"))
            assert cancel.json()["state"] == "cancelled", cancel.text
        finally:
            thread.join(60)
        assert terminal(lines)["reason"] == "cancelled", lines
        out, events = run_ok(client, NS, "cancel", "echo runs-again")
        assert out == "runs-again\n" and started(events)["container"] == "continuing"


def test_background_processes_filling_the_limit_end_with_stop(limited_server):
    with limited_server.client() as client:
        _workspace(client, "stop")
        run_ok(client, NS, "stop", "python3 /workspace/fill.py 120 >/dev/null 2>&1 &")
        deadline = time.monotonic() + 30
        while True:  # the background filler needs a moment to take every pid
            end = terminal(exec_events(client, NS, "stop", "true"))
            if end.get("code") == "process_limit":
                break
            assert end == {**end, "type": "exit", "exit_code": 0}, end
            assert time.monotonic() < deadline, "the pids limit never filled"
            time.sleep(0.2)
        _refused(client, "stop")
        stopped = client.post(ws_url(NS, "stop", "stop"), timeout=120)
        assert stopped.status_code == 200 and stopped.json()["state"] == "stopped", stopped.text
        out, events = run_ok(client, NS, "stop", "pgrep -c sleep || true")
        assert started(events)["container"] == "restored"  # a new container: none of the sleepers came back
        assert out.strip() == "0"
