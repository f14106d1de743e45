"""Snapshots a user controls, end to end against real servers and sandboxes: label, change and roll back; three
forks that diverge; an export from one server imported into another with every file's sha256 equal; backups in a
directory written, pruned and restored; a damaged archive that changes nothing."""

import shutil
import subprocess

import pytest
from e2e import exec_events, flarebox_command, put_workspace, run_ok, started, terminal, ws_url

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

NS = "tools"
# Every entry of /workspace with its type, mode and link target, then every regular file's sha256: equal digests
# mean the same tree, byte for byte.
TREE = (
    "cd /workspace && find . -mindepth 1 -printf '%y %m %p %l\\n' | LC_ALL=C sort"
    " && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum"
)
MAKE_TREE = (
    "mkdir -p /workspace/src/pkg /workspace/empty && seq 1 20000 > /workspace/src/numbers.txt"
    " && head -c 300000 /dev/urandom > /workspace/src/pkg/blob.bin && printf 'x' > /workspace/src/pkg/a.py"
    " && chmod 751 /workspace/src/pkg/a.py && ln -s pkg/a.py /workspace/src/link && ln -s /etc/passwd /workspace/abs"
)
CHANGE_TREE = (
    "rm -r /workspace/src/pkg && echo changed >> /workspace/src/numbers.txt && mkdir /workspace/new"
    " && echo new > /workspace/new/file && rm /workspace/abs"
)


def tree(client, ws: str) -> str:
    out, _ = run_ok(client, NS, ws, TREE)
    assert "numbers.txt" in out or "file" in out, out
    return out


def test_label_change_rollback_restores_exactly_the_labelled_files(server):
    with server.client() as client:
        assert put_workspace(client, NS, "roll").status_code == 201
        run_ok(client, NS, "roll", MAKE_TREE)
        labelled = tree(client, "roll")
        snap = client.post(ws_url(NS, "roll", "snapshot"), json={"label": "before-migration", "keep": True})
        assert snap.status_code == 200 and snap.json()["label"] == "before-migration", snap.text
        run_ok(client, NS, "roll", CHANGE_TREE)
        changed = tree(client, "roll")
        assert changed != labelled
        resp = client.post(ws_url(NS, "roll", "restore"), json={"snapshot": snap.json()["id"]})
        assert resp.status_code == 200, resp.text
        safety = resp.json()["safety_snapshot"]
        events = exec_events(client, NS, "roll", "true")
        assert started(events)["container"] == "restored" and started(events)["snapshot"]["id"] == snap.json()["id"]
        assert tree(client, "roll") == labelled
        # the changes were saved first: rolling forward to the safety snapshot brings them back
        resp = client.post(ws_url(NS, "roll", "restore"), json={"snapshot": safety["id"], "discard_changes": True})
        assert resp.status_code == 200 and resp.json()["safety_snapshot"] is None
        assert tree(client, "roll") == changed
        listed = {s["id"]: s for s in client.get(ws_url(NS, "roll", "snapshots")).json()["snapshots"]}
        assert listed[snap.json()["id"]]["kept"] is True


def test_three_forks_of_a_running_workspace_diverge_without_touching_it(server):
    with server.client() as client:
        assert put_workspace(client, NS, "origin").status_code == 201
        run_ok(client, NS, "origin", "echo base > /workspace/base.txt")
        for i in range(3):
            resp = client.put(ws_url(NS, f"fork{i}"), json={"from": {"namespace": NS, "workspace": "origin"}})
            assert resp.status_code == 201 and resp.json()["state"] == "stopped", resp.text
            out, events = run_ok(client, NS, f"fork{i}", f"cat base.txt && echo {i} > mine.txt")
            assert started(events)["container"] == "restored" and out == "base\n"
        for i in range(3):
            assert run_ok(client, NS, f"fork{i}", "cat mine.txt")[0] == f"{i}\n"
        out, events = run_ok(client, NS, "origin", "ls /workspace")
        assert out == "base.txt\n" and started(events)["container"] == "continuing"


def test_export_from_one_server_imports_into_another_identically(start_server, tmp_path):
    first, second = start_server(), start_server()
    archive = tmp_path / "ws.tar.zst"
    with first.client() as client:
        assert put_workspace(client, NS, "move").status_code == 201
        run_ok(client, NS, "move", MAKE_TREE)
        before = tree(client, "move")
        with client.stream("GET", ws_url(NS, "move", "export"), timeout=120) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"] == "application/zstd"
            with open(archive, "wb") as out:
                for chunk in resp.iter_raw():
                    out.write(chunk)

    def cli_import() -> subprocess.CompletedProcess:  # `flarebox import WS < ws.tar.zst`, progress on stderr
        with archive.open("rb") as source:
            command = [*flarebox_command(), "import", "--namespace", NS, "moved"]
            return subprocess.run(command, stdin=source, capture_output=True, env=second.client_env(), timeout=120)

    imported = cli_import()
    assert imported.returncode != 0 and b"workspace_not_found" in imported.stderr  # it must exist first
    with second.client() as client:
        assert put_workspace(client, NS, "moved").status_code == 201
    imported = cli_import()
    assert imported.returncode == 0, imported.stderr
    assert b"sent" in imported.stderr and b'"files"' in imported.stdout
    with second.client() as client:
        assert tree(client, "moved") == before
        assert client.get(ws_url(NS, "moved", "snapshots")).json()["snapshots"]  # saved at once


def test_a_damaged_archive_changes_nothing(server, tmp_path):
    with server.client() as client:
        assert put_workspace(client, NS, "intact").status_code == 201
        run_ok(client, NS, "intact", MAKE_TREE)
        before = tree(client, "intact")
        with client.stream("GET", ws_url(NS, "intact", "export"), timeout=120) as resp:
            data = bytearray(b"".join(resp.iter_raw()))
        assert client.post(ws_url(NS, "intact", "stop")).status_code == 200
        data[len(data) // 2] ^= 0xFF
        resp = client.put(ws_url(NS, "intact", "import"), content=bytes(data), timeout=120)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_archive", resp.text
        assert tree(client, "intact") == before
        running = client.put(ws_url(NS, "intact", "import"), content=bytes(data), timeout=120)
        assert running.status_code == 409 and running.json()["error"]["code"] == "workspace_running"


def test_backups_in_a_directory_are_written_pruned_and_restored(start_server, tmp_path):
    (tmp_path / "backups").mkdir()  # the operator's disk: never created by the server (an unmounted one is an error)
    srv = start_server(env={"BACKUP_DIR": str(tmp_path / "backups")})
    with srv.client() as client:
        assert put_workspace(client, NS, "safe").status_code == 201
        run_ok(client, NS, "safe", MAKE_TREE)
        before = tree(client, "safe")
        first = client.post(ws_url(NS, "safe", "backup"), timeout=120)
        assert first.status_code == 200, first.text
        second = client.post(ws_url(NS, "safe", "backup"), timeout=120).json()
        listed = client.get(ws_url(NS, "safe", "backups")).json()["backups"]
        assert [b["id"] for b in listed] == [second["id"]]  # the same day's older backup was pruned
        run_ok(client, NS, "safe", CHANGE_TREE)
        resp = client.post(ws_url(NS, "safe", "restore"), json={"backup": second["id"], "discard_changes": True})
        assert resp.status_code == 200, resp.text
        events = exec_events(client, NS, "safe", "true")
        assert started(events)["from"] == "backup" and started(events)["backup"]["id"] == second["id"]
        assert terminal(events)["exit_code"] == 0
        assert tree(client, "safe") == before


def test_backups_without_a_store_say_how_to_get_one(server):
    with server.client() as client:
        assert put_workspace(client, NS, "nostore").status_code == 201
        resp = client.post(ws_url(NS, "nostore", "backup"))
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "backups_unavailable"
        assert "BACKUP_DIR" in resp.json()["error"]["message"]
