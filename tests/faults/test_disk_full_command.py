"""A command fills the disk its workspace lives on. The runtime has no per-workspace size limit, so the whole data
dir sits on a small tmpfs here (no root-reserved blocks, the worst case).

- The command fails with ENOSPC (its own exit code); the server releases its state reserve (reserve.py), so the
  server, the workspace itself and its neighbours keep working — the agent can `rm` what it wrote — and nothing
  already written is lost (sha256). Once space is back the reserve is put back.
- Filled again with the reserve already spent: requests that must record state answer 507 storage_full with
  nothing run, reads (health, status) still answer, never a 500; freed space makes everything work again."""

import shutil
import time

import pytest
from e2e import exec_events, output_of, put_workspace, run_ok, terminal, wait_until, ws_url
from faults import assert_files, put_files, sample_files, tmpfs_at

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

FILL = "cat /dev/zero > /workspace/{name}; echo rc=$?"


def _fill(client, name: str) -> None:
    events = exec_events(client, "disk", "hog", FILL.format(name=name))
    assert terminal(events)["type"] == "exit", events
    assert "No space left" in output_of(events) and "rc=1" in output_of(events), events


def test_command_filling_the_disk_leaves_server_and_neighbours_working(start_server):
    data_dir = start_server.root / "data"
    with tmpfs_at(data_dir, "48m"):
        srv = start_server(data_dir=data_dir)
        reserve = data_dir / "disk-reserve"
        assert reserve.stat().st_size > 0  # placed at start
        with srv.client() as client:
            files = {}
            for ws in ("hog", "calm"):
                assert put_workspace(client, "disk", ws).status_code == 201
                files[ws] = sample_files(len(ws))
                put_files(client, "disk", ws, files[ws])

            _fill(client, "fill")
            # the first state write that needs space releases the reserve for the server's state: the fill's own
            # end is activity written at most once a second (durable/workspace.py `_touch`), so the next requests'
            # writes (an exec's request id, its idle push) may be the first to find the disk full
            wait_until(
                lambda: run_ok(client, "disk", "calm", "true") and not reserve.exists(),
                10,
                interval=0.5,
                what="the reserve to be released",
            )
            # the server, the hog and its neighbour keep working: execs, file reads, status
            assert client.get("/v1/health").status_code == 200
            for ws in ("hog", "calm"):
                assert client.get(ws_url("disk", ws)).json()["state"] == "running"
                assert run_ok(client, "disk", ws, "echo still-here")[0] == "still-here\n"
                assert_files(client, "disk", ws, files[ws])
            # an upload that no longer fits is 507 storage_full (not a 500), and the file it replaces is intact
            path = next(iter(files["hog"]))
            upload = client.put(ws_url("disk", "hog", "files"), params={"path": path}, content=b"z" * (40 << 20))
            assert upload.status_code == 507 and upload.json()["error"]["code"] == "storage_full", upload.text
            assert "disk is full" in upload.json()["error"]["message"]
            assert_files(client, "disk", "hog", files["hog"])
            # the agent frees the space itself; the reserve comes back once the disk has room
            run_ok(client, "disk", "hog", "rm /workspace/fill")
            time.sleep(5.5)  # reserve.RECHECK_SECONDS
            run_ok(client, "disk", "calm", "true")
            assert reserve.exists()

            # filled twice: the reserve is spent and the disk stays full
            _fill(client, "fill1")
            _fill(client, "fill2")
            assert shutil.disk_usage(data_dir).free < 1024 * 1024 and not reserve.exists()
            assert client.get("/v1/health").status_code == 200
            for ws in ("hog", "calm"):
                status = client.get(ws_url("disk", ws))
                assert status.status_code == 200, status.text
                resp = client.post(
                    ws_url("disk", ws, "exec"),
                    json={"request_id": "a" * 31 + str(len(ws)), "command": "touch /workspace/ran"},
                )
                assert resp.status_code == 507 and resp.json()["error"]["code"] == "storage_full", resp.text
            # the operator frees space on the host: everything works again, the refused command never ran
            for name in ("fill1", "fill2"):
                (data_dir / "workspaces" / "disk" / "hog" / "root" / "workspace" / name).unlink()
            for ws in ("hog", "calm"):
                out, _ = run_ok(client, "disk", ws, "test -e /workspace/ran && echo ran || echo not-run")
                assert out == "not-run\n"
                assert_files(client, "disk", ws, files[ws])
            more = {"/workspace/new.bin": b"y" * 1024 * 1024}
            put_files(client, "disk", "calm", more)
            assert_files(client, "disk", "calm", more)
            assert client.post(ws_url("disk", "hog", "snapshot")).status_code == 200
            wait_until(
                lambda: run_ok(client, "disk", "calm", "true") and reserve.exists(),
                15,
                interval=1,
                what="the reserve to be put back",
            )
        srv.stop()
