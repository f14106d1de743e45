"""Bad exec requests get their documented error before anything runs."""

import json

import pytest

from protocol.limits import MAX_BODY_BYTES, MAX_COMMAND_BYTES, MAX_PATH_BYTES

from .harness import new_id

pytestmark = pytest.mark.timeout(60)


def _body(**fields) -> dict:
    return {"request_id": new_id(), "command": "touch ran", **fields}


CASES = [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b"\xff\xfe", 400, "invalid_json"),
    (_body(colour="blue"), 400, "unknown_field"),
    (_body(command="x" * (MAX_COMMAND_BYTES + 1)), 413, "command_too_large"),
    (_body(command="é" * (MAX_COMMAND_BYTES // 2 + 1)), 413, "command_too_large"),
    (_body(command="echo a\x00b"), 400, "invalid_field"),
    (_body(command=None), 400, "invalid_field"),
    (_body(cwd="relative/dir"), 400, "invalid_cwd"),
    (_body(cwd="/" + "d" * MAX_PATH_BYTES), 400, "invalid_cwd"),
    (_body(cwd="/tm\x00p"), 400, "invalid_cwd"),
    (_body(cwd="/no/such/directory"), 400, "invalid_cwd"),
    (_body(cwd="/etc/hostname"), 400, "invalid_cwd"),
    (_body(timeout=0), 400, "invalid_timeout"),
    (_body(timeout=901), 400, "invalid_timeout"),
    (_body(timeout="10"), 400, "invalid_timeout"),
    (_body(timeout=True), 400, "invalid_timeout"),
    (_body(request_id="ABC"), 400, "invalid_request_id"),
    (_body(request_id="0" * 31 + "G"), 400, "invalid_request_id"),
    (_body(env={"BAD-NAME": "x"}), 400, "invalid_field"),
    (_body(env={"OK": 1}), 400, "invalid_field"),
    (_body(login="yes"), 400, "invalid_field"),
    (_body(stdin=5), 400, "invalid_field"),
    (json.dumps(_body(stdin="x" * MAX_BODY_BYTES)).encode(), 413, "payload_too_large"),
]


@pytest.mark.parametrize("body,status,code", CASES, ids=[c[2] + str(i) for i, c in enumerate(CASES)])
def test_bad_exec_request(shared_supervisor, body, status, code):
    supervisor = shared_supervisor
    response = supervisor.post_exec(body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert not (supervisor.workspace / "ran").exists()
    assert supervisor.client.get("/health").json()["running"] == 0


def test_exec_needs_a_json_content_type(shared_supervisor):
    body = json.dumps(_body()).encode()
    response = shared_supervisor.client.post("/exec", content=body, headers={"Content-Type": "text/plain"})
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    assert not (shared_supervisor.workspace / "ran").exists()
    body = json.dumps(_body(command="true")).encode()
    response = shared_supervisor.client.post(
        "/exec", content=body, headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert response.status_code == 200 and json.loads(response.text.splitlines()[-1])["exit_code"] == 0


def test_unknown_route_and_method(supervisor):
    response = supervisor.client.get("/nope")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    response = supervisor.client.delete("/exec")
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


def test_cancel_with_a_malformed_id(supervisor):
    response = supervisor.client.post("/exec/xyz/cancel")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request_id"
