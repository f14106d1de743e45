"""The idle alarm against work in flight (found by the soak in bench/bench_load.py): an exec whose boot
outlasted IDLE_SECONDS is activity: the alarm must not save and stop the container between the exec's boot and its
hand-over to the supervisor (when the supervisor counts no running command yet); and neither is a file upload
slower than IDLE_SECONDS cut by a save-and-stop. A running container whose supervisor is frozen is still saved and
stopped when idle (its sync is skipped), so the next request restores a working one."""

import asyncio

import pytest
from test_workspace import Env, rid, types
from workspace_doubles import FakeContainer, UploadBody

from durable.ports import ContainerGone

pytestmark = pytest.mark.timeout(30)


async def test_alarm_due_while_an_exec_boots_does_not_stop_the_container_under_it():
    env = Env()
    await env.put()
    env.container.start_gate = asyncio.Event()  # the boot takes longer than the idle deadline
    resp = await env.start_exec("echo hi", request_id=rid(1))
    await env.clock.advance(0)
    assert env.ws._lifecycle.locked()
    await env.clock.advance(env.settings.idle_seconds + 1)  # the idle deadline passes during the boot
    alarm = asyncio.ensure_future(env.ws.alarm())  # waits for the boot's lifecycle lock
    await env.clock.advance(0)
    env.container.start_gate.set()
    await alarm
    await env.clock.drain()
    events = resp.body.events()
    assert types(events)[-2:] == ["output", "exit"], events  # it ran: the container was not stopped under it
    assert env.state == "running" and env.container.snapshots == {}
    # and once nothing runs, the (pushed) deadline saves and stops as usual
    await env.fire_alarm_at_deadline()
    assert env.state == "stopped" and len(env.container.snapshots) == 1


class SlowUploads(FakeContainer):
    """Uploads wait for `gate`: a file transfer slower than IDLE_SECONDS."""

    def __init__(self, clock):
        super().__init__(clock)
        self.gate = asyncio.Event()

    async def fetch(self, method, path, **kwargs):
        if method == "PUT" and path.startswith("/files"):
            await self.gate.wait()
        return await super().fetch(method, path, **kwargs)


async def test_alarm_due_during_a_slow_upload_does_not_stop_the_container_under_it():
    env = Env()
    env.container = SlowUploads(env.clock)
    env.ws = env.new_object()
    await env.put()
    await env.run("echo booted")
    upload = asyncio.ensure_future(
        env.call("write_file", {"path": "/workspace/big", "mode": 0o644, "length": 3}, UploadBody([b"abc"]))
    )
    await env.clock.advance(0)
    await env.clock.advance(env.settings.idle_seconds + 1)
    await env.ws.alarm()
    assert env.state == "running" and env.container.snapshots == {}
    env.container.gate.set()
    assert (await upload).status == 200
    assert env.container.disk["/workspace/big"] == b"abc"


class FrozenSupervisor(FakeContainer):
    """A running container whose supervisor answers nothing (every fetch fails as the runtime reports it)."""

    frozen = False

    async def fetch(self, method, path, **kwargs):
        if self.frozen:
            raise ContainerGone("the sandbox stopped answering")
        return await super().fetch(method, path, **kwargs)


async def test_idle_save_of_a_frozen_supervisor_still_saves_and_stops_it():
    env = Env()
    env.container = FrozenSupervisor(env.clock)
    env.ws = env.new_object()
    await env.put()
    await env.run("echo booted")
    env.container.frozen = True
    await env.fire_alarm_at_deadline()
    # saved without the sync, then stopped: the frozen container is gone and the next exec restores the snapshot
    assert env.state == "stopped" and len(env.container.snapshots) == 1 and not env.container.up
    env.container.frozen = False
    events = await env.run("echo back")
    assert [e["container"] for e in events if e["type"] == "started"] == ["restored"]
