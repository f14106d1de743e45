"""Activity's idle push (a proxied request, an exec's start and end) writes at most once a TOUCH_SLACK_MS
(durable/workspace.py, `_touch`), and the idle deadline it leaves is never earlier than idle_seconds after any
activity, at most TOUCH_SLACK_MS later; a pending save retry is still superseded at once."""

import pytest
from test_workspace import IDLE, Env
from test_workspace_services import chunks, proxy, put_service
from workspace_doubles import Reply

from durable.schedule import IDLE as IDLE_DEADLINE
from durable.schedule import RETRY
from durable.workspace import TOUCH_SLACK_MS

NS = "t"

pytestmark = pytest.mark.timeout(30)


class CountingStorage:
    """Counts the statements that write (the SQLite commits of the standalone runtime)."""

    def __init__(self, storage):
        self._storage = storage
        self.writes = 0

    def sql(self, query, *params):
        if not query.lstrip().upper().startswith("SELECT"):
            self.writes += 1
        return self._storage.sql(query, *params)


@pytest.fixture
async def env():
    env = Env()
    await env.put()
    await put_service(env)
    await env.run("echo boot")
    await env.clock.advance(2 * TOUCH_SLACK_MS / 1000)  # the boot's own (exact) touch is no longer recent
    return env


async def proxied_get(env) -> None:
    env.container.port_answers[3000] = Reply(200, chunks(b"ok"))
    resp = await proxy(env, "/")
    await env.clock.drain()
    assert resp.status == 200 and bytes(resp.body.data) == b"ok"


def idle_deadline(env) -> int:
    return env.ws.schedule.deadlines()[IDLE_DEADLINE]


async def test_requests_within_the_slack_write_nothing_and_the_deadline_still_covers_them(env):
    await proxied_get(env)
    first = env.clock.now_ms()
    assert idle_deadline(env) == first + IDLE * 1000 + TOUCH_SLACK_MS
    counted = CountingStorage(env.storage)
    env.ws._store.sql = env.ws.state._store.sql = env.ws.schedule._store.sql = counted.sql
    last = first
    for _ in range(9):  # 9 requests over 0.9 s
        await env.clock.advance(TOUCH_SLACK_MS / 10 / 1000)
        await proxied_get(env)
        last = env.clock.now_ms()
        assert idle_deadline(env) >= last + IDLE * 1000  # never earlier than idle_seconds after this activity
    assert counted.writes == 0 and idle_deadline(env) == first + IDLE * 1000 + TOUCH_SLACK_MS
    await env.clock.advance(0.2)  # past the slack: the next one writes, and pushes again
    await proxied_get(env)
    assert counted.writes > 0 and idle_deadline(env) == env.clock.now_ms() + IDLE * 1000 + TOUCH_SLACK_MS


async def test_the_workspace_stops_no_earlier_than_idle_seconds_after_the_last_request(env):
    await proxied_get(env)
    await env.clock.advance(0.6)
    await proxied_get(env)  # within the slack: nothing written
    last = env.clock.now_ms()
    await env.fire_alarm_at_deadline()
    assert env.clock.now_ms() >= last + IDLE * 1000
    assert env.state == "stopped"


async def test_a_pending_save_retry_is_superseded_at_once(env):
    await proxied_get(env)
    env.ws.schedule.retry_save(env.clock.now_ms())
    assert RETRY in env.ws.schedule.deadlines() and IDLE_DEADLINE not in env.ws.schedule.deadlines()
    await env.clock.advance(0.1)
    await proxied_get(env)
    deadlines = env.ws.schedule.deadlines()
    assert RETRY not in deadlines and deadlines[IDLE_DEADLINE] == env.clock.now_ms() + IDLE * 1000 + TOUCH_SLACK_MS


async def test_execs_within_the_slack_push_nothing_and_the_deadline_still_covers_their_ends(env):
    await env.run("true")
    pushed, active = idle_deadline(env), env.ws.state.status_object(NS, "w", running=True, busy=False, now_ms=0)
    for _ in range(4):  # 4 execs over 0.8 s: each touches at its start and at its end
        await env.clock.advance(TOUCH_SLACK_MS / 5 / 1000)
        await env.run("true")
        assert idle_deadline(env) >= env.clock.now_ms() + IDLE * 1000
    assert idle_deadline(env) == pushed  # nothing written for them
    status = env.ws.state.status_object(NS, "w", running=True, busy=False, now_ms=0)
    assert status["last_activity_at"] == active["last_activity_at"]  # lags by less than TOUCH_SLACK_MS
    await env.clock.advance(0.3)
    await env.run("true")
    assert idle_deadline(env) == env.clock.now_ms() + IDLE * 1000 + TOUCH_SLACK_MS
