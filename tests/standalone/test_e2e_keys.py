"""Scoped keys, the workspace listing, the audit log and the namespace cap on a real standalone server (issue 11).

One server per module with MAX_WORKSPACES_PER_NAMESPACE=5; each test uses its own namespace.
"""

import threading
import time

import httpx
import pytest
from e2e import QUIET, TOKEN, exec_events, output_of, put_workspace, rid, run_ok, serving, terminal, ws_url

pytestmark = pytest.mark.timeout(180)

CAP = 5


@pytest.fixture(scope="module")
def server():
    with serving({**QUIET, "MAX_WORKSPACES_PER_NAMESPACE": str(CAP)}) as proc:
        yield proc


def mint(server, namespace, workspace=None, scopes=("exec",), **extra) -> dict:
    body = {"namespace": namespace, "workspace": workspace, "scopes": list(scopes), **extra}
    with server.client() as admin:
        response = admin.post("/v1/keys", json=body)
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"
    return response.json()


def as_key(server, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_a_key_for_one_workspace_opens_exactly_that_one(server):
    with server.client() as admin:
        for name in ("mine", "theirs"):
            assert put_workspace(admin, "one", name).status_code == 201
        assert put_workspace(admin, "two", "mine").status_code == 201
    key = mint(server, "one", "mine", scopes=("exec",), label="ci job")["key"]
    with as_key(server, key) as client:
        out, _ = run_ok(client, "one", "mine", "echo hello from $PWD")
        assert out == "hello from /workspace\n"
        assert client.get(ws_url("one", "mine")).json()["state"] == "running"  # status: any scope
        assert client.get("/v1/health").status_code == 200
        forbidden = [
            client.post(ws_url("one", "theirs", "exec"), json={"request_id": rid(), "command": "id"}),
            client.post(ws_url("one", "ghost", "exec"), json={"request_id": rid(), "command": "id"}),  # no such ws
            client.post(ws_url("two", "mine", "exec"), json={"request_id": rid(), "command": "id"}),
            client.get(ws_url("one", "theirs")),
            client.get(ws_url("one", "ghost")),
            client.put(ws_url("one", "mine"), json={}),  # manage
            client.delete(ws_url("one", "mine"), params={"confirm": "true"}),
            client.get(ws_url("one", "mine", "files"), params={"path": "/etc/hostname"}),  # files
            client.post(ws_url("one", "mine", "snapshot")),  # snapshots
            client.post("/v1/keys", json={"namespace": "one", "scopes": ["exec"]}),
            client.get("/v1/keys"),
            client.delete("/v1/keys/0123456789abcdef"),
            client.get("/v1/workspaces", params={"namespace": "two"}),
            client.get("/v1/audit"),  # manage
        ]
        for response in forbidden:
            assert code(response) == (403, "forbidden"), (response.request.method, response.request.url)
    # a garbled key is a wrong credential, not a scope problem
    with as_key(server, key[:-1] + ("x" if key[-1] != "x" else "y")) as client:
        assert code(client.get(ws_url("one", "mine"))) == (401, "unauthorized")
    # nothing the refused requests named came into existence
    with server.client() as admin:
        assert code(admin.get(ws_url("one", "ghost"))) == (404, "workspace_not_found")


def test_revocation_and_expiry_take_effect_on_the_next_request(server):
    with server.client() as admin:
        assert put_workspace(admin, "rev", "w").status_code == 201
        # a command the admin started, that the key may reattach to while it is valid
        started = rid()
        events = exec_events(admin, "rev", "w", "echo admin-ran", request_id=started)
        assert terminal(events)["exit_code"] == 0
    minted = mint(server, "rev", "w", scopes=("exec",))
    short = mint(server, "rev", "w", scopes=("exec",), expires_in=1)
    with as_key(server, minted["key"]) as client:
        reattached = client.get(ws_url("rev", "w", "exec", started))
        assert reattached.status_code == 200 and "admin-ran" in reattached.text
        with server.client() as admin:
            revoked = admin.delete(f"/v1/keys/{minted['id']}")
            assert revoked.status_code == 200 and revoked.json()["key"]["id"] == minted["id"]
            assert code(admin.delete(f"/v1/keys/{minted['id']}")) == (404, "key_not_found")
        assert code(client.get(ws_url("rev", "w", "exec", started))) == (401, "unauthorized")
        assert code(client.get("/v1/health")) == (401, "unauthorized")
    with as_key(server, short["key"]) as client:
        time.sleep(1.2)
        assert code(client.get("/v1/health")) == (401, "unauthorized")
    with server.client() as admin:
        ids = {k["id"] for k in admin.get("/v1/keys", params={"namespace": "rev"}).json()["keys"]}
    assert minted["id"] not in ids and short["id"] in ids  # an expired key is listed (with its expiry) until revoked


def test_listing_shows_exactly_the_callers_reach(server):
    with server.client() as admin:
        for ns, ws in (("list-a", "x"), ("list-a", "y"), ("list-b", "z")):
            assert put_workspace(admin, ns, ws).status_code == 201
        everything = {(w["namespace"], w["workspace"]) for w in admin.get("/v1/workspaces").json()["workspaces"]}
        assert {("list-a", "x"), ("list-a", "y"), ("list-b", "z")} <= everything
        only_a = admin.get("/v1/workspaces", params={"namespace": "list-a"}).json()
        assert [(w["namespace"], w["workspace"]) for w in only_a["workspaces"]] == [("list-a", "x"), ("list-a", "y")]
        assert {w["state"] for w in only_a["workspaces"]} == {"created"}
        paged = admin.get("/v1/workspaces", params={"namespace": "list-a", "limit": "1"}).json()
        assert len(paged["workspaces"]) == 1 and paged["next"] == "list-a/x"
        rest = admin.get("/v1/workspaces", params={"namespace": "list-a", "after": paged["next"]}).json()
        assert [w["workspace"] for w in rest["workspaces"]] == ["y"] and rest["next"] is None
    one = mint(server, "list-a", "y", scopes=("files",))["key"]
    whole = mint(server, "list-a", None, scopes=("exec",))["key"]
    with as_key(server, one) as client:
        listed = client.get("/v1/workspaces").json()["workspaces"]
        assert [(w["namespace"], w["workspace"]) for w in listed] == [("list-a", "y")]
        assert code(client.get("/v1/workspaces", params={"namespace": "list-b"})) == (403, "forbidden")
    with as_key(server, whole) as client:
        listed = client.get("/v1/workspaces", params={"namespace": "list-a"}).json()["workspaces"]
        assert [w["workspace"] for w in listed] == ["x", "y"]
    with server.client() as admin:
        assert admin.delete(ws_url("list-a", "x"), params={"confirm": "true"}).status_code == 200
        listed = admin.get("/v1/workspaces", params={"namespace": "list-a"}).json()["workspaces"]
        assert [w["workspace"] for w in listed] == ["y"]


def test_the_audit_log_records_who_ran_what_and_never_a_secret(server):
    with server.client() as admin:
        assert put_workspace(admin, "aud", "w").status_code == 201
    minted = mint(server, "aud", "w", scopes=("exec", "files", "manage"), label="deploy bot")
    key = minted["key"]
    with as_key(server, key) as client:
        out, _ = run_ok(client, "aud", "w", f"echo {key} {TOKEN} | wc -c")
        assert out.strip() == str(len(key) + len(TOKEN) + 2)
        assert client.put(ws_url("aud", "w", "files"), params={"path": "/workspace/a.txt"}, content=b"12345").is_success
        assert code(client.post(ws_url("aud", "w", "snapshot"))) == (403, "forbidden")
        own = client.get("/v1/audit").json()["records"]  # manage: its own scope
    with server.client() as admin:
        records = admin.get("/v1/audit", params={"namespace": "aud", "workspace": "w"}).json()["records"]
    assert [r["operation"] for r in records] == ["snapshot", "write_file", "exec", "mint_key", "put_config"]
    snapshot, write, executed, minted_record, put = records
    assert executed["actor"] == "key" and executed["key_id"] == minted["id"] and executed["key_label"] == "deploy bot"
    assert executed["status"] == 200 and executed["code"] is None and len(executed["request_id"]) == 32
    assert executed["command"] == "echo [redacted] [redacted] | wc -c"
    assert write["path"] == "/workspace/a.txt" and write["size"] == 5 and write["status"] == 200
    assert snapshot["status"] == 403 and snapshot["code"] == "forbidden"
    assert put["actor"] == "admin" and put["key_id"] is None and put["status"] == 201
    assert [r["seq"] for r in own] == [r["seq"] for r in records]  # the key's own scope: this workspace
    assert minted_record["target_key_id"] == minted["id"] and minted_record["scopes"] == ["exec", "files", "manage"]
    with server.client() as admin:
        everything = admin.get("/v1/audit", params={"limit": "1000"}).text
    assert key not in everything and key[21:] not in everything and TOKEN not in everything
    raw = b"".join(p.read_bytes() for p in server.data_dir.glob("directory.sqlite3*"))
    assert key[21:].encode() not in raw and TOKEN.encode() not in raw  # only digests are stored
    assert key[21:] not in server.output()


def test_the_namespace_cap_holds_under_twenty_concurrent_creations(server):
    answers: list[int] = []
    barrier = threading.Barrier(20)

    def create(i: int) -> None:
        with server.client() as admin:
            barrier.wait()
            response = put_workspace(admin, "capped", f"w{i}")
            answers.append(response.status_code)
            if response.status_code != 201:
                assert code(response) == (403, "quota_exceeded")

    threads = [threading.Thread(target=create, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(answers) == [201] * CAP + [403] * (20 - CAP)
    with server.client() as admin:
        listed = admin.get("/v1/workspaces", params={"namespace": "capped"}).json()["workspaces"]
        assert len(listed) == CAP
        # deleting one frees its slot; repeating an existing PUT does not take one
        assert admin.delete(ws_url("capped", listed[0]["workspace"]), params={"confirm": "true"}).status_code == 200
        assert put_workspace(admin, "capped", listed[1]["workspace"]).status_code == 200
        assert put_workspace(admin, "capped", "newcomer").status_code == 201
        assert code(put_workspace(admin, "capped", "one-too-many")) == (403, "quota_exceeded")


def test_a_failed_create_gives_its_slot_back(server):
    with server.client() as admin:
        for i in range(CAP - 1):
            assert put_workspace(admin, "slots", f"w{i}").status_code == 201
        assert code(put_workspace(admin, "slots", "bad", image="no-such-image")) == (400, "image_not_found")
        assert put_workspace(admin, "slots", "good").status_code == 201


def test_bad_key_requests_are_400_and_mint_nothing(server):
    with server.client() as admin:
        before = len(admin.get("/v1/keys").json()["keys"])
        for body in (
            {"namespace": "ns", "scopes": ["sudo"]},
            {"namespace": "ns", "scopes": []},
            {"namespace": "ns", "scopes": ["exec"], "expires_in": 0},
            {"namespace": "Bad", "scopes": ["exec"]},
            {"namespace": "ns", "scopes": ["exec"], "extra": 1},
        ):
            response = admin.post("/v1/keys", json=body)
            assert response.status_code == 400, (body, response.text)
        assert code(admin.post("/v1/keys", content=b"{}", headers={"content-type": "text/plain"})) == (
            415,
            "unsupported_media_type",
        )
        assert code(admin.delete("/v1/keys/not-an-id")) == (404, "key_not_found")
        assert code(admin.get("/v1/audit", params={"since": "yesterday"})) == (400, "invalid_query")
        assert code(admin.get("/v1/workspaces", params={"limit": "0"})) == (400, "invalid_query")
        assert len(admin.get("/v1/keys").json()["keys"]) == before


def test_a_key_never_enters_its_sandbox(server):
    with server.client() as admin:
        assert put_workspace(admin, "sec", "w").status_code == 201
    key = mint(server, "sec", "w", scopes=("exec",))["key"]
    with as_key(server, key) as client:
        events = exec_events(client, "sec", "w", "env; cat /proc/1/environ | tr '\\0' '\\n'")
        assert "HOME=" in output_of(events)
        assert key not in output_of(events) and key[21:] not in output_of(events)
