"""POST …/snapshot and the life of snapshots, against the port doubles: snapshots that expire on the platform
(Cloudflare keeps one 30 days after it was made or last restored), a snapshot racing a stop or a delete (never a
5xx for a container stopped on purpose), and a workspace that never ran (nothing to save, nothing booted)."""

import asyncio
import datetime as dt

import pytest
from test_workspace import Env, body, code, types
from workspace_doubles import MemoryStorage

from durable.state import WorkspaceState
from durable.store import Store
from durable.timefmt import iso_ms
from protocol.errors import ProtocolError

pytestmark = pytest.mark.timeout(30)

DAY_S = 24 * 3600
LIFETIME_MS = 30 * DAY_S * 1000


def ms(iso: str) -> int:
    return int(dt.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000)


@pytest.fixture
def env():
    return Env()


@pytest.fixture
def expiring():
    """A platform that expires snapshots as Cloudflare does."""
    env = Env()
    env.container.snapshot_lifetime_ms = LIFETIME_MS
    return env


async def gated(env, op):
    """Start `op` and let it run until it waits (on a gate, or for the lifecycle lock)."""
    task = asyncio.ensure_future(env.call(op))
    await env.clock.advance(0)
    assert not task.done(), f"{op} did not wait"
    return task


# --- expiry ------------------------------------------------------------------------------------------------------


async def test_a_snapshot_carries_its_expiry_on_the_wire(expiring):
    env = expiring
    await env.put()
    await env.run()
    snap = body(await env.call("snapshot"))
    assert ms(snap["expires_at"]) == ms(snap["created_at"]) + LIFETIME_MS
    assert body(await env.call("snapshots"))["snapshots"] == [snap]
    assert body(await env.call("get"))["last_snapshot"] == snap


async def test_an_expired_snapshot_is_not_listed_not_restored_and_the_workspace_is_lost(expiring):
    env = expiring
    await env.put()
    await env.run()
    assert (await env.call("stop")).status == 200
    [snap] = body(await env.call("snapshots"))["snapshots"]
    await env.clock.advance(30 * DAY_S - 1)
    assert body(await env.call("snapshots"))["snapshots"] == [snap]  # a second before its expiry: still there
    await env.clock.advance(1)
    assert body(await env.call("snapshots"))["snapshots"] == []
    status = body(await env.call("get"))
    assert status["last_snapshot"] is None and status["state"] == "lost"  # said at once, not at the next boot
    starts = len(env.container.starts)
    events = await env.run()
    assert types(events) == ["error"] and events[0]["code"] == "workspace_lost"
    assert iso_ms(ms(snap["expires_at"])) in events[0]["message"]  # why: the snapshot expired, and when
    assert len(env.container.starts) == starts  # never offered to the platform, never started empty either
    assert code(await env.call("read_file", {"path": "/workspace/x"})) == (409, "workspace_lost")
    assert code(await env.call("snapshot")) == (409, "workspace_lost")
    assert env.state == "lost"


async def test_a_crashed_workspace_whose_snapshot_expired_is_lost_at_its_next_boot(expiring):
    env = expiring
    await env.put()
    await env.run()
    assert (await env.call("snapshot")).status == 200
    env.container.crash()
    await env.clock.advance(31 * DAY_S)
    events = await env.run()
    assert types(events) == ["error"] and events[0]["code"] == "workspace_lost"
    assert len(env.container.starts) == 1 and env.state == "lost"


async def test_a_restore_renews_the_snapshot_and_the_workspace_records_it(expiring):
    env = expiring
    await env.put()
    await env.run()
    snap = body(await env.call("snapshot"))
    env.container.crash()
    await env.clock.advance(20 * DAY_S)
    restored_at = env.clock.now_ms()
    events = await env.run()
    started = events[2]
    assert started["container"] == "restored" and started["snapshot"]["id"] == snap["id"]
    assert ms(started["snapshot"]["expires_at"]) == restored_at + LIFETIME_MS  # the event says the renewed life
    [listed] = body(await env.call("snapshots"))["snapshots"]
    assert listed == started["snapshot"]
    env.container.crash()
    await env.clock.advance(20 * DAY_S)  # 40 days after it was made, 20 after its restore: alive
    events = await env.run()
    assert events[2]["container"] == "restored" and events[2]["snapshot"]["id"] == snap["id"]
    assert events[-1]["type"] == "exit"


async def test_retention_forgets_expired_snapshots_and_keeps_the_newest_live_one(expiring):
    env = expiring
    await env.put()
    await env.run()
    old = body(await env.call("snapshot"))["id"]
    await env.clock.advance(31 * DAY_S)  # the container keeps running (the test never fires the idle alarm)
    new = body(await env.call("snapshot"))["id"]
    assert env.container.deleted_snapshots == [old]  # the expired one is dropped (on Cloudflare: its handle)
    assert [s.id for s in env.ws.state.snapshots()] == [new]


async def test_snapshots_without_an_expiry_never_expire(env):
    await env.put()
    await env.run()
    assert (await env.call("stop")).status == 200
    [snap] = body(await env.call("snapshots"))["snapshots"]
    assert snap["expires_at"] is None
    await env.clock.advance(400 * DAY_S)
    assert body(await env.call("snapshots"))["snapshots"] == [snap]
    assert (await env.run())[2]["container"] == "restored"


async def test_snapshots_recorded_before_expiries_get_the_platforms(expiring):
    """A workspace object made by an older release: its snapshots table has no expiry column, and the first new
    object adds it and gives each recorded snapshot the expiry the platform gives one made then."""
    env = expiring
    env.storage = MemoryStorage()
    env.storage.sql("CREATE TABLE snapshots (id TEXT PRIMARY KEY, created_at_ms INTEGER NOT NULL, size INTEGER)")
    made = env.clock.now_ms() - 10 * DAY_S * 1000
    env.storage.sql("INSERT INTO snapshots (id, created_at_ms, size) VALUES ('old', ?, 5)", made)
    env.ws = env.new_object()
    [snap] = env.ws.state.snapshots()
    assert snap.expires_at_ms == made + LIFETIME_MS
    assert not Store(env.storage).added_expiry  # once: a later object finds the column
    assert WorkspaceState(Store(env.storage)).snapshots() == [snap]


# --- a snapshot racing a stop or a delete --------------------------------------------------------------------


async def test_a_snapshot_waiting_for_a_stop_answers_the_stops_snapshot(env):
    await env.put()
    await env.run()
    env.container.snapshot_gate = asyncio.Event()
    stop = await gated(env, "stop")  # saving, the lifecycle lock held
    snapshot = await gated(env, "snapshot")  # waits for the lock
    env.container.snapshot_gate.set()
    stopped, answered = await stop, await snapshot
    assert stopped.status == 200 and body(stopped)["state"] == "stopped"
    assert answered.status == 200, body(answered)  # was 503 container_exited
    assert body(answered) == body(stopped)["last_snapshot"]  # the files as of the stop: later than it asked
    assert len(env.container.snapshots) == 1 and not env.container.running()


async def test_a_snapshot_waiting_for_a_delete_is_workspace_not_found(env):
    await env.put()
    await env.run()
    env.container.snapshot_gate = asyncio.Event()
    first = await gated(env, "snapshot")  # holds the lock while it saves
    delete = await gated(env, "delete")
    second = await gated(env, "snapshot")
    env.container.snapshot_gate.set()
    assert (await first).status == 200
    assert body(await delete) == {"deleted": True}
    assert code(await second) == (404, "workspace_not_found")  # was 503 container_exited


async def test_a_snapshot_whose_boot_a_stop_overtakes_answers_the_stops_snapshot(env):
    """The fuzz run's race: the snapshot boots the container, and a stop queued during the boot runs first."""
    await env.put()
    env.container.keep_disk_on_crash = True
    await env.run()
    env.container.crash()  # its disk survives: the snapshot must boot it (restarted) to save those files
    env.container.start_gate = asyncio.Event()
    snapshot = await gated(env, "snapshot")  # booting, the lock held
    stop = await gated(env, "stop")
    env.container.start_gate.set()
    stopped, answered = await stop, await snapshot
    assert body(stopped)["state"] == "stopped"
    assert answered.status == 200, body(answered)  # was 503 container_exited
    assert body(answered) == body(stopped)["last_snapshot"]


async def test_a_snapshot_whose_boot_a_delete_overtakes_is_workspace_not_found(env):
    await env.put()
    env.container.keep_disk_on_crash = True
    await env.run()
    env.container.crash()
    env.container.start_gate = asyncio.Event()
    snapshot = await gated(env, "snapshot")
    delete = await gated(env, "delete")
    env.container.start_gate.set()
    assert body(await delete) == {"deleted": True}
    assert code(await snapshot) == (404, "workspace_not_found")


# --- a workspace that never ran ----------------------------------------------------------------------------------


async def test_a_snapshot_of_a_workspace_that_never_ran_boots_nothing(env):
    await env.put()
    resp = await env.call("snapshot")
    assert code(resp) == (409, "nothing_to_snapshot")
    assert "never run" in body(resp)["error"]["message"]
    assert env.container.starts == [] and env.container.snapshots == {} and env.state == "created"
    assert body(await env.call("snapshots"))["snapshots"] == []


async def test_a_snapshot_during_the_first_boot_is_nothing_to_snapshot(env):
    await env.put()
    env.container.start_gate = asyncio.Event()
    exec_resp = await env.start_exec()
    await env.clock.advance(0)
    assert env.state == "starting"
    assert code(await env.call("snapshot")) == (409, "nothing_to_snapshot")
    env.container.start_gate.set()
    await env.clock.drain()
    assert exec_resp.body.events()[-1]["type"] == "exit"
    assert (await env.call("snapshot")).status == 200  # it has run now


async def test_a_snapshot_after_a_failed_first_boot_is_still_nothing_to_snapshot(env):
    await env.put()
    env.container.start_error = ProtocolError("container_unavailable")
    await env.run()
    assert env.state == "created"
    assert code(await env.call("snapshot")) == (409, "nothing_to_snapshot")
    assert len(env.container.starts) == 1  # the exec's attempt only


async def test_an_ephemeral_workspace_is_not_persistent_before_it_ran_too(env):
    await env.put(persistent=False)
    assert code(await env.call("snapshot")) == (409, "not_persistent")
