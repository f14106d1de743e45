"""SANDBOX_API_TOKEN never enters a sandbox, a snapshot archive, a log line or an error body (protocol.md §3).

Each test runs a real `flarebox serve` with a known token and searches everywhere the token could end up.
"""

import sys

import httpx
import pytest
from e2e import TOKEN, rid, run_ok, ws_url
from secrets_probe import provoke_errors, snapshot_members

pytestmark = pytest.mark.timeout(120)

# What a sandbox can see of its environment: every process's environ and cmdline, and the shell's own env.
ENV_DUMP = "env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f; echo; done"


def _grep_inside(token: str) -> str:
    """A command that searches the sandbox's visible files for `token` without the token appearing in its text."""
    half = len(token) // 2
    return (
        f"A='{token[:half]}'; B='{token[half:]}'; "
        'grep -rlsF -- "$A$B" /workspace /home /tmp /run /etc /var /dev/shm 2>/dev/null; echo searched'
    )


def test_token_is_not_in_any_sandbox_environment_or_file(secure_server):
    with secure_server.client() as client:
        for name, config in (("persist", {}), ("ephem", {"persistent": False})):
            assert client.put(ws_url("sec", name), json=config).status_code in (200, 201)
            out, _ = run_ok(client, "sec", name, ENV_DUMP)
            assert "PATH=" in out and "HOME=/home/sandbox" in out  # the dump really ran
            assert TOKEN not in out and "SANDBOX_API_TOKEN" not in out
            # a login shell reads profile files: still nothing
            out, _ = run_ok(client, "sec", name, ENV_DUMP, login=True)
            assert TOKEN not in out and "SANDBOX_API_TOKEN" not in out
            out, _ = run_ok(client, "sec", name, _grep_inside(TOKEN))
            assert out == "searched\n", out
            # the supervisor's interpreter itself cannot find it either
            code = "import os; print(sorted(k for k in os.environ))"
            out, _ = run_ok(client, "sec", name, f"{sys.executable} -c '{code}'")
            assert "SANDBOX_API_TOKEN" not in out


def test_token_is_not_in_any_member_of_a_snapshot_archive(secure_server):
    with secure_server.client() as client:
        assert client.put(ws_url("sec", "snap"), json={}).status_code in (200, 201)
        # the workspace runs commands with env, files in every live dir, a login shell: all of it is archived
        run_ok(
            client,
            "sec",
            "snap",
            "env > /workspace/env.txt; env > ~/env.txt; env > /tmp/env.txt; history -a",
            env={"MY_VAR": "1"},
            login=True,
        )
        snap = client.post(ws_url("sec", "snap", "snapshot"))
        assert snap.status_code == 200, snap.text
        snapshot_id = snap.json()["id"]
    store = secure_server.data_dir / "snapshots" / "sec" / "snap"
    archive = store / f"{snapshot_id}.tar.zst"
    assert archive.is_file(), sorted(p.name for p in store.iterdir())
    members = snapshot_members(archive)
    assert any(name.endswith("env.txt") for name in members), sorted(members)  # the search sees real content
    assert b"HOME=/home/sandbox" in b"".join(members.values())
    for name, content in members.items():
        assert TOKEN not in name and TOKEN.encode() not in content, name
    for path in store.iterdir():  # the manifest and any other file of the store
        assert TOKEN.encode() not in path.read_bytes(), path


def test_error_bodies_never_hold_the_token(secure_server):
    bodies = provoke_errors(secure_server, TOKEN)
    assert len(bodies) > 40
    codes = set()
    for body in bodies:
        assert TOKEN not in body, body
        if body.startswith('{"error"'):
            codes.add(httpx.Response(200, content=body).json()["error"]["code"])
    # the traffic really provoked a wide range of errors
    assert {
        "unauthorized",
        "invalid_name",
        "unknown_field",
        "image_not_found",
        "invalid_request_id",
        "invalid_path",
        "not_found",
    } <= codes, codes


def test_log_never_holds_the_token_through_a_whole_session(start_server):
    """Everything the server prints from start to stop — errors, streams, snapshots, shutdown — has no token."""
    srv = start_server(env={"ENABLE_INTERNET": "false"})
    provoke_errors(srv, TOKEN)
    with srv.client() as client:
        client.put(ws_url("logs", "p"), json={})
        out, _ = run_ok(client, "logs", "p", "echo hi >&2; echo $((6*7))")
        assert "42" in out
        assert client.post(ws_url("logs", "p", "snapshot")).status_code == 200
        assert client.post(ws_url("logs", "p", "stop")).status_code == 200
        out, _ = run_ok(client, "logs", "p", "echo restored")  # restore from the snapshot
        assert client.delete(ws_url("logs", "p"), params={"confirm": "true"}).status_code == 200
    srv.stop()
    log = srv.log_path.read_text(errors="replace")
    assert "/exec" in log and "401" in log  # the log really covered the session
    assert TOKEN not in log


def test_generated_token_is_in_no_log_error_body_or_sandbox(start_server):
    """No SANDBOX_API_TOKEN: the server generates one (shown once, on a terminal only), and it appears in no log
    line, error body, sandbox or file a sandbox can read — not even the token file under the data dir."""
    srv = start_server(token=None, env={"ENABLE_INTERNET": "false"})
    token_file = srv.data_dir / "token"
    token = token_file.read_text().strip()
    srv.token = token  # the helpers authenticate with it from here on
    for body in provoke_errors(srv, token):
        assert token not in body, body
    with srv.client() as client:
        client.put(ws_url("gen", "w"), json={})
        out, _ = run_ok(client, "gen", "w", ENV_DUMP)
        assert token not in out
        probe = f"cat {token_file} 2>&1; ls {srv.data_dir} 2>&1; echo done"
        out, _ = run_ok(client, "gen", "w", probe)
        assert token not in out and "No such file or directory" in out, out
        response = client.get(ws_url("gen", "w", "files"), params={"path": str(token_file)})
        assert response.status_code == 404 and token not in response.text
        out, _ = run_ok(client, "gen", "w", _grep_inside(token))
        assert out == "searched\n"
        assert client.post(ws_url("gen", "w", "snapshot")).status_code == 200
        assert client.get(ws_url("gen", "w", "exec", rid())).status_code == 404
    srv.stop()
    log = srv.log_path.read_text(errors="replace")
    # the server's output is redirected to this log, so the banner says where the token is stored instead
    assert token not in log and str(token_file) in log, "a generated token must never reach a redirected log"
    for archive in (srv.data_dir / "snapshots").rglob("*.tar.zst"):
        for name, content in snapshot_members(archive).items():
            assert token.encode() not in content and token not in name
