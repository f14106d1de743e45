"""A real server with real sandboxes: workspace config semantics, cold exec streams, curl, and concurrency."""

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e import exec_events, output_of, put_workspace, rid, run_ok, started, terminal, ws_url

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]


def test_put_get_delete_semantics_and_config_conflict(server):
    with server.client() as client:
        assert client.get(ws_url("cfg", "a")).json()["error"]["code"] == "workspace_not_found"
        created = put_workspace(client, "cfg", "a", persistent=True)
        assert created.status_code == 201, created.text
        status = created.json()
        assert status["namespace"] == "cfg" and status["workspace"] == "a"
        defaults = {"image": "hermes", "instance": "standard-1", "persistent": True, "cwd": "/workspace"}
        assert status["config"] == defaults
        assert status["state"] == "created" and status["running"] is False and status["booted"] is False
        # identical config (defaults spelled out or not) confirms with 200
        assert put_workspace(client, "cfg", "a").status_code == 200
        assert put_workspace(client, "cfg", "a", instance="standard-1", cwd="/workspace").status_code == 200
        conflict = put_workspace(client, "cfg", "a", persistent=False)
        assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "config_conflict"
        # the conflicting PUT changed nothing
        assert client.get(ws_url("cfg", "a")).json()["config"]["persistent"] is True

        assert client.delete(ws_url("cfg", "a")).json()["error"]["code"] == "confirm_required"
        assert client.get(ws_url("cfg", "a")).status_code == 200
        deleted = client.delete(ws_url("cfg", "a"), params={"confirm": "true"})
        assert deleted.status_code == 200 and deleted.json() == {"deleted": True}
        assert client.get(ws_url("cfg", "a")).status_code == 404
        assert client.delete(ws_url("cfg", "a"), params={"confirm": "true"}).status_code == 404
        # after a delete the name can be created again with another config
        assert put_workspace(client, "cfg", "a", persistent=False).status_code == 201
        assert client.delete(ws_url("cfg", "a"), params={"confirm": "true"}).status_code == 200


def test_cold_exec_streams_status_then_started_fresh_then_output_then_exit(server):
    with server.client() as client:
        assert put_workspace(client, "run", "cold").status_code == 201
        events = exec_events(client, "run", "cold", "echo hello; echo err >&2; exit 3")
        kinds = [e["type"] for e in events if e["type"] != "heartbeat"]
        first_started = kinds.index("started")
        assert first_started >= 1 and set(kinds[:first_started]) == {"status"}, kinds
        assert events[0]["phase"] == "starting"
        assert started(events)["container"] == "fresh" and started(events)["snapshot"] is None
        assert kinds.index("output") > first_started
        assert output_of(events) == "hello\nerr\n"
        end = terminal(events)
        assert end["type"] == "exit" and end["exit_code"] == 3 and end["reason"] == "exited"

        # the container is now warm: no status events, `continuing`, and files persist between commands
        run_ok(client, "run", "cold", "echo data > /workspace/f.txt")
        out, events = run_ok(client, "run", "cold", "cat /workspace/f.txt; pwd; id -u")
        assert [e["type"] for e in events if e["type"] == "status"] == []
        assert started(events)["container"] == "continuing"
        lines = out.splitlines()
        assert lines[0] == "data" and lines[1] == "/workspace" and lines[2] != "0"  # never root in the sandbox

        status = client.get(ws_url("run", "cold")).json()
        assert status["state"] == "running" and status["running"] is True and status["booted"] is True


def test_exec_with_the_real_curl_binary(server):
    with server.client() as client:
        assert put_workspace(client, "run", "curl").status_code == 201
    body = json.dumps({"request_id": rid(), "command": "printf 'a\\nb\\n'; printf 'é✓' > /workspace/u.txt"})
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "-N",
            "--fail-with-body",
            "-H",
            f"Authorization: Bearer {server.token}",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
            server.url + ws_url("run", "curl", "exec"),
        ],
        capture_output=True,
        check=True,
        timeout=120,
    )
    events = [json.loads(line) for line in out.stdout.decode().splitlines() if line.strip()]
    assert output_of(events) == "a\nb\n" and terminal(events)["exit_code"] == 0
    # a file uploaded with curl comes back byte for byte, and the one written by the command too
    up = subprocess.run(
        [
            "curl",
            "-sS",
            "--fail-with-body",
            "-X",
            "PUT",
            "-H",
            f"Authorization: Bearer {server.token}",
            "--data-binary",
            "@-",
            server.url + ws_url("run", "curl", "files") + "?path=/workspace/up.bin",
        ],
        input=bytes(range(256)) * 10,
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert json.loads(up.stdout) == {"path": "/workspace/up.bin", "size": 2560}
    for path, expected in (("/workspace/up.bin", bytes(range(256)) * 10), ("/workspace/u.txt", "é✓".encode())):
        got = subprocess.run(
            [
                "curl",
                "-sS",
                "--fail-with-body",
                "-H",
                f"Authorization: Bearer {server.token}",
                server.url + ws_url("run", "curl", "files") + f"?path={path}",
            ],
            capture_output=True,
            check=True,
            timeout=60,
        )
        assert got.stdout == expected


def test_ten_workspaces_five_concurrent_commands_each(server):
    names = [f"many{i}" for i in range(10)]
    with server.client() as client:
        for name in names:
            assert put_workspace(client, "conc", name).status_code == 201

    def one(job):
        name, k = job
        with server.client() as client:
            command = f"echo {name}-{k} > /workspace/{k}.txt; sleep 0.2; cat /workspace/{k}.txt; exit {k}"
            events = exec_events(client, "conc", name, command)
            return name, k, output_of(events), terminal(events)

    jobs = [(name, k) for name in names for k in range(5)]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(one, jobs))
    for name, k, out, end in results:
        assert out == f"{name}-{k}\n", (name, k, out, end)
        assert end == {**end, "type": "exit", "exit_code": k, "reason": "exited"}
    with server.client() as client:
        for name in names:
            # every workspace holds exactly its own five files: no cross-talk between sandboxes
            out, _ = run_ok(client, "conc", name, "cat /workspace/*.txt | sort")
            assert out.splitlines() == sorted(f"{name}-{k}" for k in range(5))
            assert client.delete(ws_url("conc", name), params={"confirm": "true"}).status_code == 200


def test_the_token_never_enters_a_sandbox_a_snapshot_or_a_state_file(server):
    with server.client() as client:
        assert put_workspace(client, "sec", "env").status_code == 201
        out, _ = run_ok(client, "sec", "env", "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; ls /run")
        assert out and server.token not in out and "SANDBOX_API_TOKEN" not in out
        assert client.post(ws_url("sec", "env", "snapshot")).status_code == 200
    token = server.token.encode()
    checked = 0
    for path in server.data_dir.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if path.name.endswith(".tar.zst"):
            data = subprocess.run(["zstd", "-d", "-q", "-c", str(path)], capture_output=True, check=True).stdout
        assert token not in data, path
        checked += 1
    assert checked >= 3  # state files, sandbox logs and the snapshot were really looked at
