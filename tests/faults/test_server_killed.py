"""`flarebox serve` SIGKILLed in the middle of a snapshot, and in the middle of a restore: after a restart no
half-written snapshot is listed or left on disk, the workspace comes back with every file (sha256), and the next
exec works."""

import shutil
import threading
import time
from pathlib import Path

import pytest
from e2e import exec_events, put_workspace, run_ok, sandbox_pids, started, terminal, wait_until, ws_url
from faults import assert_files, put_files, sample_files

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

BIG = "head -c 120000000 /dev/urandom > /workspace/big.bin && sha256sum /workspace/big.bin"


def _kill_when(srv, appears, what: str, timeout: float = 60) -> None:
    """SIGKILL the server the moment `appears()` is true (polled every millisecond or so)."""
    deadline = time.monotonic() + timeout
    while not appears():
        if time.monotonic() > deadline or srv.proc.poll() is not None:
            raise AssertionError(f"never saw {what}")
        time.sleep(0.001)
    srv.kill()


def _tmp_entries(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.startswith(".tmp")] if directory.is_dir() else []


def _in_background(srv, fn) -> threading.Thread:
    def run():
        try:
            with srv.client() as own:
                fn(own)
        except Exception:  # the server dies under it: a transport error is the expected outcome
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_server_killed_during_a_snapshot(start_server):
    srv = start_server()
    store = srv.data_dir / "snapshots" / "kill" / "snap"
    files = sample_files(3)
    with srv.client() as client:
        assert put_workspace(client, "kill", "snap").status_code == 201
        put_files(client, "kill", "snap", files)
        big_sum = run_ok(client, "kill", "snap", BIG)[0].split()[0]
        done = client.post(ws_url("kill", "snap", "snapshot"))
        assert done.status_code == 200
        kept = done.json()["id"]
        run_ok(client, "kill", "snap", "echo newer > /workspace/newer.txt")
        saver = _in_background(srv, lambda own: own.post(ws_url("kill", "snap", "snapshot")))
        _kill_when(srv, lambda: _tmp_entries(store), "a snapshot being written")
        saver.join(30)
    assert _tmp_entries(store)  # the half-written archive is really there at the moment of the crash
    wait_until(lambda: not sandbox_pids(srv, "snap"), 10, what="the sandbox to die with its server")

    again = start_server(data_dir=srv.data_dir)
    assert not _tmp_entries(store)  # cleaned at start
    with again.client() as client:
        listed = client.get(ws_url("kill", "snap", "snapshots")).json()["snapshots"]
        assert [s["id"] for s in listed] == [kept]
        status = client.get(ws_url("kill", "snap")).json()  # settled when the object is rebuilt, before any exec
        assert (status["state"], status["running"]) == ("stopped", False), status
        assert sorted(p.name for p in store.iterdir()) == sorted([kept + ".json", kept + ".tar.zst"])
        events = exec_events(client, "kill", "snap", "sha256sum /workspace/big.bin; cat /workspace/newer.txt")
        assert started(events)["container"] == "restarted"  # its disk survived: nothing rolled back
        assert terminal(events)["exit_code"] == 0
        out = "".join(e["data"] for e in events if e["type"] == "output").split()
        assert out[0] == big_sum and out[-1] == "newer"
        assert_files(client, "kill", "snap", files)
        # and a snapshot now succeeds
        assert client.post(ws_url("kill", "snap", "snapshot")).status_code == 200


def test_server_killed_during_a_restore(start_server):
    srv = start_server()
    files = sample_files(4)
    ws_dir = srv.data_dir / "workspaces" / "kill" / "rest"
    with srv.client() as client:
        assert put_workspace(client, "kill", "rest").status_code == 201
        put_files(client, "kill", "rest", files)
        big_sum = run_ok(client, "kill", "rest", BIG)[0].split()[0]
        stopped = client.post(ws_url("kill", "rest", "stop"))
        assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
        assert not (ws_dir / "root").exists()
        restorer = _in_background(srv, lambda own: exec_events(own, "kill", "rest", "true"))
        _kill_when(srv, lambda: _tmp_entries(ws_dir), "a restore being unpacked")
        restorer.join(30)
    wait_until(lambda: not sandbox_pids(srv, "rest"), 10, what="no sandbox")

    again = start_server(data_dir=srv.data_dir)
    with again.client() as client:
        status = client.get(ws_url("kill", "rest")).json()
        assert status["state"] == "stopped", status  # not stuck in `restoring`
        events = exec_events(client, "kill", "rest", "sha256sum /workspace/big.bin")
        assert started(events)["container"] in ("restored", "restarted"), events
        assert terminal(events)["exit_code"] == 0
        assert "".join(e["data"] for e in events if e["type"] == "output").split()[0] == big_sum
        assert_files(client, "kill", "rest", files)
        assert not _tmp_entries(ws_dir)  # the interrupted restore's staging dir is gone
        assert [p.name for p in ws_dir.iterdir() if p.name.startswith(".")] == []
