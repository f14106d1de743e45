"""Issue 17, defect 2 (remainder): the control socket cannot be reached or broken through the workspace's own files.

The supervisor's socket is bound by the server outside every sandbox and handed in as a descriptor
(docs/architecture.md), so no path inside a workspace names it. A prompt-injected agent that tries the obvious
anyway — upload a file over where a socket "should" be, wipe `/run/flarebox` — gets a documented answer, and the
workspace keeps working in the same container (`container: continuing`).
"""

import pytest
from e2e import exec_events, run_ok, started, terminal, ws_url

from protocol.errors import ERRORS

pytestmark = pytest.mark.timeout(120)

NS, WS = "hostile", "files"


def _continuing(client, command: str = "echo still-here") -> str:
    out, events = run_ok(client, NS, WS, command)
    assert started(events)["container"] == "continuing", events
    return out


def test_uploading_over_the_socket_path_is_refused_and_changes_nothing(secure_server):
    with secure_server.client() as client:
        assert client.put(ws_url(NS, WS), json={}).status_code in (200, 201)
        # booted; and the socket is not even named inside: /run/flarebox does not exist in the sandbox
        out, _ = run_ok(client, NS, WS, "test -e /run/flarebox && echo present || echo absent")
        assert out == "absent\n"
        for path in ("/run/flarebox/sv.sock", "/run/flarebox/uid-ranges/x.lock", "/run/sv.sock"):
            answer = client.put(ws_url(NS, WS, "files"), params={"path": path}, content=b"not a socket\n")
            # /run is read-only in the sandbox: the documented 403, with the error body of every refusal
            assert answer.status_code == 403, (path, answer.status_code, answer.text)
            assert answer.json()["error"]["code"] == "permission_denied", answer.text
            assert ERRORS["permission_denied"][0] == 403
            assert _continuing(client) == "still-here\n"
        # nothing was written anywhere under /run
        out = _continuing(client, "find /run -name 'sv.sock' -o -name 'x.lock' 2>/dev/null | wc -l")
        assert out.strip() == "0"


def test_wiping_run_inside_the_workspace_does_not_touch_its_control_socket(secure_server):
    with secure_server.client() as client:
        assert client.put(ws_url(NS, WS), json={}).status_code in (200, 201)
        events = exec_events(client, NS, WS, "rm -rf /run/flarebox /run/* 2>&1; ls -la /run 2>&1; echo done")
        end = terminal(events)
        assert end["type"] == "exit", events  # whatever rm managed, the command ran to its end
        assert started(events)["container"] == "continuing", events
        # the server still reaches the same supervisor: execs, files and reattach keep working
        for i in range(3):
            assert _continuing(client, f"echo round-{i}") == f"round-{i}\n"
        put = client.put(ws_url(NS, WS, "files"), params={"path": "/workspace/after.txt"}, content=b"ok\n")
        assert put.status_code == 200, put.text
        got = client.get(ws_url(NS, WS, "files"), params={"path": "/workspace/after.txt"})
        assert got.status_code == 200 and got.content == b"ok\n"
        rid = started(events)["request_id"]
        replay = client.get(ws_url(NS, WS, "exec", rid))
        assert replay.status_code == 200 and '"type":"exit"' in replay.text.replace(" ", "")
        assert _continuing(client) == "still-here\n"
