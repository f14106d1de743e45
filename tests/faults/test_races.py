"""Two clients race PUT, DELETE, exec and status on one workspace, many times over: never a 5xx, never a hang or a
stuck workspace, every answer a documented code with its documented status, and a consistent state at the end."""

import json
import random
import shutil
import threading

import httpx
import pytest
from e2e import put_workspace, run_ok, sandbox_pids, wait_until, ws_url

from protocol.errors import ERRORS

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

ITERATIONS = 75  # per client
CONFIG = {"persistent": True}
# what a racing operation may legitimately meet: the workspace deleted under it, or a lifecycle step in progress
ALLOWED = {
    "put": {"workspace_busy"},
    "delete": {"workspace_not_found", "workspace_busy"},
    "status": {"workspace_not_found"},
    "exec": {"workspace_not_found", "workspace_busy"},
    # in the stream: the workspace was deleted while the command ran or booted
    "stream": {"container_exited", "workspace_not_found", "container_unavailable", "workspace_lost"},
}


def _check_error(kind: str, response: httpx.Response, problems: list) -> None:
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        problems.append((kind, response.status_code, response.text[:200]))
        return
    if code not in ALLOWED[kind] or ERRORS[code][0] != response.status_code:
        problems.append((kind, response.status_code, code))


def _one(client: httpx.Client, rng: random.Random, problems: list, ran: list) -> None:
    kind = rng.choice(["put", "put", "delete", "exec", "exec", "status"])
    if kind == "put":
        r = put_workspace(client, "race", "one", **CONFIG)
        if r.status_code not in (200, 201):
            _check_error(kind, r, problems)
    elif kind == "delete":
        r = client.delete(ws_url("race", "one"), params={"confirm": "true"})
        if r.status_code != 200:
            _check_error(kind, r, problems)
    elif kind == "status":
        r = client.get(ws_url("race", "one"))
        if r.status_code == 200:
            if r.json()["state"] not in ("created", "starting", "restoring", "running", "saving", "stopped"):
                problems.append(("status", r.json()["state"]))
        else:
            _check_error(kind, r, problems)
    else:
        body = {"request_id": f"{rng.getrandbits(128):032x}", "command": "echo ran"}
        with client.stream("POST", ws_url("race", "one", "exec"), json=body) as r:
            if r.status_code != 200:
                r.read()
                _check_error(kind, r, problems)
                return
            events = [json.loads(line) for line in r.iter_lines() if line.strip()]
        end = events[-1] if events else {}
        if end.get("type") == "exit":
            if end["exit_code"] != 0 or "".join(e["data"] for e in events if e["type"] == "output") != "ran\n":
                problems.append(("exec", end))
            ran.append(1)
        elif end.get("type") != "error" or end.get("code") not in ALLOWED["stream"]:
            problems.append(("stream", events[-3:]))


def test_two_clients_race_put_delete_exec(start_server):
    srv = start_server()
    problems: list = []
    ran: list = []

    def client_loop(seed: int) -> None:
        rng = random.Random(seed)
        with srv.client() as client:
            for _ in range(ITERATIONS):
                try:
                    _one(client, rng, problems, ran)
                except httpx.HTTPError as exc:  # a hang (timeout) or a dropped connection is a failure too
                    problems.append(("transport", repr(exc)))

    threads = [threading.Thread(target=client_loop, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(200)
    assert not any(t.is_alive() for t in threads), "a client is stuck"
    assert problems == [], problems
    assert ran, "no exec ever completed: the race never exercised the container"

    with srv.client() as client:
        # consistent at rest: whatever the race left, the workspace is usable and not stuck mid-operation
        r = put_workspace(client, "race", "one", **CONFIG)
        assert r.status_code in (200, 201), r.text
        out, _ = run_ok(client, "race", "one", "echo settled")
        assert out == "settled\n"
        status = client.get(ws_url("race", "one")).json()
        assert status["state"] == "running" and status["busy"] is False
        # deleting it leaves nothing behind: no sandbox, no files, no snapshots
        assert client.delete(ws_url("race", "one"), params={"confirm": "true"}).status_code == 200
        wait_until(lambda: not sandbox_pids(srv, "one"), 10, what="the sandbox to go")
        assert client.get(ws_url("race", "one")).json()["error"]["code"] == "workspace_not_found"
        assert not (srv.data_dir / "workspaces" / "race" / "one").exists()
        assert not list((srv.data_dir / "snapshots").glob("race/one/*"))
