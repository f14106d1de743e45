"""`flarebox serve` SIGKILLed in the middle of an incremental save: after a restart the half-written increment is
neither listed nor left on disk, the previous snapshot is still listed and restorable (sha256 of every file), the
live base still names it (the next save is an increment of it), and the files come back whole."""

import hashlib
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from e2e import exec_events, put_workspace, run_ok, sandbox_pids, started, terminal, wait_until, ws_url
from faults import assert_files, put_files, sample_files

from standalone.snapshots import SnapshotStore

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

# many files, so that the save of the increment (which copies the changed ones) takes long enough to be caught
FILL = "mkdir -p /workspace/many && for i in $(seq 1 60); do head -c 1000000 /dev/urandom > /workspace/many/f$i; done"
CHANGE = "for i in $(seq 1 60); do head -c 1000000 /dev/urandom > /workspace/many/f$i; done; echo later > /workspace/l"


def _tmp_entries(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.startswith(".tmp")] if directory.is_dir() else []


def _sums(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def test_server_killed_during_an_incremental_save(start_server, tmp_path):
    srv = start_server()
    store = srv.data_dir / "snapshots" / "kill" / "inc"
    ws_dir = srv.data_dir / "workspaces" / "kill" / "inc"
    base = ws_dir / "root.snapshot-base"
    files = sample_files(5)
    with srv.client() as client:
        assert put_workspace(client, "kill", "inc").status_code == 201
        put_files(client, "kill", "inc", files)
        run_ok(client, "kill", "inc", FILL)
        time.sleep(0.05)
        done = client.post(ws_url("kill", "inc", "snapshot"))
        assert done.status_code == 200, done.text
        kept = done.json()["id"]
        assert sorted(p.name for p in base.iterdir()) == [f"{kept}.snar"]
        saved_state = _sums(ws_dir / "root")
        live_sums = run_ok(client, "kill", "inc", CHANGE + " && sha256sum /workspace/many/f1 /workspace/many/f60")[0]

        def save():
            with srv.client() as own:
                own.post(ws_url("kill", "inc", "snapshot"))

        saver = threading.Thread(target=lambda: _quietly(save), daemon=True)
        saver.start()
        deadline = time.monotonic() + 60
        while not _tmp_entries(store):
            assert time.monotonic() < deadline and srv.proc.poll() is None, "never saw an increment being written"
            time.sleep(0.001)
        srv.kill()
        saver.join(30)
    assert _tmp_entries(store)  # the half-written increment is really there at the moment of the crash
    wait_until(lambda: not sandbox_pids(srv, "inc"), 10, what="the sandbox to die with its server")

    again = start_server(data_dir=srv.data_dir)
    assert not _tmp_entries(store)  # cleaned at start
    with again.client() as client:
        listed = client.get(ws_url("kill", "inc", "snapshots")).json()["snapshots"]
        assert [s["id"] for s in listed] == [kept]
        assert sorted(p.name for p in store.iterdir()) == sorted([kept + ".json", kept + ".tar.zst"])
        assert sorted(p.name for p in base.iterdir() if not p.name.startswith(".tmp")) == [f"{kept}.snar"]
        # the snapshot that was the newest at the crash restores exactly what it saved (the server is idle now;
        # later saves may let retention unlist it)
        out = tmp_path / "restored"
        snapshots = SnapshotStore(srv.data_dir / "snapshots")
        snapshots.verify("kill", "inc", kept)
        snapshots.restore("kill", "inc", kept, out)
        assert _sums(out) == saved_state
        subprocess.run(["rm", "-rf", str(out)], check=True)

        events = exec_events(client, "kill", "inc", "sha256sum /workspace/many/f1 /workspace/many/f60")
        assert started(events)["container"] == "restarted"  # its disk survived: nothing rolled back
        assert terminal(events)["exit_code"] == 0
        assert "".join(e["data"] for e in events if e["type"] == "output") == live_sums
        assert_files(client, "kill", "inc", files)

        # the base survived with the snapshot it names: the next save is an increment of it, and restores
        redo = client.post(ws_url("kill", "inc", "snapshot"))
        assert redo.status_code == 200, redo.text
        increment = json.loads((store / f"{redo.json()['id']}.json").read_text())
        assert (increment["parent"], increment["level"]) == (kept, 1)
        stopped = client.post(ws_url("kill", "inc", "stop"))
        assert stopped.status_code == 200 and stopped.json()["state"] == "stopped", stopped.text
        events = exec_events(client, "kill", "inc", "sha256sum /workspace/many/f1 /workspace/many/f60")
        assert started(events)["container"] == "restored"
        assert "".join(e["data"] for e in events if e["type"] == "output") == live_sums
        assert_files(client, "kill", "inc", files)
        assert run_ok(client, "kill", "inc", "cat /workspace/l")[0] == "later\n"
    again.stop()


def _quietly(fn) -> None:
    try:
        fn()
    except Exception:  # the server dies under it: a transport error is the expected outcome
        pass
