"""A scoped key's secret, like the deployment token, never appears in an error body, a log line, the audit log, the
directory's files, a sandbox or a snapshot (issue 11). The same probes as test_token_secrecy.py, with a key."""

import httpx
import pytest
from e2e import TOKEN, run_ok, ws_url
from secrets_probe import provoke_errors, snapshot_members

pytestmark = pytest.mark.timeout(180)


def test_a_key_secret_is_nowhere_it_does_not_belong(start_server):
    srv = start_server(env={"ENABLE_INTERNET": "false"})
    with srv.client() as admin:
        minted = admin.post(
            "/v1/keys", json={"namespace": "keysec", "scopes": ["exec", "files", "snapshots", "manage"]}
        )
        assert minted.status_code == 201
        key = minted.json()["key"]
    secret = key[21:]
    bodies = provoke_errors(srv, key)
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        assert client.put(ws_url("keysec", "w"), json={}).status_code == 201
        out, _ = run_ok(client, "keysec", "w", "env; cat /proc/[0-9]*/environ | tr '\\0' '\\n'; echo done")
        assert out.endswith("done\n") and secret not in out
        # the caller quotes its own key in a command and a file: the audit log and answers still hold no secret
        run_ok(client, "keysec", "w", f"echo {key} > /workspace/k.txt")
        for query in ({key: "1"}, {"path": "/" + key}):
            bodies.append(client.get(ws_url("keysec", "w", "files"), params=query).text)
        bodies.append(client.get(f"/v1/{key}").text)
        snap = client.post(ws_url("keysec", "w", "snapshot"))
        assert snap.status_code == 200, snap.text
    with srv.client() as admin:
        audit = admin.get("/v1/audit", params={"limit": "1000"}).text
        listed = admin.get("/v1/keys").text
    assert "[redacted]" in audit  # the command quoting the key was recorded, redacted
    srv.stop()
    for body in bodies + [audit, listed]:
        assert secret not in body and TOKEN not in body, body[:300]
    assert secret not in srv.log_path.read_text(errors="replace")
    for path in srv.data_dir.glob("directory.sqlite3*"):
        assert secret.encode() not in path.read_bytes(), path
    # the snapshot holds the file the user wrote (its content is theirs), and nothing the server put there
    archive = next((srv.data_dir / "snapshots" / "keysec" / "w").glob("*.tar.zst"))
    members = snapshot_members(archive)
    assert any(name.endswith("k.txt") for name in members)
    for name, content in members.items():
        if not name.endswith("k.txt"):
            assert secret.encode() not in content, name
