"""Idle snapshots, restores, ephemeral workspaces, failed and damaged snapshots, and lost workspaces, against a real
server with IDLE_SECONDS=2. Progress is watched on disk and in /proc, not by polling the API: a request would count
as activity and push the idle deadline."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from e2e import (
    ServerProcess,
    exec_events,
    output_of,
    put_workspace,
    remove_temp_dir,
    run_ok,
    sandbox_pids,
    short_temp_dir,
    started,
    terminal,
    wait_until,
    ws_url,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]


@pytest.fixture(scope="module")
def idle_server():
    root = short_temp_dir()
    proc = ServerProcess(root / "data", {"IDLE_SECONDS": "2"})
    try:
        yield proc.start()
    finally:
        proc.stop()
        remove_temp_dir(root)


def manifests(srv, ns: str, ws: str) -> list[Path]:
    return sorted((srv.data_dir / "snapshots" / ns / ws).glob("*.json"))


def ws_dir(srv, ns: str, ws: str) -> Path:
    return srv.data_dir / "workspaces" / ns / ws


def test_idle_persistent_workspace_is_snapshotted_stopped_and_restored_intact(idle_server):
    srv = idle_server
    with srv.client() as client:
        assert put_workspace(client, "idle", "keep").status_code == 201
        run_ok(client, "idle", "keep", "mkdir -p /workspace/d && seq 1 5000 > /workspace/d/n.txt && echo hi > ~/h")
        # no request from here on: the idle alarm snapshots and stops it
        wait_until(lambda: manifests(srv, "idle", "keep"), 30, what="an idle snapshot")
        # the state turns stopped once the teardown is done, a moment after the sandbox's processes are gone
        wait_until(lambda: client.get(ws_url("idle", "keep")).json()["state"] == "stopped", 30, what="a stopped state")
        status = client.get(ws_url("idle", "keep")).json()
        assert status["running"] is False and not sandbox_pids(srv, "keep")
        assert status["last_snapshot"]["id"] == manifests(srv, "idle", "keep")[-1].stem

        events = exec_events(client, "idle", "keep", "wc -l < /workspace/d/n.txt; cat ~/h")
        assert [e["phase"] for e in events if e["type"] == "status"][:1] == ["restoring"]
        begun = started(events)
        assert begun["container"] == "restored" and begun["snapshot"]["id"] == status["last_snapshot"]["id"]
        assert output_of(events) == "5000\nhi\n" and terminal(events)["exit_code"] == 0


def test_idle_ephemeral_workspace_is_forgotten(idle_server):
    srv = idle_server
    with srv.client() as client:
        assert put_workspace(client, "idle", "temp", persistent=False).status_code == 201
        run_ok(client, "idle", "temp", "echo x > /workspace/x")
        assert sandbox_pids(srv, "temp")
        wait_until(lambda: not ws_dir(srv, "idle", "temp").exists(), 30, what="the ephemeral workspace to go")
        assert not sandbox_pids(srv, "temp")
        assert client.get(ws_url("idle", "temp")).json()["error"]["code"] == "workspace_not_found"
        assert not manifests(srv, "idle", "temp")


@pytest.fixture
def full_snapshot_dir(idle_server):
    """The snapshot directory of idle/stuck on a 64 KiB tmpfs: every save of a bigger workspace fails (ENOSPC).
    (Root ignores permission bits, so a full disk is the honest way to make the store refuse writes.)"""
    target = idle_server.data_dir / "snapshots" / "idle" / "stuck"
    target.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(target)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    state = {"mounted": True}

    def release():
        if state["mounted"]:
            subprocess.run(["umount", "-l", str(target)], check=True)
            state["mounted"] = False

    try:
        yield release
    finally:
        release()


def test_full_snapshot_store_keeps_the_workspace_running_and_is_retried(idle_server, full_snapshot_dir):
    srv = idle_server
    with srv.client() as client:
        assert put_workspace(client, "idle", "stuck").status_code == 201
        run_ok(client, "idle", "stuck", "echo precious > /workspace/p; head -c 1000000 /dev/urandom > /workspace/big")
        failed = client.post(ws_url("idle", "stuck", "snapshot"))
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "snapshot_failed", failed.text
        assert srv.token not in failed.text
        pids = sandbox_pids(srv, "stuck")
        assert pids
        # the idle save fails too; the container keeps running (the same sandbox, not a new one)
        time.sleep(5)  # well past the 2 s idle deadline: a wrongly stopped workspace would be gone by now
        assert sandbox_pids(srv, "stuck") == pids
        assert not manifests(srv, "idle", "stuck")
        full_snapshot_dir()  # space again
        # the retry (30 s after the failed idle save) saves and stops it, with no request from us
        wait_until(lambda: manifests(srv, "idle", "stuck"), 60, what="the retried snapshot")
        wait_until(lambda: not sandbox_pids(srv, "stuck"), 30, what="the sandbox to stop")
        out, events = run_ok(client, "idle", "stuck", "cat /workspace/p")
        assert out == "precious\n" and started(events)["container"] == "restored"


def test_damaged_snapshot_is_refused_with_a_clear_error(idle_server):
    srv = idle_server
    with srv.client() as client:
        assert put_workspace(client, "idle", "rot").status_code == 201
        run_ok(client, "idle", "rot", "head -c 200000 /dev/urandom > /workspace/r")
        stopped = client.post(ws_url("idle", "rot", "stop"))
        assert stopped.status_code == 200 and stopped.json()["state"] == "stopped", stopped.text
        (archive,) = (srv.data_dir / "snapshots" / "idle" / "rot").glob("*.tar.zst")
        with open(archive, "r+b") as handle:  # flip bytes in the middle of the archive
            handle.seek(archive.stat().st_size // 2)
            chunk = handle.read(64)
            handle.seek(archive.stat().st_size // 2)
            handle.write(bytes(b ^ 0xFF for b in chunk))
        events = exec_events(client, "idle", "rot", "echo should-not-run")
        end = terminal(events)
        assert end["type"] == "error" and end["code"] == "snapshot_damaged", events
        assert archive.stem.split(".")[0] in end["message"] or "snapshot" in end["message"]
        assert "should-not-run" not in output_of(events)
        assert not [e for e in events if e["type"] == "started"]  # it never started from an empty disk
        assert client.get(ws_url("idle", "rot")).json()["state"] in ("stopped", "lost")


def test_booted_workspace_without_disk_or_snapshot_is_lost(idle_server):
    srv = idle_server
    with srv.client() as client:
        assert put_workspace(client, "idle", "gone").status_code == 201
        run_ok(client, "idle", "gone", "echo x > /workspace/x")
        directory = ws_dir(srv, "idle", "gone")
        for pid in sandbox_pids(srv, "gone"):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not sandbox_pids(srv, "gone"), 10, what="the sandbox to die")
        # the live files go too (a disk failure): only the workspace's own state file is left
        for entry in directory.iterdir():
            if not entry.name.startswith("state.sqlite3"):
                os.system(f"chmod -R u+rwX '{entry}'")  # noqa: S605 - a test path we created
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        events = exec_events(client, "idle", "gone", "echo should-not-run")
        end = terminal(events)
        assert end["type"] == "error" and end["code"] == "workspace_lost", events
        assert not [e for e in events if e["type"] == "started"]
        # and it stays lost: never silently comes back empty
        assert terminal(exec_events(client, "idle", "gone", "true"))["code"] == "workspace_lost"
        assert client.get(ws_url("idle", "gone")).json()["state"] == "lost"
