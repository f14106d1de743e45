"""Workspace orchestration against small port doubles (real SQLite storage, manual clock, in-process container
double serving the supervisor routes)."""

import asyncio
import json
import re

import pytest
from workspace_doubles import (
    FakeContainer,
    ListStreams,
    ManualClock,
    MemoryBackupStore,
    MemoryStorage,
    RecordingAlarm,
    UploadBody,
)

from durable import operations
from durable.settings import Settings
from durable.workspace import TOUCH_SLACK_MS, Workspace
from standalone.cipher import AesGcmCipher

pytestmark = pytest.mark.timeout(30)

CONFIG = {"image": "hermes", "instance": "standard-1", "persistent": True, "cwd": "/workspace"}
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
IDLE = 600


def rid(n: int) -> str:
    return f"{n:032x}"


class Env:
    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings(idle_seconds=IDLE)
        self.clock = ManualClock()
        self.container = FakeContainer(self.clock)
        self.storage = MemoryStorage()
        self.alarm = RecordingAlarm()
        self.streams = ListStreams()
        self.backups = MemoryBackupStore()
        self.ws = self.new_object()
        self._n = 0

    def new_object(self) -> Workspace:
        """A fresh workspace object over the same storage and container (what a runtime restart gives)."""
        return Workspace(
            namespace="team",
            name="proj",
            settings=self.settings,
            storage=self.storage,
            alarm=self.alarm,
            clock=self.clock,
            container=self.container,
            streams=self.streams,
            cipher=AesGcmCipher(bytes(32)),
            backups=self.backups,
        )

    async def call(self, op, args=None, body=None):
        return await self.ws.call(op, operations.from_json(op, args or {}), body)

    async def put(self, **overrides):
        return await self.call("put_config", {"config": {**CONFIG, **overrides}})

    async def start_exec(self, command="echo hi", request_id=None, cwd=None):
        self._n += 1
        request = {
            "request_id": request_id or rid(self._n),
            "command": command,
            "timeout": 120,
            "stdin": None,
            "login": False,
            "cwd": cwd,
            "env": {},
        }
        return await self.call("exec", {"request": request})

    async def run(self, command="echo hi", request_id=None):
        resp = await self.start_exec(command, request_id)
        assert resp.status == 200, resp.body
        await self.clock.drain()
        assert resp.body.closed
        return resp.body.events()

    async def fire_alarm_at_deadline(self):
        assert self.alarm.at_ms is not None
        await self.clock.advance(max(0, (self.alarm.at_ms - self.clock.now_ms()) / 1000))
        await self.ws.alarm()

    @property
    def state(self):
        return self.ws.state.state


def body(resp):
    return json.loads(resp.body)


def code(resp):
    return resp.status, body(resp)["error"]["code"]


def types(events):
    return [e["type"] if e["type"] != "status" else f"status:{e['phase']}" for e in events]


@pytest.fixture
def env():
    return Env()


# --- config ----------------------------------------------------------------------------------------------------


async def test_put_creates_confirms_and_conflicts_without_booting(env):
    resp = await env.put()
    assert resp.status == 201
    status = body(resp)
    assert status["state"] == "created" and status["config"] == CONFIG and status["booted"] is False
    assert ISO.match(status["created_at"]) and status["running"] is False and status["last_snapshot"] is None
    assert (await env.put()).status == 200
    assert code(await env.put(cwd="/elsewhere")) == (409, "config_conflict")
    assert env.container.starts == []
    assert body(await env.call("get"))["config"] == CONFIG


@pytest.mark.parametrize(
    "op,args",
    [
        ("get", {}),
        ("delete", {}),
        ("reattach", {"request_id": rid(1), "offset": 0}),
        ("cancel", {"request_id": rid(1)}),
        ("read_file", {"path": "/x"}),
        ("snapshot", {}),
        ("snapshots", {}),
        ("stop", {}),
    ],
)
async def test_unknown_workspace_is_404(env, op, args):
    assert code(await env.call(op, args)) == (404, "workspace_not_found")
    assert env.container.starts == []


async def test_exec_on_unknown_workspace_is_404(env):
    assert code(await env.start_exec()) == (404, "workspace_not_found")


# --- boot on demand ----------------------------------------------------------------------------------------------


async def test_a_fresh_boot_creates_a_configured_cwd_before_the_first_command(env):
    await env.put(cwd="/workspace/app")
    events = await env.run("echo hi")
    assert events[-1]["exit_code"] == 0
    assert [e["command"] for e in env.container.execs] == ["mkdir -p -- /workspace/app", "echo hi"]
    assert env.container.execs[-1]["cwd"] == "/workspace/app"


async def test_first_exec_boots_fresh_with_status_events(env):
    await env.put()
    events = await env.run("echo hi")
    assert types(events) == ["status:starting", "status:ready", "started", "output", "exit"]
    started = events[2]
    assert started == {"type": "started", "request_id": rid(1), "container": "fresh", "snapshot": None}
    assert events[-1]["exit_code"] == 0
    [spec] = env.container.starts
    assert (spec.image, spec.instance, spec.env, spec.snapshot_id) == ("hermes", "standard-1", {}, None)
    # the default cwd is the image's own /workspace: no internal mkdir before the command (a cold start's exec)
    assert [e["command"] for e in env.container.execs] == ["echo hi"]
    assert env.container.execs[-1]["cwd"] == "/workspace"
    assert env.state == "running" and env.ws.state.booted
    # the exec pushed the idle deadline (coalesced: that much later, so the next second's activity writes nothing)
    assert env.alarm.at_ms == env.clock.now_ms() + IDLE * 1000 + TOUCH_SLACK_MS


async def test_second_exec_continues_without_status_events(env):
    await env.put()
    await env.run()
    events = await env.run("echo again")
    assert types(events) == ["started", "output", "exit"]
    assert events[0]["container"] == "continuing"
    assert len(env.container.starts) == 1


async def test_an_exec_on_a_running_workspace_starts_no_heartbeat(env, monkeypatch):
    """Heartbeats cover a boot; with the container already running there is nothing to wait for, and a heartbeat
    task started and cancelled around no wait cost every exec two rounds of the event loop."""
    from durable.relay import EventWriter

    started = []
    start_heartbeat = EventWriter.start_heartbeat
    monkeypatch.setattr(EventWriter, "start_heartbeat", lambda writer: (started.append(1), start_heartbeat(writer)))
    await env.put()
    await env.run()
    assert started == [1]  # the boot had one
    events = await env.run("echo again")
    assert types(events) == ["started", "output", "exit"] and events[0]["container"] == "continuing"
    assert started == [1]


async def test_concurrent_execs_share_one_start_and_its_outcome(env):
    await env.put()
    env.container.start_gate = asyncio.Event()
    first = await env.start_exec("echo a")
    second = await env.start_exec("echo b")
    await env.clock.advance(0)
    assert len(env.container.starts) == 1
    # both streams see the boot in progress, the late one too
    assert types(first.body.events()) == ["status:starting"]
    assert types(second.body.events()) == ["status:starting"]
    env.container.start_gate.set()
    await env.clock.drain()
    for resp in (first, second):
        events = resp.body.events()
        assert types(events) == ["status:starting", "status:ready", "started", "output", "exit"]
        assert events[2]["container"] == "fresh"
    assert len(env.container.starts) == 1


async def test_heartbeats_while_booting(env):
    await env.put()
    env.container.start_gate = asyncio.Event()
    resp = await env.start_exec()
    await env.clock.advance(25)
    assert types(resp.body.events()) == ["status:starting", "heartbeat", "heartbeat"]
    env.container.start_gate.set()
    await env.clock.drain()
    assert types(resp.body.events())[3:] == ["status:ready", "started", "output", "exit"]


async def test_readiness_is_polled_until_health_answers(env):
    await env.put()
    env.container.unready_polls = 3
    resp = await env.start_exec()
    await env.clock.advance(5)
    await env.clock.drain()
    assert types(resp.body.events())[-3:] == ["started", "output", "exit"]
    assert env.container.unready_polls == 0


async def test_startup_timeout_reverts_and_cleans_up(env):
    await env.put()
    env.container.unready_polls = 10**9
    resp = await env.start_exec()
    await env.clock.advance(120)
    await env.clock.drain()
    events = resp.body.events()
    assert events[-1]["type"] == "error" and events[-1]["code"] == "startup_timeout"
    assert "started" not in types(events)
    assert env.state == "created" and not env.ws.state.booted
    assert env.container.destroys == 1 and not env.container.running()


async def test_start_failure_is_reported_in_the_stream(env):
    from protocol.errors import ProtocolError

    await env.put()
    env.container.start_error = ProtocolError("container_unavailable")
    events = await env.run()
    assert events[-1]["code"] == "container_unavailable" and env.state == "created"
    env.container.start_error = None
    events = await env.run()
    assert events[-1]["type"] == "exit" and events[-3]["container"] == "fresh"


async def test_restored_after_idle_save_with_files_back(env):
    await env.put()
    await env.run()
    resp = await env.call("write_file", {"path": "/workspace/a.txt", "mode": 0o600, "length": 3}, UploadBody([b"abc"]))
    assert (resp.status, body(resp)) == (200, {"path": "/workspace/a.txt", "size": 3})
    await env.fire_alarm_at_deadline()
    assert env.state == "stopped" and not env.container.running()
    assert env.alarm.at_ms is None
    [snap] = body(await env.call("snapshots"))["snapshots"]
    events = await env.run("echo back")
    assert types(events) == ["status:restoring", "status:ready", "started", "output", "exit"]
    assert events[2]["container"] == "restored" and events[2]["snapshot"] == snap
    assert env.container.starts[-1].snapshot_id == snap["id"]
    resp = await env.call("read_file", {"path": "/workspace/a.txt"})
    assert (resp.status, resp.body, resp.headers["content-length"]) == (200, b"abc", "3")


async def test_restarted_when_the_disk_survived_a_crash(env):
    await env.put()
    env.container.keep_disk_on_crash = True
    await env.run()
    env.container.crash()
    events = await env.run()
    assert events[2]["container"] == "restarted" and events[2]["snapshot"] is None
    assert env.container.starts[-1].snapshot_id is None and env.state == "running"


async def test_crash_after_a_snapshot_restores_it(env):
    await env.put()
    await env.run()
    snap = body(await env.call("snapshot"))
    env.container.crash()
    events = await env.run()
    assert events[0] == {"type": "status", "phase": "restoring", "message": f"restoring snapshot {snap['id']}"}
    assert events[2]["container"] == "restored" and events[2]["snapshot"]["id"] == snap["id"]


async def test_booted_workspace_without_snapshot_is_lost_never_empty(env):
    await env.put()
    await env.run()
    env.container.crash()
    events = await env.run()
    assert types(events) == ["error"] and events[0]["code"] == "workspace_lost"
    assert env.state == "lost" and len(env.container.starts) == 1
    events = await env.run()
    assert events[-1]["code"] == "workspace_lost" and len(env.container.starts) == 1
    status = body(await env.call("get"))
    assert status["state"] == "lost"


async def test_damaged_snapshot_is_refused_and_nothing_is_deleted(env):
    await env.put()
    await env.run()
    assert (await env.call("stop")).status == 200
    [snap] = body(await env.call("snapshots"))["snapshots"]
    env.container.damaged.add(snap["id"])
    for _ in range(2):
        events = await env.run()
        assert types(events) == ["status:restoring", "error"] and events[-1]["code"] == "snapshot_damaged"
        assert env.state == "stopped" and not env.container.running()
    assert [s.snapshot_id for s in env.container.starts[1:]] == [snap["id"], snap["id"]]  # never a fresh start
    assert body(await env.call("snapshots"))["snapshots"] == [snap]
    assert env.container.deleted_snapshots == [] and snap["id"] in env.container.snapshots


# --- exec details ------------------------------------------------------------------------------------------------


async def test_duplicate_request_id_is_refused_and_runs_once(env):
    await env.put()
    await env.run("echo once", request_id=rid(7))
    assert code(await env.start_exec("echo twice", request_id=rid(7))) == (409, "duplicate_request")
    assert [e["command"] for e in env.container.execs if e["request_id"] == rid(7)] == ["echo once"]


async def test_ledger_survives_a_new_object(env):
    await env.put()
    await env.run(request_id=rid(7))
    env.ws = env.new_object()
    assert code(await env.start_exec(request_id=rid(7))) == (409, "duplicate_request")
    assert body(await env.call("get"))["state"] == "running"


async def test_cancel_before_exec_ends_that_exec_cancelled(env):
    await env.put()
    resp = await env.call("cancel", {"request_id": rid(9)})
    assert body(resp) == {"request_id": rid(9), "state": "pending"}
    events = await env.run(request_id=rid(9))
    assert types(events) == ["error"] and events[0]["code"] == "command_cancelled"
    assert env.container.starts == [] and env.container.execs == []
    assert code(await env.start_exec(request_id=rid(9))) == (409, "duplicate_request")


async def test_reattach_to_an_early_cancelled_exec_ends_as_its_stream_did(env):
    await env.put()
    assert body(await env.call("cancel", {"request_id": rid(9)}))["state"] == "pending"
    assert [e["code"] for e in await env.run(request_id=rid(9))] == ["command_cancelled"]
    await env.run("true", request_id=rid(2))  # the container is up now and never saw rid(9)
    resp = await env.call("reattach", {"request_id": rid(9), "offset": 0})
    await env.clock.drain()
    assert resp.status == 200 and [e.get("code") for e in resp.body.events()] == ["command_cancelled"]
    env.container.crash()  # and without a container
    resp = await env.call("reattach", {"request_id": rid(9), "offset": 0})
    await env.clock.drain()
    assert [e.get("code") for e in resp.body.events()] == ["command_cancelled"]
    assert code(await env.start_exec(request_id=rid(9))) == (409, "duplicate_request")


async def test_cancel_while_booting_never_reaches_the_supervisor(env):
    await env.put()
    env.container.start_gate = asyncio.Event()
    resp = await env.start_exec(request_id=rid(3))
    await env.clock.advance(0)
    assert body(await env.call("cancel", {"request_id": rid(3)}))["state"] == "cancelled"
    env.container.start_gate.set()
    await env.clock.drain()
    events = resp.body.events()
    assert events[-1]["type"] == "error" and events[-1]["code"] == "command_cancelled"
    assert rid(3) not in [e["request_id"] for e in env.container.execs]


async def test_cancel_running_command_is_forwarded(env):
    await env.put()
    resp = await env.start_exec("hold", request_id=rid(4))
    await env.clock.advance(0)
    assert body(await env.call("get"))["busy"] is True
    assert body(await env.call("cancel", {"request_id": rid(4)}))["state"] == "cancelled"
    await env.clock.drain()
    assert env.container.cancels == [rid(4)] and resp.body.events()[-1]["type"] == "exit"


async def test_supervisor_errors_become_terminal_events(env):
    await env.put()
    await env.run()
    resp = await env.start_exec(cwd="/missing")
    await env.clock.drain()
    events = resp.body.events()
    assert types(events) == ["started", "error"] and events[-1]["code"] == "invalid_cwd"


async def test_container_dying_mid_command_ends_with_container_exited(env):
    await env.put()
    resp = await env.start_exec("hold")
    await env.clock.advance(0)
    env.container.crash()
    await env.clock.drain()
    events = resp.body.events()
    assert types(events)[-2:] == ["output", "error"] and events[-1]["code"] == "container_exited"
    assert resp.body.closed


async def test_reattach_replays_and_reports_unknown_ids(env):
    await env.put()
    await env.run("echo hi", request_id=rid(5))
    resp = await env.call("reattach", {"request_id": rid(5), "offset": 0})
    await env.clock.drain()
    assert types(resp.body.events()) == ["output", "exit"]
    assert code(await env.call("reattach", {"request_id": rid(6), "offset": 0})) == (404, "request_not_found")
    env.container.crash()
    resp = await env.call("reattach", {"request_id": rid(5), "offset": 3})
    await env.clock.drain()
    assert resp.status == 200 and [e.get("code") for e in resp.body.events()] == ["container_exited"]
    assert code(await env.call("reattach", {"request_id": rid(6), "offset": 0})) == (404, "request_not_found")
    assert len(env.container.starts) == 1  # reattach never boots


# --- idle, retries, checkpoints -------------------------------------------------------------------------------------


async def test_idle_waits_for_running_commands(env):
    await env.put()
    resp = await env.start_exec("hold", request_id=rid(1))
    await env.clock.advance(0)
    await env.fire_alarm_at_deadline()
    assert env.state == "running" and env.container.snapshots == {}
    assert env.alarm.at_ms == env.clock.now_ms() + IDLE * 1000
    env.container.release(rid(1))
    await env.clock.drain()
    assert resp.body.events()[-1]["type"] == "exit"
    await env.fire_alarm_at_deadline()
    assert env.state == "stopped" and len(env.container.snapshots) == 1 and env.container.syncs == 1


async def test_ephemeral_workspace_is_forgotten_when_idle(env):
    await env.put(persistent=False)
    await env.run()
    await env.fire_alarm_at_deadline()
    assert env.container.destroys == 1 and env.container.snapshots == {}
    assert env.alarm.at_ms is None
    assert code(await env.call("get")) == (404, "workspace_not_found")
    assert env.storage.sql("SELECT COUNT(*) AS n FROM meta")[0]["n"] == 0


async def test_failed_save_keeps_running_and_retries_with_backoff(env):
    await env.put()
    await env.run()
    env.container.fail_snapshots = 2
    await env.fire_alarm_at_deadline()
    assert env.state == "running" and env.container.running()
    assert env.alarm.at_ms == env.clock.now_ms() + 30_000
    await env.fire_alarm_at_deadline()
    assert env.state == "running" and env.alarm.at_ms == env.clock.now_ms() + 60_000
    await env.fire_alarm_at_deadline()
    assert env.state == "stopped" and len(env.container.snapshots) == 1 and env.alarm.at_ms is None
    # the backoff starts over after a success
    await env.run()
    env.container.fail_snapshots = 1
    await env.fire_alarm_at_deadline()
    assert env.alarm.at_ms == env.clock.now_ms() + 30_000


async def test_backoff_is_capped(env):
    await env.put()
    await env.run()
    env.container.fail_snapshots = 10
    delays = []
    for _ in range(8):
        await env.fire_alarm_at_deadline()
        delays.append((env.alarm.at_ms - env.clock.now_ms()) // 1000)
    assert delays == [30, 60, 120, 240, 480, 900, 900, 900]


async def test_retries_stop_when_the_container_is_gone(env):
    await env.put()
    await env.run()
    env.container.fail_snapshots = 1
    await env.fire_alarm_at_deadline()
    env.container.crash()
    await env.fire_alarm_at_deadline()
    assert env.state == "lost" and env.alarm.at_ms is None


async def test_retries_stop_at_stopped_when_a_snapshot_exists(env):
    await env.put()
    await env.run()
    await env.call("snapshot")
    env.container.fail_snapshots = 1
    await env.fire_alarm_at_deadline()
    env.container.crash()
    await env.fire_alarm_at_deadline()
    assert env.state == "stopped" and env.alarm.at_ms is None
    events = await env.run()
    assert events[2]["container"] == "restored"


async def test_periodic_checkpoints_keep_running():
    env = Env(Settings(idle_seconds=IDLE, snapshot_interval_seconds=120))
    await env.clock.advance((300_000 - env.clock.now_ms() % 300_000) / 1000)  # to the start of a 5-minute slot
    await env.put()
    await env.run()
    assert env.alarm.at_ms == env.clock.now_ms() + 120_000  # the earlier of checkpoint and idle
    await env.fire_alarm_at_deadline()
    assert env.state == "running" and env.container.running()
    [first] = [s.id for s in env.ws.state.snapshots()]
    assert env.alarm.at_ms == env.clock.now_ms() + 120_000
    await env.fire_alarm_at_deadline()
    # the second checkpoint falls in the same 5-minute slot: retention replaces the first
    [second] = [s.id for s in env.ws.state.snapshots()]
    assert second != first and env.container.deleted_snapshots == [first]
    assert env.state == "running"
    await env.clock.advance(IDLE)
    await env.ws.alarm()
    assert env.state == "stopped" and env.alarm.at_ms is None


async def test_exec_during_a_save_waits_then_restores(env):
    await env.put()
    await env.run()
    env.container.snapshot_gate = asyncio.Event()
    await env.clock.advance(IDLE + TOUCH_SLACK_MS / 1000)
    saving = asyncio.ensure_future(env.ws.alarm())
    await env.clock.advance(0)
    assert env.state == "saving"
    resp = await env.start_exec("echo after")
    await env.clock.advance(0)
    assert "started" not in types(resp.body.events())
    env.container.snapshot_gate.set()
    await saving
    await env.clock.drain()
    events = resp.body.events()
    assert events[-3]["container"] == "restored" and events[-1]["type"] == "exit"


async def test_spurious_alarm_only_rearms(env):
    await env.put()
    await env.run()
    at = env.alarm.at_ms
    await env.ws.alarm()
    assert env.state == "running" and env.alarm.at_ms == at


# --- snapshot, stop, delete, files, status ----------------------------------------------------------------------


async def test_snapshot_requires_persistence_and_survives_failure(env):
    await env.put(persistent=False)
    assert code(await env.call("snapshot")) == (409, "not_persistent")
    env2 = Env()
    await env2.put()
    await env2.run()
    env2.container.fail_snapshots = 1
    assert code(await env2.call("snapshot")) == (503, "snapshot_failed")
    assert env2.state == "running" and env2.container.running()
    snap = body(await env2.call("snapshot"))
    assert set(snap) == {"id", "created_at", "size", "expires_at", "label", "kept"} and ISO.match(snap["created_at"])
    assert snap["expires_at"] is None  # the doubles' snapshots never expire unless a test says so
    assert body(await env2.call("get"))["last_snapshot"] == snap


async def test_snapshots_listed_newest_first_and_retention_applied(env):
    await env.put()
    await env.run()
    await env.clock.advance((300_000 - env.clock.now_ms() % 300_000) / 1000)  # to the start of a 5-minute slot
    ids = []
    for _ in range(3):  # three snapshots in one 5-minute slot: only the newest is kept
        ids.append(body(await env.call("snapshot"))["id"])
        await env.clock.advance(60)
    listed = [s["id"] for s in body(await env.call("snapshots"))["snapshots"]]
    assert listed == [ids[2]]
    assert env.container.deleted_snapshots == ids[:2]
    await env.clock.advance(3600)
    ids.append(body(await env.call("snapshot"))["id"])
    assert [s["id"] for s in body(await env.call("snapshots"))["snapshots"]] == [ids[3], ids[2]]


async def test_stop_persistent_saves_then_stops(env):
    await env.put()
    await env.run()
    env.container.fail_snapshots = 1
    assert code(await env.call("stop")) == (503, "snapshot_failed")
    assert env.state == "running" and env.container.running()
    resp = await env.call("stop")
    assert resp.status == 200 and body(resp)["state"] == "stopped" and body(resp)["running"] is False
    assert env.container.destroys == 1 and len(env.container.snapshots) == 1 and env.alarm.at_ms is None


async def test_stop_ephemeral_forgets(env):
    await env.put(persistent=False)
    await env.run()
    assert body(await env.call("stop")) == {"deleted": True}
    assert code(await env.call("get")) == (404, "workspace_not_found")
    assert env.alarm.at_ms is None and not env.container.running()


async def test_delete_removes_container_snapshots_and_metadata(env):
    await env.put()
    await env.run()
    await env.call("snapshot")
    await env.clock.advance(3600)
    await env.call("snapshot")
    snaps = set(env.container.snapshots)
    assert body(await env.call("delete")) == {"deleted": True}
    assert set(env.container.deleted_snapshots) == snaps and env.container.snapshots == {}
    assert not env.container.running() and env.alarm.at_ms is None
    for table in ("meta", "snapshots", "ledger"):
        assert env.storage.sql(f"SELECT COUNT(*) AS n FROM {table}")[0]["n"] == 0
    assert code(await env.call("get")) == (404, "workspace_not_found")
    assert (await env.put()).status == 201  # the name can be used again


async def test_files_boot_on_demand_and_pass_limits(env):
    await env.put()
    resp = await env.call("read_file", {"path": "/workspace/none"})
    assert code(resp) == (404, "file_not_found")  # the supervisor's answer, passed through
    assert len(env.container.starts) == 1
    resp = await env.call(
        "write_file", {"path": "/workspace/b c+", "mode": 0o755, "length": 2}, UploadBody([b"h", b"i"])
    )
    assert resp.status == 200
    assert env.container.last_write_query == {
        "path": "/workspace/b c+",
        "mode": "0755",
        "max_bytes": str(env.settings.max_file_write_bytes),
    }


async def test_files_on_a_lost_workspace_are_refused(env):
    await env.put()
    await env.run()
    env.container.crash()
    assert code(await env.call("read_file", {"path": "/x"})) == (409, "workspace_lost")


async def test_status_reports_busy_and_timestamps(env):
    await env.put()
    status = body(await env.call("get"))
    assert status["busy"] is False and status["running"] is False
    await env.start_exec("hold", request_id=rid(1))
    await env.clock.advance(0)
    status = body(await env.call("get"))
    assert status["running"] is True and status["busy"] is True and status["booted"] is True
    assert ISO.match(status["last_activity_at"])
    env.container.release(rid(1))
    await env.clock.drain()


async def test_manual_snapshot_shows_saving_and_keeps_running(env):
    await env.put()
    await env.run()
    env.container.snapshot_gate = asyncio.Event()
    pending = asyncio.ensure_future(env.call("snapshot"))
    await env.clock.advance(0)
    assert body(await env.call("get"))["state"] == "saving"
    env.container.snapshot_gate.set()
    assert (await pending).status == 200
    assert env.state == "running" and env.container.running()
    events = await env.run()
    assert events[0]["container"] == "continuing"


@pytest.mark.parametrize(
    "stored,booted,expected",
    [
        ("starting", False, "created"),
        ("starting", True, "stopped"),
        ("restoring", True, "stopped"),
        ("saving", True, "running"),
    ],
)
async def test_a_new_object_settles_states_left_by_a_stopped_runtime(env, stored, booted, expected):
    await env.put()
    if stored == "saving":
        await env.run()  # an object evicted mid-save: its container is still up
    env.ws._store.put("state", stored)
    env.ws._store.put("booted", booted)
    env.ws = env.new_object()
    assert env.state == expected


@pytest.mark.parametrize(
    "snapshot,disk_survives,expected",
    [(False, False, "lost"), (True, False, "stopped"), (False, True, "stopped")],
)
async def test_a_new_object_says_where_a_workspace_whose_container_died_rests(env, snapshot, disk_survives, expected):
    """After the runtime was killed, GET must not say `running` of a container that is gone."""
    await env.put()
    await env.run()
    if snapshot:
        assert (await env.call("snapshot")).status == 200
    env.container.keep_disk_on_crash = disk_survives
    env.container.crash()
    env.ws = env.new_object()
    assert env.state != "running"
    status = body(await env.call("get"))
    assert (status["state"], status["running"]) == (expected, False)
    assert env.state == expected


async def test_after_a_runtime_restart_mid_boot_the_next_exec_boots_again(env):
    await env.put()
    env.ws._store.put("state", "starting")  # what a runtime that died during the first boot leaves behind
    env.ws = env.new_object()
    events = await env.run()
    assert types(events) == ["status:starting", "status:ready", "started", "output", "exit"]
    assert events[2]["container"] == "fresh"


async def test_an_unexpected_snapshot_error_is_a_failed_save_not_a_hot_loop(env):
    await env.put()
    await env.run()
    env.container.fail_snapshots = 1
    env.container.snapshot_error = RuntimeError("adapter bug")
    await env.fire_alarm_at_deadline()
    assert env.state == "running" and env.container.running()
    assert env.alarm.at_ms == env.clock.now_ms() + 30_000  # retried later, never re-armed in the past
    await env.fire_alarm_at_deadline()
    assert env.state == "stopped"


async def test_a_checkpoint_still_happens_while_a_long_command_keeps_the_workspace_awake():
    env = Env(Settings(idle_seconds=60, snapshot_interval_seconds=60))
    await env.put()
    await env.start_exec("hold", request_id=rid(1))
    await env.clock.advance(0)
    await env.fire_alarm_at_deadline()  # idle and checkpoint are both due
    assert env.state == "running" and len(env.ws.state.snapshots()) == 1
    assert env.alarm.at_ms > env.clock.now_ms()
    env.container.release(rid(1))
    await env.clock.drain()


async def test_cancel_is_idempotent_and_reports_finished_commands(env):
    await env.put()
    assert body(await env.call("cancel", {"request_id": rid(8)}))["state"] == "pending"
    assert body(await env.call("cancel", {"request_id": rid(8)}))["state"] == "pending"
    await env.run(request_id=rid(8))  # ends command_cancelled without reaching the supervisor
    await env.run(request_id=rid(9))
    assert body(await env.call("cancel", {"request_id": rid(8)}))["state"] == "finished"
    assert body(await env.call("cancel", {"request_id": rid(9)}))["state"] == "finished"
    env.container.crash()
    assert body(await env.call("cancel", {"request_id": rid(9)}))["state"] == "finished"
