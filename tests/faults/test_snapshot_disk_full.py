"""The disk holding the snapshots fills up in the middle of a snapshot: the save fails with snapshot_failed, the
workspace keeps running with every file intact, the store is left with the older snapshot only (no partial archive
listed or left behind), and a save succeeds once space returns — and restores byte for byte."""

import shutil

import pytest
from e2e import put_workspace, run_ok, sandbox_pids, started, ws_url
from faults import assert_files, put_files, sample_files, sha, tmpfs_at

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]


def test_snapshot_store_fills_up_mid_snapshot(start_server):
    data_dir = start_server.root / "data"
    store = data_dir / "snapshots"
    # 6 MiB: room for the first snapshot (~2 MiB of random data) but not for the second (~8 MiB)
    with tmpfs_at(store, "6m") as resize:
        srv = start_server(data_dir=data_dir)
        with srv.client() as client:
            assert put_workspace(client, "full", "mid").status_code == 201
            first_files = sample_files(1, big=2 * 1024 * 1024)
            put_files(client, "full", "mid", first_files)
            first = client.post(ws_url("full", "mid", "snapshot"))
            assert first.status_code == 200, first.text

            # 8 MiB more of incompressible data: the archive outgrows the free space while zstd is writing it
            more = {"/workspace/more.bin": first_files["/workspace/big.bin"][::-1] * 4}
            put_files(client, "full", "mid", more)
            pids = sandbox_pids(srv, "mid")
            failed = client.post(ws_url("full", "mid", "snapshot"))
            assert failed.status_code == 503 and failed.json()["error"]["code"] == "snapshot_failed", failed.text
            assert "No space left" in failed.json()["error"]["message"] or "space" in failed.json()["error"]["message"]

            # still running: same sandbox, same files, exec works, state running
            assert sandbox_pids(srv, "mid") == pids
            status = client.get(ws_url("full", "mid")).json()
            assert status["state"] == "running" and status["running"] is True
            assert status["last_snapshot"]["id"] == first.json()["id"]
            assert_files(client, "full", "mid", {**first_files, **more})
            # nothing half-written listed or left in the store: only the first snapshot's archive and manifest
            listed = client.get(ws_url("full", "mid", "snapshots")).json()["snapshots"]
            assert [s["id"] for s in listed] == [first.json()["id"]]
            left = sorted(p.name for p in (store / "full" / "mid").iterdir())
            assert left == sorted([first.json()["id"] + ".json", first.json()["id"] + ".tar.zst"]), left
            assert shutil.disk_usage(store).used < 4 * 1024 * 1024  # the partial archive's space was given back

            resize("64m")  # space returns
            second = client.post(ws_url("full", "mid", "snapshot"))
            assert second.status_code == 200, second.text
            listed = client.get(ws_url("full", "mid", "snapshots")).json()["snapshots"]
            assert listed[0]["id"] == second.json()["id"]  # (retention may drop the first: same 5-minute slot)

            # the new snapshot really holds everything: stop (another save, then the disk goes), restore, compare
            stopped = client.post(ws_url("full", "mid", "stop"))
            assert stopped.status_code == 200 and stopped.json()["state"] == "stopped", stopped.text
            assert not (data_dir / "workspaces" / "full" / "mid" / "root").exists()  # only the snapshot is left
            out, events = run_ok(client, "full", "mid", "sha256sum /workspace/more.bin")
            assert started(events)["container"] == "restored"
            assert out.split()[0] == sha(more["/workspace/more.bin"])
            assert_files(client, "full", "mid", {**first_files, **more})
        srv.stop()
