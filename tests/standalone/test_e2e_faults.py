"""Faults against a real server: a sandbox killed mid-command, and the server itself killed and restarted."""

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import threading
import time

import httpx
import pytest
from e2e import exec_events, output_of, put_workspace, run_ok, sandbox_pids, started, terminal, wait_until, ws_url

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]


def test_killed_sandbox_ends_the_running_exec_with_an_error_and_the_next_exec_works(server):
    with server.client() as client:
        assert put_workspace(client, "fault", "kill9").status_code == 201
        run_ok(client, "fault", "kill9", "echo kept > /workspace/k")
        result: dict = {}

        def long_exec():
            with server.client() as own:
                result["events"] = exec_events(own, "fault", "kill9", "echo begun; sleep 120")
                result["ended_at"] = time.monotonic()

        runner = threading.Thread(target=long_exec)
        runner.start()
        try:
            wait_until(lambda: client.get(ws_url("fault", "kill9")).json()["busy"], 30, what="the command to run")
            pids = sandbox_pids(server, "kill9")
            assert pids
            killed_at = time.monotonic()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            runner.join(30)
        finally:
            runner.join(60)
        events = result["events"]
        end = terminal(events)
        assert end["type"] == "error" and end["code"] in ("container_exited", "container_unavailable"), events
        assert output_of(events) == "begun\n"
        assert result["ended_at"] - killed_at < 5  # the deadline the behaviour promises
        out, events = run_ok(client, "fault", "kill9", "cat /workspace/k")
        # the sandbox died but its disk survived: files yes, processes no
        assert out == "kept\n" and started(events)["container"] == "restarted"


def _alarm_at(data_dir, ns, ws):
    db = sqlite3.connect(f"file:{data_dir / 'workspaces' / ns / ws / 'state.sqlite3'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT at_ms FROM _standalone_alarm").fetchall()
    except sqlite3.OperationalError:
        return None
    finally:
        db.close()
    return rows[0][0] if rows else None


def _verify_snapshots(snapshot_dir) -> list[str]:
    """Every committed snapshot (a manifest) has an archive whose size and sha256 match it; returns the ids."""
    ids = []
    for manifest_path in sorted(snapshot_dir.glob("*.json")):
        manifest = json.loads(manifest_path.read_text())
        archive = manifest_path.with_name(manifest["id"] + ".tar.zst")
        data = archive.read_bytes()
        assert len(data) == manifest["size"] and hashlib.sha256(data).hexdigest() == manifest["sha256"], archive
        ids.append(manifest["id"])
    return ids


def test_killed_server_restarts_with_every_workspace_snapshot_and_alarm(start_server):
    first = start_server(env={"IDLE_SECONDS": "3"})
    data_dir = first.data_dir
    snapshot_dir = data_dir / "snapshots" / "crash" / "a"
    with first.client() as client:
        assert put_workspace(client, "crash", "a").status_code == 201
        assert put_workspace(client, "crash", "b", instance="lite", cwd="/workspace/b").status_code == 201
        run_ok(client, "crash", "a", "echo one > /workspace/one")
        snap = client.post(ws_url("crash", "a", "snapshot")).json()
        run_ok(client, "crash", "a", "echo two > /workspace/two; head -c 100M /dev/urandom > /workspace/big")
        before = {ws: client.get(ws_url("crash", ws)).json() for ws in ("a", "b")}
        # kill the server in the middle of writing a second snapshot
        saving = threading.Thread(target=_swallow, args=(lambda: client.post(ws_url("crash", "a", "snapshot")),))
        saving.start()
        wait_until(
            lambda: any(p.name.startswith(".tmp") for p in snapshot_dir.iterdir()),
            30,
            interval=0.01,
            what="a snapshot being written",
        )
        first.kill()  # SIGKILL: no shutdown code runs
        saving.join(30)
    alarm_at = _alarm_at(data_dir, "crash", "a")
    assert alarm_at is not None  # the idle deadline is persisted
    wait_until(lambda: not sandbox_pids(first, "a"), 10, what="sandboxes to die")

    second = start_server(env={"IDLE_SECONDS": "3"}, data_dir=data_dir)
    # nothing half-written survives: leftovers are gone and every committed snapshot checks out
    assert not [p for p in snapshot_dir.iterdir() if p.name.startswith(".tmp")]
    assert snap["id"] in _verify_snapshots(snapshot_dir)
    # the alarm was re-armed at start: it fires at its time with no request to the workspace, and is consumed
    wait_until(lambda: _alarm_at(data_dir, "crash", "a") is None, 30, what="the re-armed idle alarm to fire")
    assert time.time() * 1000 >= alarm_at - 100
    with second.client() as client:
        after = {ws: client.get(ws_url("crash", ws)).json() for ws in ("a", "b")}
        for ws in ("a", "b"):
            assert after[ws]["config"] == before[ws]["config"]
            assert after[ws]["created_at"] == before[ws]["created_at"]
        listed = [s["id"] for s in client.get(ws_url("crash", "a", "snapshots")).json()["snapshots"]]
        assert snap["id"] in listed and set(listed) == set(_verify_snapshots(snapshot_dir))
        events = exec_events(client, "crash", "a", "cat /workspace/one /workspace/two")
        assert started(events)["container"] in ("restarted", "restored")
        assert output_of(events).startswith("one\n") and terminal(events)["type"] == "exit"


def _swallow(fn) -> None:
    try:
        fn()
    except httpx.TransportError:
        pass  # the server was killed under this request, on purpose


def test_sigterm_stops_sandboxes_closes_sqlite_and_keeps_files(start_server):
    srv = start_server()
    with srv.client() as client:
        assert put_workspace(client, "calm", "w").status_code == 201
        run_ok(client, "calm", "w", "echo kept > /workspace/k; (sleep 300 &)")
    assert sandbox_pids(srv, "w")
    assert srv.stop() == 0  # SIGTERM: a clean exit
    assert not sandbox_pids(srv, "w")  # sandboxes run in their own sessions: the server itself stopped them
    state = srv.data_dir / "workspaces" / "calm" / "w"
    assert (state / "state.sqlite3").exists() and not (state / "state.sqlite3-wal").exists()  # closed cleanly
    again = start_server(data_dir=srv.data_dir)
    with again.client() as client:
        out, events = run_ok(client, "calm", "w", "cat /workspace/k; pgrep -c sleep || true")
        assert out == "kept\n0\n" and started(events)["container"] == "restarted"
    os.kill(again.proc.pid, signal.SIGINT)  # Ctrl-C: the same clean shutdown
    assert again.proc.wait(30) == 0
    assert not sandbox_pids(again, "w")
