"""Scoped keys, the workspace index and the audit log through the real Worker entry under Pyodide: the edge reaches
the Directory Durable Object (src/entry.py's `Directory`, over node:sqlite in the harness) with
`cloudflare.worker_side.DirectoryObjectStub`, and every answer crosses the same JSON wire as on Cloudflare.

The module's harness caps namespaces at CAP workspaces, so each test keeps to its own namespace and stays under it
(the cap test has one to itself).
"""

import json
import re
import secrets
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.timeout(180)

CAP = 3


@pytest.fixture(scope="module")
def harness_vars() -> dict[str, str]:
    return {"MAX_WORKSPACES_PER_NAMESPACE": str(CAP)}


@pytest.fixture
def admin(harness):
    with harness.client() as c:
        yield c


def ws_path(namespace: str, workspace: str) -> str:
    return f"/v1/workspaces/{namespace}/{workspace}"


def put(client, namespace: str, workspace: str, **config):
    return client.put(ws_path(namespace, workspace), json=config)


def create(client, namespace: str, workspace: str, **config) -> dict:
    resp = put(client, namespace, workspace, **config)
    assert resp.status_code == 201, resp.text
    return resp.json()


def mint(client, namespace: str, workspace: str | None = None, scopes=("exec",), **fields) -> dict:
    body = {"namespace": namespace, "workspace": workspace, "scopes": list(scopes), **fields}
    resp = client.post("/v1/keys", json=body)
    assert resp.status_code == 201, resp.text
    return resp.json()


def exec_body(command: str) -> dict:
    return {"request_id": secrets.token_hex(16), "command": command, "timeout": 60}


def run_exec(client, namespace: str, workspace: str, command: str | dict) -> list[dict]:
    """The events of one exec (`command` is its text, or a whole exec body)."""
    body = command if isinstance(command, dict) else exec_body(command)
    with client.stream("POST", ws_path(namespace, workspace) + "/exec", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in resp.iter_lines() if line.strip()]


def output_of(events: list[dict]) -> str:
    return "".join(e["data"] for e in events if e["type"] == "output")


def assert_error(resp, status: int, code: str) -> None:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.json()["error"]["code"] == code, resp.text


def fetches(harness, object_name: str) -> int:
    """How often the object was called (the harness logs every Durable Object fetch)."""
    return len(harness.calls(object_name, "object.fetch"))


def test_a_key_opens_its_workspace_for_its_scopes_only(harness, admin):
    ns = "scope"
    minted = mint(admin, ns, "ws", scopes=["exec"], label="x")
    assert re.fullmatch(r"[0-9a-f]{16}", minted["id"])
    assert minted["key"].startswith(f"fbk_{minted['id']}_")
    assert (minted["namespace"], minted["workspace"], minted["scopes"], minted["label"]) == (ns, "ws", ["exec"], "x")
    create(admin, ns, "ws")
    create(admin, ns, "other")
    with harness.client(token=minted["key"]) as key:
        events = run_exec(key, ns, "ws", "echo hi")
        assert output_of(events) == "hi\n" and events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0
        assert key.get(ws_path(ns, "ws")).json()["workspace"] == "ws"  # reading the status needs no scope

        before_other = fetches(harness, f"{ns}/other")
        refused = {
            "exec on another workspace": key.post(ws_path(ns, "other") + "/exec", json=exec_body("echo no")),
            "exec on a missing one": key.post(ws_path(ns, "missing") + "/exec", json=exec_body("echo no")),
            "exec in another namespace": key.post(ws_path("elsewhere", "ws") + "/exec", json=exec_body("echo no")),
            "status of another workspace": key.get(ws_path(ns, "other")),
            "files without the files scope": key.get(ws_path(ns, "ws") + "/files", params={"path": "/etc/hostname"}),
            "PUT without manage": key.put(ws_path(ns, "ws"), json={}),
            "DELETE without manage": key.delete(ws_path(ns, "ws"), params={"confirm": "true"}),
            "listing keys": key.get("/v1/keys"),
            "minting a key": key.post("/v1/keys", json={"namespace": ns, "scopes": ["manage"]}),
            "revoking a key": key.delete(f"/v1/keys/{minted['id']}"),
            "the audit log without manage": key.get("/v1/audit"),
            "listing another namespace": key.get("/v1/workspaces", params={"namespace": "elsewhere"}),
        }
        for what, resp in refused.items():
            assert (resp.status_code, resp.json()["error"]["code"]) == (403, "forbidden"), what
        # refused before any workspace object was touched (and a refusal says nothing of what exists)
        assert fetches(harness, f"{ns}/other") == before_other
        assert fetches(harness, f"{ns}/missing") == fetches(harness, "elsewhere/ws") == 0
        assert refused["exec on another workspace"].json() == refused["exec on a missing one"].json()
        assert output_of(run_exec(key, ns, "ws", "echo still")) == "still\n"  # the refusals revoked nothing

    wrong_secret = minted["key"][:21] + ("A" if minted["key"][21] != "A" else "B") + minted["key"][22:]
    for garbled in ("fbk_garbled", wrong_secret, minted["key"] + "x", "fbk_" + minted["id"]):
        with harness.client(token=garbled) as bad:
            resp = bad.post(ws_path(ns, "ws") + "/exec", json=exec_body("echo no"))
            assert_error(resp, 401, "unauthorized")
            assert garbled not in resp.text
    # the one directory object of the deployment answered every directory call
    directory_calls = [c for c in harness.calls(api="object.fetch") if c["binding"] == "DIRECTORY"]
    assert directory_calls and {c["object"] for c in directory_calls} == {"directory"}
    assert {c["path"] for c in directory_calls} >= {"/call/mint_key", "/call/verify_key", "/call/append_audit"}


def test_a_revoked_key_and_an_expired_key_are_refused(harness, admin):
    ns = "revoke"
    revoked = mint(admin, ns, label="to revoke")
    expiring = mint(admin, ns, expires_in=1, label="expiring")
    lasting = mint(admin, ns, label="lasting")
    assert revoked["expires_at"] is None
    assert expiring["expires_at"] is not None and expiring["expires_at"] > expiring["created_at"]
    for minted in (revoked, expiring, lasting):
        with harness.client(token=minted["key"]) as key:
            assert key.get("/v1/workspaces").status_code == 200

    gone = admin.delete(f"/v1/keys/{revoked['id']}")
    assert gone.status_code == 200, gone.text
    assert gone.json()["revoked"] is True and gone.json()["key"]["id"] == revoked["id"]
    assert revoked["key"] not in gone.text
    with harness.client(token=revoked["key"]) as key:
        assert_error(key.get("/v1/workspaces"), 401, "unauthorized")
    again = admin.delete(f"/v1/keys/{revoked['id']}")
    assert_error(again, 404, "key_not_found")  # the directory's refusal, through the wire as it was raised
    listed = admin.get("/v1/keys", params={"namespace": ns})
    assert [k["id"] for k in listed.json()["keys"]] == [expiring["id"], lasting["id"]]
    assert "fbk_" not in listed.text  # never a secret in a listing

    harness.advance(5)  # Date.now, so the directory's JsClock, moves past the 1 s expiry
    with harness.client(token=expiring["key"]) as key:
        assert_error(key.get("/v1/workspaces"), 401, "unauthorized")
    with harness.client(token=lasting["key"]) as key:
        assert key.get("/v1/workspaces").status_code == 200  # only the expired key is refused


def test_listing_is_filtered_to_the_keys_reach(harness, admin):
    ns = "listing"
    for ws in ("a", "b"):
        create(admin, ns, ws)
    create(admin, "listing2", "c")
    one = mint(admin, ns, "a")
    whole = mint(admin, ns)

    with harness.client(token=one["key"]) as key:
        resp = key.get("/v1/workspaces")
        assert resp.status_code == 200, resp.text
        entries = resp.json()["workspaces"]
        assert [(e["namespace"], e["workspace"]) for e in entries] == [(ns, "a")]
        status = admin.get(ws_path(ns, "a")).json()
        assert {k: entries[0][k] for k in ("state", "config", "running")} == {
            k: status[k] for k in ("state", "config", "running")
        }  # a status object from the workspace itself, not an error entry
        assert "error" not in entries[0]
        assert_error(key.get("/v1/workspaces", params={"namespace": "listing2"}), 403, "forbidden")
    with harness.client(token=whole["key"]) as key:
        names = [(e["namespace"], e["workspace"]) for e in key.get("/v1/workspaces").json()["workspaces"]]
        assert names == [(ns, "a"), (ns, "b")]

    everything = admin.get("/v1/workspaces", params={"limit": 1000}).json()
    names = {(e["namespace"], e["workspace"]) for e in everything["workspaces"]}
    assert {(ns, "a"), (ns, "b"), ("listing2", "c")} <= names and everything["next"] is None
    assert all("error" not in e for e in everything["workspaces"]), everything
    first = admin.get("/v1/workspaces", params={"namespace": ns, "limit": 1}).json()
    assert [e["workspace"] for e in first["workspaces"]] == ["a"] and first["next"] == f"{ns}/a"
    second = admin.get("/v1/workspaces", params={"namespace": ns, "limit": 1, "after": first["next"]}).json()
    assert [e["workspace"] for e in second["workspaces"]] == ["b"] and second["next"] is None


def test_the_audit_log_records_who_did_what_and_no_secret(harness, admin):
    ns = "audit"
    create(admin, ns, "ws")
    key = mint(admin, ns, "ws", scopes=["exec"], label="auditor")
    manager = mint(admin, ns, scopes=["manage"], label="manager")
    body = exec_body(f"echo {key['key']} {harness.token}")
    with harness.client(token=key["key"]) as client:
        events = run_exec(client, ns, "ws", body)
        assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0
        assert_error(client.post(ws_path(ns, "other") + "/exec", json=exec_body("echo no")), 403, "forbidden")
    assert_error(admin.post(ws_path(ns, "missing") + "/exec", json=exec_body("true")), 404, "workspace_not_found")

    page = admin.get("/v1/audit", params={"namespace": ns, "limit": 1000})
    assert page.status_code == 200, page.text
    records = page.json()["records"]
    by_request = {r["request_id"]: r for r in records if r["request_id"]}
    ran = by_request[body["request_id"]]
    assert {k: ran[k] for k in ("actor", "key_id", "key_label", "namespace", "workspace", "operation")} == {
        "actor": "key",
        "key_id": key["id"],
        "key_label": "auditor",
        "namespace": ns,
        "workspace": "ws",
        "operation": "exec",
    }
    assert (ran["status"], ran["code"]) == (200, None)
    assert ran["command"] == "echo [redacted] [redacted]"
    refused = [r for r in records if r["workspace"] == "other"]
    assert [(r["key_id"], r["status"], r["code"]) for r in refused] == [(key["id"], 403, "forbidden")]
    # the workspace's own error answer reached the edge as JSON, so its code is on record
    missing = [r for r in records if r["workspace"] == "missing"]
    assert [(r["actor"], r["status"], r["code"]) for r in missing] == [("admin", 404, "workspace_not_found")]
    minted = [r for r in records if r["operation"] == "mint_key"]
    assert {r["target_key_id"] for r in minted} == {key["id"], manager["id"]}
    assert all(r["actor"] == "admin" and r["key_id"] is None for r in minted)
    # newest first: the records are in descending seq order
    assert [r["seq"] for r in records] == sorted((r["seq"] for r in records), reverse=True)

    whole = admin.get("/v1/audit", params={"limit": 1000}).text
    for secret in (key["key"], manager["key"], harness.token):
        assert secret not in whole
    assert not re.search(r"fbk_[0-9a-f]{16}_", whole)

    with harness.client(token=manager["key"]) as client:  # a manage key reads its own namespace's log only
        own = client.get("/v1/audit")
        assert own.status_code == 200, own.text
        assert own.json()["records"] and {r["namespace"] for r in own.json()["records"]} == {ns}
        assert_error(client.get("/v1/audit", params={"namespace": "scope"}), 403, "forbidden")


def test_the_namespace_cap_holds_under_concurrent_creation(harness, admin):
    ns = "capped"
    names = [f"w{i:02d}" for i in range(20)]

    def create_one(name: str):
        with harness.client() as c:
            return name, put(c, ns, name)

    with ThreadPoolExecutor(len(names)) as pool:
        results = dict(pool.map(create_one, names))
    created = sorted(n for n, r in results.items() if r.status_code == 201)
    assert len(created) == CAP, {n: r.status_code for n, r in results.items()}
    for name, resp in results.items():
        if name not in created:
            assert_error(resp, 403, "quota_exceeded")
            assert f"already holds {CAP} workspaces" in resp.json()["error"]["message"]
            assert fetches(harness, f"{ns}/{name}") == 0  # refused before its object was touched
    listed = admin.get("/v1/workspaces", params={"namespace": ns}).json()["workspaces"]
    assert sorted(e["workspace"] for e in listed) == created
    assert put(admin, ns, created[0]).status_code == 200  # an existing workspace does not count twice

    # a delete frees its slot; so does the stop of an ephemeral workspace (the edge reads its {"deleted": true})
    deleted = admin.delete(ws_path(ns, created[0]), params={"confirm": "true"})
    assert deleted.status_code == 200 and deleted.json() == {"deleted": True}
    create(admin, ns, "ephemeral", persistent=False)
    assert_error(put(admin, ns, "one-more"), 403, "quota_exceeded")
    stopped = admin.post(ws_path(ns, "ephemeral") + "/stop")
    assert stopped.status_code == 200 and stopped.json() == {"deleted": True}
    create(admin, ns, "one-more")
    assert_error(put(admin, ns, "too-many"), 403, "quota_exceeded")
    listed = admin.get("/v1/workspaces", params={"namespace": ns}).json()["workspaces"]
    assert sorted(e["workspace"] for e in listed) == sorted([*created[1:], "one-more"])


@pytest.mark.parametrize("fault", ["fetch", "storage"])
def test_a_directory_that_cannot_answer_lets_nothing_through(harness, admin, fault):
    ns = f"fault-{fault}"
    create(admin, ns, "ws")
    minted = mint(admin, ns, "ws", scopes=["exec", "manage"])
    with harness.client(token=minted["key"]) as key:
        assert key.get(ws_path(ns, "ws")).status_code == 200
        before = fetches(harness, f"{ns}/ws")
        harness.knobs(directoryFault=fault)
        try:
            answers = {
                "status": key.get(ws_path(ns, "ws")),
                "exec": key.post(ws_path(ns, "ws") + "/exec", json=exec_body("echo no")),
                "admin create": put(admin, ns, "new"),
                "admin mint": admin.post("/v1/keys", json={"namespace": ns, "scopes": ["exec"]}),
                "admin listing": admin.get("/v1/workspaces"),
            }
            health = admin.get("/v1/health")  # needs no directory
        finally:
            harness.knobs(directoryFault=None)
        for what, resp in answers.items():
            assert (resp.status_code, resp.json()["error"]["code"]) == (503, "directory_unavailable"), what
        assert health.status_code == 200
        assert fetches(harness, f"{ns}/ws") == before  # no workspace was reached on an unchecked key
        assert fetches(harness, f"{ns}/new") == 0
        if fault == "fetch":
            assert harness.calls("directory", "harness.directoryFault")
        assert key.get(ws_path(ns, "ws")).status_code == 200  # back once the directory answers again
    assert all(k["namespace"] != ns or k["id"] == minted["id"] for k in admin.get("/v1/keys").json()["keys"])


def test_the_directory_keeps_everything_in_its_storage(harness, admin):
    ns = "evict"
    create(admin, ns, "ws")
    minted = mint(admin, ns, "ws")
    harness.evict("directory", binding="DIRECTORY")  # a fresh instance reads the same SQLite
    with harness.client(token=minted["key"]) as key:
        assert output_of(run_exec(key, ns, "ws", "echo kept")) == "kept\n"
    assert len(harness.calls("directory", "object.construct")) == 2
    listed = admin.get("/v1/workspaces", params={"namespace": ns}).json()["workspaces"]
    assert [e["workspace"] for e in listed] == ["ws"]


def canned(status: int, body: str, content_type: str = "application/json", repeat: int = 1, suffix: str = "") -> dict:
    return {"status": status, "body": body, "contentType": content_type, "repeat": repeat, "suffix": suffix}


def error_json(code: str, message: str = "from the directory") -> str:
    return json.dumps({"error": {"code": code, "message": message}})


def test_a_directory_answer_counts_only_when_it_is_a_refusal_it_may_give(harness, admin):
    ns = "wire"
    create(admin, ns, "ws")
    minted = mint(admin, ns, "ws")
    record = {k: minted[k] for k in ("id", "label", "namespace", "workspace", "scopes")}
    answers = [
        # (the directory's answer to verify_key, what the client gets)
        (canned(401, error_json("unauthorized", "the key has expired")), (401, "unauthorized")),
        (canned(403, error_json("quota_exceeded")), (403, "quota_exceeded")),
        (canned(500, error_json("internal_error")), (503, "directory_unavailable")),  # it failed: not a refusal
        (canned(401, error_json("forbidden")), (503, "directory_unavailable")),  # status and code disagree
        (canned(418, error_json("teapot")), (503, "directory_unavailable")),  # no such code
        (canned(401, '{"error": "unauthorized"}'), (503, "directory_unavailable")),
        (canned(200, "<html>not json</html>", "text/html"), (503, "directory_unavailable")),
        # a key record that would let the request through, after 33 MiB of JSON whitespace: past
        # DIRECTORY_ANSWER_BYTES (32 MiB), so refused rather than buffered whole
        (canned(200, " " * 1024 * 1024, repeat=33, suffix=json.dumps(record)), (503, "directory_unavailable")),
    ]
    with harness.client(token=minted["key"]) as key:
        for answer, (status, code) in answers:
            harness.knobs(canned={"DIRECTORY:directory": answer})
            try:
                resp = key.get(ws_path(ns, "ws"))
            finally:
                harness.knobs(canned={})
            assert (resp.status_code, resp.json()["error"]["code"]) == (status, code), answer["body"][:80]
            if status == 401:
                assert resp.json()["error"]["message"] == "the key has expired"  # the refusal's own message
        assert key.get(ws_path(ns, "ws")).status_code == 200


def test_a_workspaces_json_answer_is_read_bounded_and_its_streams_pass_through(harness, admin):
    ns, name = "wire", "canned"
    create(admin, ns, name)
    target = f"WORKSPACE:{ns}/{name}"
    padded = json.dumps({"pad": "x" * (1024 * 1024 - 20)})  # just under WORKSPACE_JSON_BYTES
    try:
        harness.knobs(canned={target: canned(200, padded)})
        small = admin.get(ws_path(ns, name))
        assert small.status_code == 200 and small.text == padded
        harness.knobs(canned={target: canned(200, padded + " " * 64)})
        assert_error(admin.get(ws_path(ns, name)), 500, "internal_error")  # over the bound: refused, not relayed
        # streams are never read by the stub, however long
        line = json.dumps({"type": "output", "data": "y" * 1000}) + "\n"
        harness.knobs(canned={target: canned(200, line, "application/x-ndjson", repeat=3000)})
        with admin.stream("POST", ws_path(ns, name) + "/exec", json=exec_body("true")) as resp:
            assert resp.status_code == 200 and resp.read() == line.encode() * 3000
        harness.knobs(canned={target: canned(200, "z", "application/octet-stream", repeat=3 * 1024 * 1024)})
        got = admin.get(ws_path(ns, name) + "/files", params={"path": "/workspace/f"})
        assert got.status_code == 200 and got.content == b"z" * (3 * 1024 * 1024)
    finally:
        harness.knobs(canned={})
    assert admin.get(ws_path(ns, name)).json()["workspace"] == name
