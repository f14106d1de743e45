"""`flarebox serve` SIGKILLed in the middle of an export, an import and a backup: after a restart the previous
good state is listed and restorable — the same snapshots and backups, no half-written one, every file back with
its sha256 — and a half-loaded import is never what the workspace comes back on."""

import shutil
import threading
import time

import pytest
from e2e import exec_events, put_workspace, run_ok, sandbox_pids, started, terminal, wait_until, ws_url
from faults import assert_files, put_files, sample_files

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

NS = "killed"
BIG = "head -c 60000000 /dev/urandom > /workspace/big.bin && sha256sum /workspace/big.bin"


def _wait_then_kill(srv, seen: threading.Event, what: str) -> None:
    if not seen.wait(60):
        raise AssertionError(f"never saw {what}")
    srv.kill()
    wait_until(lambda: srv.proc.poll() is not None, 10, what="the server to die")


def _listed(client, ws: str, what: str) -> list[str]:
    return [s["id"] for s in client.get(ws_url(NS, ws, what)).json()[what]]


def _prepared(client, ws: str) -> tuple[dict, str]:
    files = sample_files(5)
    assert put_workspace(client, NS, ws).status_code == 201
    put_files(client, NS, ws, files)
    big = run_ok(client, NS, ws, BIG)[0].split()[0]
    return files, big


def _comes_back(client, ws: str, files: dict, big: str, container: str) -> None:
    events = exec_events(client, NS, ws, "sha256sum /workspace/big.bin")
    assert started(events)["container"] == container and terminal(events)["exit_code"] == 0, events
    assert "".join(e["data"] for e in events if e["type"] == "output").split()[0] == big
    assert_files(client, NS, ws, files)


def test_server_killed_mid_export(start_server):
    srv = start_server()
    with srv.client() as client:
        files, big = _prepared(client, "exp")
        kept = client.post(ws_url(NS, "exp", "snapshot")).json()["id"]
        seen = threading.Event()

        def export():
            try:
                with srv.client() as own, own.stream("GET", ws_url(NS, "exp", "export"), timeout=60) as resp:
                    for _ in resp.iter_raw(65536):
                        seen.set()
                        time.sleep(0.05)  # a slow reader: the export is mid-way when the server dies
            except Exception:
                pass

        reader = threading.Thread(target=export, daemon=True)
        reader.start()
        _wait_then_kill(srv, seen, "the export streaming")
        reader.join(30)
    wait_until(lambda: not sandbox_pids(srv, "exp"), 10, what="the sandbox to die with its server")
    again = start_server(data_dir=srv.data_dir)
    with again.client() as client:
        assert _listed(client, "exp", "snapshots") == [kept]
        _comes_back(client, "exp", files, big, "restarted")


def test_server_killed_mid_import(start_server, tmp_path):
    srv = start_server()
    with srv.client() as client:
        files, big = _prepared(client, "imp")
        with client.stream("GET", ws_url(NS, "imp", "export"), timeout=120) as resp:
            archive = b"".join(resp.iter_raw())
        assert client.post(ws_url(NS, "imp", "stop")).status_code == 200
        kept = _listed(client, "imp", "snapshots")
        seen = threading.Event()

        def slow_archive():
            for i in range(0, len(archive), 1 << 20):
                yield archive[i : i + (1 << 20)]
                seen.set()
                time.sleep(0.05)

        def upload():
            try:
                with srv.client() as own:
                    own.put(ws_url(NS, "imp", "import"), content=slow_archive(), timeout=120)
            except Exception:
                pass

        uploader = threading.Thread(target=upload, daemon=True)
        uploader.start()
        time.sleep(1.0)  # the new container is up and extracting
        _wait_then_kill(srv, seen, "the import streaming")
        uploader.join(30)
    wait_until(lambda: not sandbox_pids(srv, "imp"), 10, what="the sandbox to die with its server")
    again = start_server(data_dir=srv.data_dir)
    with again.client() as client:
        assert _listed(client, "imp", "snapshots") == kept
        _comes_back(client, "imp", files, big, "restored")  # never the half-loaded disk


def test_server_killed_mid_backup(start_server, tmp_path):
    backups = tmp_path / "backups"
    backups.mkdir()
    srv = start_server(env={"BACKUP_DIR": str(backups)})
    with srv.client() as client:
        files, big = _prepared(client, "bak")
        first = client.post(ws_url(NS, "bak", "backup"), timeout=120)
        assert first.status_code == 200, first.text
        run_ok(client, NS, "bak", BIG.replace("big.bin", "bigger.bin"))
        folder = backups / NS / "bak"

        def writing() -> bool:
            return any(p.name.startswith(".tmp") for p in folder.iterdir()) if folder.is_dir() else False

        seen = threading.Event()
        watcher = threading.Thread(target=lambda: wait_until(writing, 60, 0.001) and seen.set(), daemon=True)
        watcher.start()
        backer = threading.Thread(
            target=lambda: _swallow(lambda: srv.client().post(ws_url(NS, "bak", "backup"), timeout=120)), daemon=True
        )
        backer.start()
        _wait_then_kill(srv, seen, "a backup being written")
        backer.join(30)
    wait_until(lambda: not sandbox_pids(srv, "bak"), 10, what="the sandbox to die with its server")
    again = start_server(data_dir=srv.data_dir, env={"BACKUP_DIR": str(backups)})
    with again.client() as client:
        assert _listed(client, "bak", "backups") == [first.json()["id"]]
        _comes_back(client, "bak", files, big, "restarted")
        resp = client.post(ws_url(NS, "bak", "restore"), json={"backup": first.json()["id"], "discard_changes": True})
        assert resp.status_code == 200, resp.text
        _comes_back(client, "bak", files, big, "restored")


def _swallow(fn) -> None:
    try:
        fn()
    except Exception:
        pass
