"""Reattach by request id: replay from an offset exactly once, follow a running command; many commands at once."""

import asyncio
import json

import pytest

from .harness import new_id, next_event, parse_ndjson

pytestmark = pytest.mark.timeout(60)


def _frames_from(events: list[dict], offset: int) -> None:
    position = offset
    for event in events:
        if event["type"] == "output":
            assert event["offset"] == position
            position += len(event["data"])


def test_reattach_at_a_mid_stream_offset_yields_exactly_the_rest(supervisor):
    request_id = new_id()
    response = supervisor.post_exec({"request_id": request_id, "command": "seq 1 30000; printf 'é😀%.0s' $(seq 500)"})
    original = parse_ndjson(response.text)
    full = "".join(e["data"] for e in original if e["type"] == "output")
    for offset in (0, 1, 12345, len(full) - 3, len(full), len(full) + 10):
        replay = parse_ndjson(supervisor.client.get(f"/exec/{request_id}", params={"offset": offset}).text)
        assert "".join(e["data"] for e in replay if e["type"] == "output") == full[offset:]
        _frames_from(replay, offset)
        assert replay[-1] == original[-1]
        assert sum(1 for e in replay if e["type"] in ("exit", "error")) == 1


def test_reattach_follows_a_running_command(supervisor):
    request_id = new_id()
    body = {"request_id": request_id, "command": "echo one; while [ ! -e release ]; do sleep 0.05; done; echo two"}
    with supervisor.stream("POST", "/exec", json=body) as live:
        lines = live.iter_lines()
        assert next_event(lines)["data"] == "one\n"
        with supervisor.stream("GET", f"/exec/{request_id}", params={"offset": 2}) as follower:
            follow_lines = follower.iter_lines()
            assert next_event(follow_lines) == {"type": "output", "data": "e\n", "offset": 2}
            (supervisor.workspace / "release").touch()
            followed = [json.loads(line) for line in follow_lines if line]
        rest = [json.loads(line) for line in lines if line]
    assert [e for e in followed if e["type"] != "heartbeat"] == [e for e in rest if e["type"] != "heartbeat"]
    assert [e["data"] for e in rest if e["type"] == "output"] == ["two\n"]
    assert rest[-1]["type"] == "exit" and rest[-1]["exit_code"] == 0


def test_reattach_errors(supervisor):
    assert supervisor.client.get(f"/exec/{new_id()}").json()["error"]["code"] == "request_not_found"
    request_id = new_id()
    supervisor.exec("true", request_id=request_id)
    for query in ("offset=-1", "offset=abc", "offset=1&offset=2", "other=1"):
        response = supervisor.client.get(f"/exec/{request_id}?{query}")
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_query"
    response = supervisor.client.get("/exec/NOT-AN-ID")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request_id"


def test_reused_request_id_is_refused_and_nothing_runs_twice(supervisor):
    request_id = new_id()
    assert supervisor.exec("echo x >> ran", request_id=request_id).terminal["exit_code"] == 0
    response = supervisor.post_exec({"request_id": request_id, "command": "echo x >> ran"})
    assert response.status_code == 409 and response.json()["error"]["code"] == "duplicate_request"
    assert (supervisor.workspace / "ran").read_text() == "x\n"


async def test_ten_concurrent_commands_one_long(supervisor):
    async with supervisor.async_client() as client:

        async def run(command: str) -> list[dict]:
            body = {"request_id": new_id(), "command": command, "timeout": 50}
            response = await client.post("/exec", json=body)
            return parse_ndjson(response.text)

        # the long one only ends once every short one has finished: a serialising supervisor would hang here
        long_run = asyncio.ensure_future(run("while [ ! -e release ]; do sleep 0.05; done; echo long"))
        await asyncio.sleep(0.2)
        shorts = await asyncio.gather(*(run(f"seq 1 {1000 * n}; echo done-{n}") for n in range(1, 10)))
        assert not long_run.done()
        (supervisor.workspace / "release").touch()
        long_events = await long_run
    for n, events in enumerate(shorts, start=1):
        expected = "".join(f"{i}\n" for i in range(1, 1000 * n + 1)) + f"done-{n}\n"
        assert "".join(e["data"] for e in events if e["type"] == "output") == expected
        assert events[-1]["exit_code"] == 0
    assert long_events[-1]["exit_code"] == 0
    assert "".join(e["data"] for e in long_events if e["type"] == "output") == "long\n"


def test_a_dropped_stream_loses_nothing(supervisor, tmp_path):
    request_id = new_id()
    body = {"request_id": request_id, "command": "echo one; while [ ! -e release ]; do sleep 0.05; done; echo two"}
    with supervisor.stream("POST", "/exec", json=body) as live:
        first = next_event(live.iter_lines())
    # the client hung up mid-command; the command goes on
    (supervisor.workspace / "release").touch()
    replay = parse_ndjson(supervisor.client.get(f"/exec/{request_id}", params={"offset": len(first["data"])}).text)
    assert "".join(e["data"] for e in replay if e["type"] == "output") == "two\n"
    assert replay[-1]["type"] == "exit" and replay[-1]["exit_code"] == 0
    assert "Traceback" not in (tmp_path / "supervisor.log").read_text()
