"""A supervisor's control answers (health, errors, sync, mkdir, cancel) are read only up to CONTROL_BODY_BYTES: a
larger one counts as an unreachable supervisor (everything in a sandbox is hostile). The real adapters are attacked
in tests/security/test_fake_supervisor.py; here the workspace logic meets the double's capped `read()`."""

import pytest
from test_workspace import Env, body, rid, types
from workspace_doubles import Reply

from durable import supervisor_client as supervisor
from durable.ports import ContainerGone
from protocol.limits import CONTROL_BODY_BYTES

pytestmark = pytest.mark.timeout(30)

CHUNK = 64 * 1024


class Endless:
    """An endless body that counts what was pulled from it."""

    def __init__(self, first: bytes = b'{"ok":true,"running":0,"x":"'):
        self.first = first
        self.pulled = 0

    def __aiter__(self):
        return self._chunks()

    async def _chunks(self):
        chunk = self.first
        while True:
            self.pulled += len(chunk)
            yield chunk
            chunk = b"x" * CHUNK


def assert_stopped_at_the_cap(fat: Endless) -> None:
    assert 0 < fat.pulled <= CONTROL_BODY_BYTES + CHUNK


@pytest.fixture
async def env():
    env = Env()
    await env.put()
    await env.run()  # the container is up
    return env


async def test_the_double_keeps_the_port_contract():
    assert await Reply(200, b"x" * CONTROL_BODY_BYTES).read() == b"x" * CONTROL_BODY_BYTES
    with pytest.raises(ContainerGone, match=f"more than {CONTROL_BODY_BYTES} bytes"):
        await Reply(200, b"x" * (CONTROL_BODY_BYTES + 1)).read()
    with pytest.raises(ContainerGone):
        await Reply(200, b"xy").read(limit=1)


@pytest.mark.parametrize("status", [200, 503])
async def test_health_with_an_endless_answer_is_no_answer(env, status):
    fat = Endless()
    env.container.answers[("GET", "/health")] = Reply(status, fat)
    assert await supervisor.health(env.container) is None
    assert_stopped_at_the_cap(fat)


async def test_health_with_garbage_is_no_answer(env):
    env.container.answers[("GET", "/health")] = Reply(200, b"\xff not json")
    assert await supervisor.health(env.container) is None


async def test_status_and_idle_alarm_survive_an_endless_health(env):
    fat = Endless()
    env.container.answers[("GET", "/health")] = Reply(200, fat)
    assert body(await env.call("get"))["busy"] is False
    assert_stopped_at_the_cap(fat)
    await env.fire_alarm_at_deadline()  # nothing counts as running: the idle save goes ahead
    assert env.state == "stopped" and len(env.container.snapshots) == 1


async def test_an_endless_error_answer_becomes_the_fallback_error(env):
    fat = Endless(b'{"error":{"code":"invalid_cwd","message":"')
    err = await supervisor.error_of(Reply(400, fat))
    assert err.code == "exec_failed"
    assert_stopped_at_the_cap(fat)

    fat = Endless(b'{"error":')
    env.container.answers[("POST", "/exec")] = Reply(500, fat)
    resp = await env.start_exec()
    await env.clock.drain()
    events = resp.body.events()
    assert types(events) == ["started", "error"] and events[-1]["code"] == "exec_failed"
    assert_stopped_at_the_cap(fat)


async def test_make_dir_and_sync_refuse_endless_answers(env):
    fat = Endless(b"")
    env.container.answers[("POST", "/exec")] = Reply(200, fat)
    assert await supervisor.make_dir(env.container, "/workspace/new") is False
    assert_stopped_at_the_cap(fat)

    fat = Endless(b"")
    env.container.answers[("POST", "/sync")] = Reply(200, fat)
    await supervisor.sync(env.container)  # a running container's snapshot goes ahead without the sync
    assert_stopped_at_the_cap(fat)


@pytest.mark.parametrize("status", [200, 500])
async def test_a_forwarded_cancel_with_an_endless_answer_counts_as_unanswered(env, status):
    await env.run(request_id=rid(9))
    fat = Endless(b'{"state":"cancelled","x":"')
    env.container.answers[("POST", "/exec/" + rid(9) + "/cancel")] = Reply(status, fat)
    assert body(await env.call("cancel", {"request_id": rid(9)}))["state"] == "finished"
    assert_stopped_at_the_cap(fat)
