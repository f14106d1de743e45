"""A client drops its exec stream midway (or while the container boots): the command runs on, and its outcome —
exit code and the full output, byte for byte — is still there by reattach, from 0 or from any offset."""

import json
import shutil
import time

import pytest
from e2e import put_workspace, rid, terminal, wait_until, ws_url
from faults import sha

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

# 100,000 numbered lines (~590 KB), slowly enough that the client can hang up in the middle, then exit 7
COMMAND = "seq 1 50000; sleep 1; seq 50001 100000; sleep 0.5; exit 7"
EXPECTED = "".join(f"{i}\n" for i in range(1, 100001))


def _start_and_drop(client, ns, ws, request_id, drop_after: str) -> list[dict]:
    """POST the exec, read events until one of type `drop_after`, then close the connection."""
    seen = []
    body = {"request_id": request_id, "command": COMMAND}
    with client.stream("POST", ws_url(ns, ws, "exec"), json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.strip():
                seen.append(json.loads(line))
                if seen[-1]["type"] == drop_after:
                    break
    return seen  # leaving the block closes the connection mid-stream


def _reattach(client, ns, ws, request_id, offset=0) -> list[dict]:
    with client.stream("GET", ws_url(ns, ws, "exec", request_id), params={"offset": offset}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line) for line in response.iter_lines() if line.strip()]


def _output(events, offset=0) -> str:
    text = ""
    for e in events:
        if e["type"] == "output":
            assert e["offset"] == offset + len(text), "offsets must be contiguous"
            text += e["data"]
    return text


@pytest.mark.parametrize("drop_after", ["output", "status"])
def test_dropped_exec_stream_outcome_is_kept_for_reattach(start_server, drop_after):
    srv = start_server()
    ws = f"drop-{drop_after}"
    with srv.client() as client:
        assert put_workspace(client, "drop", ws).status_code == 201
        request_id = rid()
        seen = _start_and_drop(client, "drop", ws, request_id, drop_after)
        assert seen[-1]["type"] == drop_after and not [e for e in seen if e["type"] in ("exit", "error")]
        # the command goes on without a reader: busy until it ends
        wait_until(lambda: client.get(ws_url("drop", ws)).json()["busy"], 30, what="the command to be running")
        full = _reattach(client, "drop", ws, request_id)  # follows to the end
        end = terminal(full)
        assert end["type"] == "exit" and end["exit_code"] == 7 and end["reason"] == "exited", end
        text = _output(full)
        assert len(text) == len(EXPECTED) and sha(text.encode()) == sha(EXPECTED.encode())
        # from the middle: exactly the rest, nothing twice
        middle = len(EXPECTED) // 3
        rest = _reattach(client, "drop", ws, request_id, offset=middle)
        assert _output(rest, middle) == EXPECTED[middle:] and terminal(rest)["exit_code"] == 7
        # it ran once: a second POST with the same id is refused, never run again
        again = client.post(ws_url("drop", ws, "exec"), json={"request_id": request_id, "command": COMMAND})
        assert again.status_code == 409 and again.json()["error"]["code"] == "duplicate_request"
        time.sleep(0.2)
        assert client.get(ws_url("drop", ws)).json()["busy"] is False
