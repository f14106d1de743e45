"""The protocol client against a real loopback HTTP server: headers, redirects, endpoint rules, error parsing,
NDJSON stream rules, exactly-once offsets, streamed file transfer, no retries."""

import io
import json
import socket
import time

import pytest

from flarebox_hermes import client as fc
from flarebox_hermes.client import ApiError, Client, ProtocolViolation, TransportError

TOKEN = "t" * 40  # same as conftest.TOKEN

pytestmark = pytest.mark.timeout(60)

NS, WS = "personal", "proj"
W = f"/v1/workspaces/{NS}/{WS}"
RID = "0123456789abcdef0123456789abcdef"
JSON = {"Content-Type": "application/json"}
NDJSON = {"Content-Type": "application/x-ndjson"}


def ndjson(*events) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def ok_json(value, status=200):
    return lambda seen: (status, JSON, json.dumps(value).encode())


def stream(payload: bytes, headers=NDJSON):
    return lambda seen: (200, headers, payload)


def run(client, request_id=RID):
    return list(client.exec(NS, WS, {"request_id": request_id, "command": "true"}))


EXIT = {"type": "exit", "exit_code": 0, "reason": "exited", "duration_ms": 3}


def test_protocol_names_match_the_protocol_package():
    from protocol import events, limits

    assert fc.EVENT_TYPES == events.EVENT_TYPES
    assert fc.TERMINAL_TYPES == events.TERMINAL_TYPES
    assert fc.STATUS_PHASES == events.STATUS_PHASES
    assert fc.CONTAINER_STATES == events.CONTAINER_STATES
    assert fc.EXIT_REASONS == events.EXIT_REASONS
    assert fc.NAME_PATTERN == limits.NAME_PATTERN
    assert fc.REQUEST_ID_PATTERN == limits.REQUEST_ID_PATTERN
    assert fc.MAX_BODY_BYTES == limits.MAX_BODY_BYTES


def test_sends_user_agent_token_and_access_headers(server):
    server.routes[("GET", "/v1/health")] = ok_json({"ok": True, "protocol": 1, "version": "0.1.0"})
    with Client(server.endpoint, TOKEN, access_client_id="id.access", access_client_secret="s3cret") as c:
        assert c.health()["protocol"] == 1
        assert TOKEN not in repr(c)
    headers = {k.lower(): v for k, v in server.seen[0].headers.items()}
    assert headers["user-agent"] == f"flarebox-hermes/{fc.__version__}"
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert headers["cf-access-client-id"] == "id.access"
    assert headers["cf-access-client-secret"] == "s3cret"


def test_access_credentials_come_in_pairs():
    with pytest.raises(ValueError, match="both"):
        Client("https://example.com", TOKEN, access_client_id="only-id")


def test_redirect_is_refused_not_followed(server, client):
    server.routes[("GET", "/v1/health")] = lambda seen: (307, {"Location": "/elsewhere"}, b"")
    server.routes[("GET", "/elsewhere")] = ok_json({"ok": True})
    with pytest.raises(ApiError) as err:
        client.health()
    assert err.value.status == 307 and err.value.code == "redirect_refused"
    assert [s.path for s in server.seen] == ["/v1/health"]


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://flarebox.example.com",
        "https://x.workers.dev/",
        "http://127.0.0.1:8787",
        "http://[::1]:9",
        "http://localhost",
    ],
)
def test_https_or_loopback_endpoints_are_accepted(endpoint):
    Client(endpoint, TOKEN).close()


@pytest.mark.parametrize(
    "endpoint,fragment",
    [
        ("http://example.com", "https://"),
        ("http://10.0.0.1:8787", "loopback"),
        ("ftp://example.com", "https://"),
        ("example.com", "https://"),
        ("https://user:pw@example.com", "credentials"),
        ("https://example.com/?x=1", "query"),
        ("", "empty"),
    ],
)
def test_other_endpoints_are_refused_with_a_clear_message(endpoint, fragment):
    with pytest.raises(ValueError, match=fragment):
        Client(endpoint, TOKEN)


def test_well_formed_error_body_is_parsed(server, client):
    body = {"error": {"code": "config_conflict", "message": "the workspace exists with a different configuration"}}
    server.routes[("PUT", W)] = ok_json(body, 409)
    with pytest.raises(ApiError) as err:
        client.put_workspace(NS, WS, {"persistent": True})
    assert (err.value.status, err.value.code) == (409, "config_conflict")
    assert "different configuration" in err.value.message
    assert json.loads(server.seen[0].body) == {"persistent": True}


@pytest.mark.parametrize(
    "body",
    [
        b"<html>upstream SECRET-LEAK says no</html>",
        b'{"error":{"code":"Bad Code SECRET-LEAK","message":"x"}}',
        b'{"error":{"code":"fine","message":["SECRET-LEAK"]}}',
        b'{"detail":"SECRET-LEAK"}',
        b"\xff\xfe SECRET-LEAK",
    ],
)
def test_unparsable_error_bodies_are_never_echoed(server, client, body):
    server.routes[("GET", W)] = lambda seen: (502, {"Content-Type": "text/html"}, body)
    with pytest.raises(ApiError) as err:
        client.get_workspace(NS, WS)
    assert err.value.status == 502 and err.value.code == "unexpected_response"
    assert "SECRET-LEAK" not in str(err.value)


def test_error_message_is_sanitised_and_bounded(server, client):
    body = {"error": {"code": "invalid_field", "message": "bad\x1b[31m\n" + "x" * 5000}}
    server.routes[("GET", W)] = ok_json(body, 400)
    with pytest.raises(ApiError) as err:
        client.get_workspace(NS, WS)
    assert "\x1b" not in err.value.message and "\n" not in err.value.message
    assert len(err.value.message) <= fc.MAX_MESSAGE_CHARS


def test_names_are_checked_before_any_request(server, client):
    with pytest.raises(ValueError, match="workspace"):
        client.get_workspace(NS, "../etc")
    with pytest.raises(ValueError, match="request_id"):
        client.cancel(NS, WS, "not-hex")
    assert server.seen == []


def test_exec_yields_events_and_sends_the_request(server, client):
    events = [
        {"type": "status", "phase": "starting"},
        {"type": "heartbeat"},
        {"type": "started", "request_id": RID, "container": "fresh", "snapshot": None},
        {"type": "output", "data": "héllo ", "offset": 0},
        {"type": "output", "data": "🙂\n", "offset": 6},
        {"type": "exit", "exit_code": 7, "reason": "exited", "duration_ms": 12},
    ]
    server.routes[("POST", W + "/exec")] = stream(ndjson(*events))
    request = {"request_id": RID, "command": "echo", "timeout": 5, "stdin": "日本語", "login": False}
    got = list(client.exec(NS, WS, request))
    assert got == events
    seen = server.seen[0]
    assert json.loads(seen.body.decode("utf-8")) == request
    assert seen.headers["Content-Type"] == "application/json"


def test_exec_http_error_before_the_stream_is_an_api_error(server, client):
    server.routes[("POST", W + "/exec")] = ok_json(
        {"error": {"code": "duplicate_request", "message": "this request id was used before"}}, 409
    )
    with pytest.raises(ApiError) as err:
        run(client)
    assert err.value.code == "duplicate_request"


def test_exec_refuses_an_oversized_body_locally(server, client):
    with pytest.raises(ValueError, match="body limit"):
        list(client.exec(NS, WS, {"request_id": RID, "command": "cat", "stdin": "x" * fc.MAX_BODY_BYTES}))
    assert server.seen == []


@pytest.mark.parametrize(
    "payload,message",
    [
        (ndjson(EXIT, {"type": "heartbeat"}), "after the terminal"),
        (ndjson(EXIT, EXIT), "after the terminal"),
        (b"not json\n" + ndjson(EXIT), "not valid UTF-8 JSON"),
        (b"[1,2]\n", "not a JSON object"),
        (b"null\n", "not a JSON object"),
        (ndjson({"type": "surprise"}), "unknown type"),
        (ndjson({"type": "exit", "exit_code": True, "reason": "exited"}), "malformed exit"),
        (ndjson({"type": "exit", "exit_code": 0, "reason": "bored"}), "malformed exit"),
        (ndjson({"type": "output", "data": 5, "offset": 0}), "malformed output"),
        (ndjson({"type": "started", "request_id": RID, "container": "teleported"}), "malformed started"),
        (ndjson({"type": "error", "code": "Not A Code", "message": ""}), "malformed error"),
        (ndjson({"type": "output", "data": "x", "offset": 5}), "gap"),
        (b'{"type":"output","data":"' + b"a" * (fc.MAX_FRAME_BYTES + 10) + b'","offset":0}\n', "size limit"),
        (b"\xff\xfe\n", "not valid UTF-8 JSON"),
    ],
)
def test_stream_violations(server, client, payload, message):
    server.routes[("POST", W + "/exec")] = stream(payload)
    with pytest.raises(ProtocolViolation, match=message):
        run(client)


def test_oversized_frame_without_newline_is_caught_without_buffering_it_all(server, client):
    def endless(seen):
        def body():
            yield b'{"type":"output","data":"'
            for _ in range(64):
                yield b"a" * 65536  # 4 MiB and no newline

        return 200, NDJSON, body()

    server.routes[("POST", W + "/exec")] = endless
    with pytest.raises(ProtocolViolation, match="size limit"):
        run(client)


def test_non_ndjson_200_is_a_violation(server, client):
    server.routes[("POST", W + "/exec")] = stream(b"<html>captcha</html>", {"Content-Type": "text/html"})
    with pytest.raises(ProtocolViolation, match="NDJSON"):
        run(client)


def test_stream_without_terminal_event_is_a_transport_error(server, client):
    server.routes[("POST", W + "/exec")] = stream(ndjson({"type": "output", "data": "part", "offset": 0}))
    events = client.exec(NS, WS, {"request_id": RID, "command": "true"})
    assert next(events)["data"] == "part"
    with pytest.raises(TransportError, match="reattach"):
        next(events)


def test_error_terminal_event_message_is_sanitised(server, client):
    server.routes[("POST", W + "/exec")] = stream(
        ndjson({"type": "error", "code": "workspace_lost", "message": "gone\x07" + "y" * 900})
    )
    (event,) = run(client)
    assert event["code"] == "workspace_lost"
    assert "\x07" not in event["message"] and len(event["message"]) <= fc.MAX_MESSAGE_CHARS


def test_reattach_sends_offset_and_trims_replayed_output(server, client):
    # the server replays a frame that starts before the offset we asked for: only the new part is yielded
    server.routes[("GET", f"{W}/exec/{RID}")] = stream(
        ndjson(
            {"type": "output", "data": "abcdef", "offset": 0},
            {"type": "output", "data": "gh", "offset": 6},
            EXIT,
        )
    )
    got = list(client.reattach(NS, WS, RID, offset=4))
    assert [e.get("data") for e in got] == ["ef", "gh", None]
    assert got[0]["offset"] == 4
    assert server.seen[0].query == {"offset": ["4"]}


def test_cancel_posts_an_empty_body(server, client):
    server.routes[("POST", f"{W}/exec/{RID}/cancel")] = ok_json({"request_id": RID, "state": "pending"})
    assert client.cancel(NS, WS, RID)["state"] == "pending"
    assert server.seen[0].body == b""


def test_mutating_call_that_breaks_in_transit_is_not_retried(server, client):
    def drop(seen):
        return 200, {"Content-Length": "100", "Content-Type": "application/json"}, b'{"request_id"'

    server.routes[("POST", f"{W}/exec/{RID}/cancel")] = drop
    server.routes[("POST", W + "/stop")] = drop
    with pytest.raises(TransportError):
        client.cancel(NS, WS, RID)
    with pytest.raises(TransportError):
        client.stop(NS, WS)
    assert [s.method for s in server.seen] == ["POST", "POST"]


def test_connection_refused_is_a_transport_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", TOKEN) as c, pytest.raises(TransportError):
        c.health()


def test_lifecycle_calls_hit_their_routes(server, client):
    status = {"namespace": NS, "workspace": WS, "state": "stopped", "running": False}
    snap = {"id": "s1", "created_at": "2026-01-01T00:00:00.000Z", "size": 10}
    server.routes[("GET", W)] = ok_json(status)
    server.routes[("DELETE", W)] = ok_json({"deleted": True})
    server.routes[("POST", W + "/snapshot")] = ok_json(snap)
    server.routes[("GET", W + "/snapshots")] = ok_json({"snapshots": [snap]})
    server.routes[("POST", W + "/stop")] = ok_json(status)
    assert client.get_workspace(NS, WS)["state"] == "stopped"
    assert client.snapshot(NS, WS)["id"] == "s1"
    assert client.snapshots(NS, WS) == [snap]
    assert client.stop(NS, WS)["running"] is False
    assert client.delete_workspace(NS, WS) == {"deleted": True}
    assert server.seen[-1].query == {"confirm": ["true"]}


BIG = bytes(range(256)) * (5 * 4096)  # 5 MiB of every byte value


def _file_route(data: bytes, length: int | None = None):
    def route(seen):
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(len(data) if length is None else length),
        }
        return 200, headers, (data[i : i + 65536] for i in range(0, len(data), 65536))

    return route


def test_read_file_streams_to_a_path_and_a_file_object(server, client, tmp_path):
    server.routes[("GET", W + "/files")] = _file_route(BIG)
    dest = tmp_path / "out.bin"
    assert client.read_file(NS, WS, "/workspace/big.bin", dest) == len(BIG)
    assert dest.read_bytes() == BIG
    assert server.seen[0].query == {"path": ["/workspace/big.bin"]}
    sink = io.BytesIO()
    assert client.read_file(NS, WS, "/workspace/big.bin", sink) == len(BIG)
    assert sink.getvalue() == BIG


def test_read_file_over_max_bytes_writes_nothing(server, client, tmp_path):
    server.routes[("GET", W + "/files")] = _file_route(BIG)
    dest = tmp_path / "out.bin"
    with pytest.raises(ApiError) as err:
        client.read_file(NS, WS, "/workspace/big.bin", dest, max_bytes=1000)
    assert (err.value.status, err.value.code) == (413, "file_too_large")
    assert not dest.exists()


def test_short_download_is_an_error_and_leaves_no_partial_file(server, client, tmp_path):
    server.routes[("GET", W + "/files")] = _file_route(BIG[:1000], length=len(BIG))
    dest = tmp_path / "out.bin"
    with pytest.raises(TransportError):
        client.read_file(NS, WS, "/workspace/big.bin", dest)
    assert not dest.exists()


def test_read_file_errors_map_to_codes(server, client, tmp_path):
    server.routes[("GET", W + "/files")] = ok_json({"error": {"code": "file_not_found", "message": "no file"}}, 404)
    with pytest.raises(ApiError) as err:
        client.read_file(NS, WS, "/nope", tmp_path / "x")
    assert err.value.code == "file_not_found"
    assert not (tmp_path / "x").exists()


def test_write_file_streams_bytes_and_file_objects_with_content_length(server, client, tmp_path):
    server.routes[("PUT", W + "/files")] = lambda seen: (
        200,
        JSON,
        json.dumps({"path": seen.query["path"][0], "size": len(seen.body)}).encode(),
    )
    assert client.write_file(NS, WS, "/workspace/a.bin", BIG, mode=0o600) == {
        "path": "/workspace/a.bin",
        "size": len(BIG),
    }
    src = tmp_path / "src.bin"
    src.write_bytes(BIG)
    with open(src, "rb") as handle:
        handle.read(10)  # streamed from the current position
        assert client.write_file(NS, WS, "/workspace/b.bin", handle, mode="0755")["size"] == len(BIG) - 10
    first, second = server.seen
    assert first.body == BIG and first.headers["Content-Length"] == str(len(BIG))
    assert first.query["mode"] == ["0600"]
    assert second.body == BIG[10:] and second.query["mode"] == ["0755"]
    assert "Transfer-Encoding" not in second.headers


def _slow_stream(*parts):
    """parts: bytes to send, or a float to pause that many seconds."""

    def route(seen):
        def body():
            for part in parts:
                if isinstance(part, float):
                    time.sleep(part)
                else:
                    yield part

        return 200, NDJSON, body()

    return route


def test_heartbeats_keep_a_quiet_stream_alive(server, client):
    beat = ndjson({"type": "heartbeat"})
    # 2.4 s in all, longer than the read deadline; no gap between events comes near it
    server.routes[("POST", W + "/exec")] = _slow_stream(*([beat, 0.3] * 8), ndjson(EXIT))
    events = list(client.exec(NS, WS, {"request_id": RID, "command": "sleep 2"}, read_timeout=1.5))
    assert events[-1] == EXIT and len(events) == 9


def test_a_stalled_stream_is_a_transport_error_without_the_word_timeout(server, client):
    server.routes[("POST", W + "/exec")] = _slow_stream(ndjson({"type": "heartbeat"}), 3.0, ndjson(EXIT))
    with pytest.raises(TransportError) as err:
        list(client.exec(NS, WS, {"request_id": RID, "command": "sleep 9"}, read_timeout=0.5))
    # Hermes turns any backend error mentioning "timeout" into a fake exit 124
    assert "timeout" not in str(err.value).lower() and err.value.connected


def test_plain_calls_have_a_read_deadline(server):
    server.routes[("GET", "/v1/health")] = _slow_stream(3.0, b'{"ok":true}')
    with Client(server.endpoint, TOKEN, timeout=0.5) as c:
        started = time.monotonic()
        with pytest.raises(TransportError) as err:
            c.health()
    assert time.monotonic() - started < 2.5
    assert "stopped answering" in str(err.value)


def test_oversized_json_answer_is_refused(server, client):
    server.routes[("GET", W)] = lambda seen: (200, JSON, (b" " * 65536 for _ in range(300)))  # 19 MiB of spaces
    with pytest.raises(ProtocolViolation, match="oversized"):
        client.get_workspace(NS, WS)


def test_created_status_is_a_success(server, client):
    server.routes[("PUT", W)] = ok_json({"state": "created"}, 201)
    assert client.put_workspace(NS, WS, {})["state"] == "created"
