"""A frozen supervisor (SIGSTOP: alive, holding its socket, answering nothing) must never hang a client.

The mechanism: a healthy supervisor sends a heartbeat at least every 10 s on an exec stream and answers everything
else promptly, so the server gives up on a sandbox that sends nothing for SUPERVISOR_SILENCE_SECONDS (30 s) and
ends the request with a clear error; a boot gives up after the sandbox's startup budget. Once the supervisor runs
again (SIGCONT), or its frozen sandbox is destroyed (a failed boot, or the idle save-and-stop) and a new one
started, the workspace works with every file intact."""

import json
import os
import shutil
import signal
import threading
import time

import pytest
from e2e import exec_events, output_of, put_workspace, rid, run_ok, started, terminal, wait_until, ws_url
from faults import assert_files, cmdline, put_files, sample_files, supervisor_pids

from standalone.peer import descends_from

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

SILENCE_BOUND = 60  # the documented silence limit is 30 s; generous headroom for a loaded CI machine


def test_exec_on_a_frozen_supervisor_ends_with_an_error_and_recovers_after_sigcont(start_server):
    srv = start_server()
    files = sample_files(7)
    with srv.client() as client:
        assert put_workspace(client, "frz", "exec").status_code == 201
        put_files(client, "frz", "exec", files)
        pids = supervisor_pids(srv, "exec")
        assert len(pids) == 1, pids
        results: dict = {}

        def timed(name, fn):
            begun = time.monotonic()
            results[name] = fn()
            results[name + "_took"] = time.monotonic() - begun

        def run_exec():
            with srv.client() as own:
                return exec_events(own, "frz", "exec", "echo after-freeze", timeout=SILENCE_BOUND + 30)

        def read_file():
            with srv.client() as own:
                return own.get(
                    ws_url("frz", "exec", "files"), params={"path": "/workspace/notes.txt"}, timeout=SILENCE_BOUND + 30
                )

        def long_exec():
            with srv.client() as own:
                return exec_events(
                    own, "frz", "exec", "echo begun; sleep 300", timeout=SILENCE_BOUND + 60, request_id=long_id
                )

        # a command already streaming when the supervisor freezes, plus a new exec and a file read on the frozen
        # sandbox: all three must end with an error within the bound
        long_id = rid()
        threads = [threading.Thread(target=timed, args=("long", long_exec))]
        threads[0].start()
        wait_until(lambda: client.get(ws_url("frz", "exec")).json()["busy"], 30, what="the long command to run")
        os.kill(pids[0], signal.SIGSTOP)
        threads += [
            threading.Thread(target=timed, args=("exec", run_exec)),
            threading.Thread(target=timed, args=("file", read_file)),
        ]
        try:
            for t in threads[1:]:
                t.start()
            time.sleep(1)
            status = client.get(ws_url("frz", "exec"), timeout=30)  # status never hangs (short busy probe)
            assert status.status_code == 200
            for t in threads:
                t.join(SILENCE_BOUND + 60)
        finally:
            os.kill(pids[0], signal.SIGCONT)
            for t in threads:
                t.join(60)
        end = terminal(results["exec"])
        assert end["type"] == "error" and end["code"] in ("container_unavailable", "container_exited"), results
        assert "answering" in end["message"], end  # says the sandbox stopped answering, not a generic failure
        assert results["exec_took"] < SILENCE_BOUND, results["exec_took"]
        long_end = terminal(results["long"])
        assert long_end["type"] == "error" and "answering" in long_end["message"], results["long"]
        assert output_of(results["long"]) == "begun\n"
        resp = results["file"]
        assert resp.status_code >= 500 and resp.json()["error"]["code"].startswith("container_"), resp.text
        assert results["file_took"] < SILENCE_BOUND, results["file_took"]
        # the streaming command outlived the freeze: its outcome is still there (cancel it, then reattach)
        assert client.post(ws_url("frz", "exec", "exec", long_id, "cancel")).json()["state"] == "cancelled"
        with client.stream("GET", ws_url("frz", "exec", "exec", long_id), params={"offset": 0}) as again:
            replay = [json.loads(line) for line in again.iter_lines() if line.strip()]
        assert output_of(replay) == "begun\n" and terminal(replay)["reason"] == "cancelled", replay
        out, events = run_ok(client, "frz", "exec", "echo alive")
        assert out == "alive\n" and started(events)["container"] == "continuing"
        assert_files(client, "frz", "exec", files)


def _freeze_new_supervisors(srv, stop: threading.Event, frozen: list[int], known: set[int]) -> None:
    """Poll /proc and SIGSTOP any new supervisor of this server's sandboxes the moment it exists (before it can
    listen: the interpreter takes far longer to start than one poll)."""
    while not stop.is_set():
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in known:
                continue
            pid = int(entry)
            line = cmdline(pid)
            if "flarebox_supervisor" not in line or line.split(" ")[0].endswith("bwrap"):
                continue
            try:
                if not descends_from(pid, srv.proc.pid):  # a sandbox of this server's, not another's
                    continue
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                continue
            known.add(pid)
            frozen.append(pid)
        time.sleep(0.002)


def test_boot_with_a_frozen_supervisor_ends_with_startup_timeout_then_boots(start_server):
    srv = start_server()
    with srv.client() as client:
        assert put_workspace(client, "frz", "boot").status_code == 201
        stop, frozen = threading.Event(), []
        known = {int(p) for p in os.listdir("/proc") if p.isdigit()}
        poller = threading.Thread(target=_freeze_new_supervisors, args=(srv, stop, frozen, known), daemon=True)
        poller.start()
        try:
            begun = time.monotonic()
            events = exec_events(client, "frz", "boot", "echo never", timeout=120)
            took = time.monotonic() - begun
        finally:
            stop.set()
            poller.join(5)
            for pid in frozen:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        assert frozen, "the poller never saw the supervisor start"
        end = terminal(events)
        assert end["type"] == "error" and end["code"] in ("startup_timeout", "container_unavailable"), events
        assert output_of(events) == ""
        assert took < 90, took  # the sandbox's 30 s readiness budget, plus margin; never a hang
        # the frozen sandbox was destroyed, not left behind: the next exec boots a new one
        assert not [p for p in frozen if os.path.exists(f"/proc/{p}") and "flarebox_supervisor" in cmdline(p)]
        out, events = run_ok(client, "frz", "boot", "echo booted")
        assert out == "booted\n" and started(events)["container"] == "fresh"


def test_idle_workspace_with_a_frozen_supervisor_is_saved_stopped_and_restored(start_server):
    """Left frozen (no SIGCONT), the workspace recovers by itself: at idle it is saved without the sync the
    supervisor cannot answer, the frozen sandbox is stopped, and the next exec restores its files in a new one."""
    srv = start_server(env={"IDLE_SECONDS": "2"})
    files = sample_files(9)
    snapshots = srv.data_dir / "snapshots" / "frz" / "idle"
    with srv.client() as client:
        assert put_workspace(client, "frz", "idle").status_code == 201
        put_files(client, "frz", "idle", files)
        (pid,) = supervisor_pids(srv, "idle")
        os.kill(pid, signal.SIGSTOP)
        try:
            # no request from here on (status reads would be fine, but disk and /proc say it all)
            wait_until(
                lambda: list(snapshots.glob("*.json")),
                SILENCE_BOUND + 30,
                interval=1,
                what="the idle save of the frozen workspace",
            )
            wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 30, what="the frozen sandbox to be stopped")
        finally:
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGCONT)
        out, events = run_ok(client, "frz", "idle", "cat /workspace/notes.txt | wc -l")
        assert started(events)["container"] == "restored" and out == "100\n"
        assert_files(client, "frz", "idle", files)
