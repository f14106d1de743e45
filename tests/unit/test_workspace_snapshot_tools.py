"""Snapshots a user controls (issue 13) against the workspace object with its test doubles: labels and pins,
rollback, forks, export and import, backups and the expiry fallback. The runtimes' own halves (the store's
incremental archives, the supervisor's verified import, the backup stores) have their own suites."""

import asyncio
import json

import pytest
from test_workspace import Env, body, code, types
from workspace_doubles import FakeContainer, UploadBody

from durable.settings import Settings

DAY_MS = 86_400_000


@pytest.fixture
def env():
    return Env()


async def write(env, path: str, data: bytes) -> None:
    resp = await env.call("write_file", {"path": path, "mode": 0o600, "length": len(data)}, UploadBody([data]))
    assert resp.status == 200, resp.body


async def read(env, path: str) -> bytes | None:
    resp = await env.call("read_file", {"path": path})
    return resp.body if resp.status == 200 else None


async def snapshot(env, **args) -> dict:
    resp = await env.call("snapshot", args)
    assert resp.status == 200, resp.body
    return body(resp)


# --- labels and pins -------------------------------------------------------------------------------------------


async def test_a_label_and_pin_are_listed_and_kept_through_retention(env):
    await env.put()
    await env.run()
    pinned = await snapshot(env, label="before-migration", keep=True)
    assert (pinned["label"], pinned["kept"]) == ("before-migration", True)
    for _ in range(3):  # days pass, each with a snapshot: the pinned one would have lost its slot long ago
        await env.clock.advance(8 * DAY_MS / 1000)
        await snapshot(env)
    listed = {s["id"]: s for s in body(await env.call("snapshots"))["snapshots"]}
    assert listed[pinned["id"]]["label"] == "before-migration" and listed[pinned["id"]]["kept"] is True
    assert pinned["id"] not in env.container.deleted_snapshots


async def test_pins_are_bounded_and_unpinning_makes_room():
    env = Env(Settings(idle_seconds=60, max_kept_snapshots=1))
    await env.put()
    await env.run()
    first = await snapshot(env, keep=True)
    assert code(await env.call("snapshot", {"keep": True})) == (409, "too_many_kept")
    saved = len(env.container.snapshots)
    assert code(await env.call("snapshot", {"keep": True})) == (409, "too_many_kept")
    assert len(env.container.snapshots) == saved  # refused before anything was saved
    resp = await env.call("patch_snapshot", {"snapshot_id": first["id"], "keep": False})
    assert body(resp)["kept"] is False
    assert (await snapshot(env, keep=True))["kept"] is True


async def test_patch_relabels_and_unknown_ids_are_404(env):
    await env.put()
    await env.run()
    snap = await snapshot(env, label="a")
    resp = await env.call("patch_snapshot", {"snapshot_id": snap["id"], "label": "b", "set_label": True})
    assert body(resp)["label"] == "b" and body(resp)["kept"] is False
    resp = await env.call("patch_snapshot", {"snapshot_id": snap["id"], "label": None, "set_label": True})
    assert body(resp)["label"] is None
    assert code(await env.call("patch_snapshot", {"snapshot_id": "nope", "keep": True})) == (404, "snapshot_not_found")


async def test_a_label_asked_of_a_stopped_workspace_goes_to_the_snapshot_its_files_are(env):
    await env.put()
    await env.run()
    await env.call("stop")
    [resting] = body(await env.call("snapshots"))["snapshots"]
    labelled = await snapshot(env, label="as it was")
    assert labelled["id"] == resting["id"] and labelled["label"] == "as it was"
    assert not env.container.running()


# --- rollback --------------------------------------------------------------------------------------------------


async def test_label_change_rollback_restores_exactly_the_labelled_files(env):
    await env.put()
    await env.run()
    await write(env, "/workspace/a.txt", b"one")
    before = await snapshot(env, label="before-migration")
    await write(env, "/workspace/a.txt", b"two")
    await write(env, "/workspace/b.txt", b"new")
    resp = await env.call("restore", {"snapshot": before["id"]})
    answer = body(resp)
    assert resp.status == 200 and answer["snapshot"]["id"] == before["id"] and answer["state"] == "stopped"
    safety = answer["safety_snapshot"]
    assert safety is not None and safety["label"] == "before restore"
    assert not env.container.running()
    events = await env.run()
    assert events[2]["container"] == "restored" and events[2]["snapshot"]["id"] == before["id"]
    assert events[2]["from"] == "snapshot"
    assert await read(env, "/workspace/a.txt") == b"one" and await read(env, "/workspace/b.txt") is None
    # the unsaved changes were not lost: they are the safety snapshot
    assert env.container.snapshots[safety["id"]]["/workspace/a.txt"] == b"two"


async def test_discard_changes_takes_no_safety_snapshot(env):
    await env.put()
    await env.run()
    first = await snapshot(env, label="first")
    await write(env, "/workspace/a.txt", b"unsaved")
    saved = len(env.container.snapshots)
    answer = body(await env.call("restore", {"snapshot": "latest", "discard_changes": True}))
    assert answer["snapshot"]["id"] == first["id"] and answer["safety_snapshot"] is None
    assert len(env.container.snapshots) == saved
    await env.run()
    assert await read(env, "/workspace/a.txt") is None


async def test_a_crash_before_the_next_save_comes_back_to_the_rollback_target(env):
    await env.put()
    await env.run()
    target = await snapshot(env, label="target")
    await write(env, "/workspace/a.txt", b"later")
    await snapshot(env)  # newer than the target
    await env.call("restore", {"snapshot": target["id"], "discard_changes": True})
    await env.run()
    env.container.crash()  # nothing saved since the rollback
    events = await env.run()
    assert events[2]["snapshot"]["id"] == target["id"]


async def test_restore_of_an_unknown_snapshot_is_404_and_changes_nothing(env):
    await env.put()
    await env.run()
    assert code(await env.call("restore", {"snapshot": "s-0000000000000-000000"})) == (404, "snapshot_not_found")
    assert env.container.running() and env.state == "running"


async def test_the_rollback_target_survives_the_retention_its_safety_snapshot_applies(env):
    await env.put()
    await env.run()
    target = await snapshot(env)  # unlabelled: the safety snapshot, in the same 5-minute slot, would replace it
    await env.clock.advance(60)
    answer = body(await env.call("restore", {"snapshot": target["id"]}))
    assert answer["safety_snapshot"] is not None and target["id"] not in env.container.deleted_snapshots
    events = await env.run()
    assert events[2]["snapshot"]["id"] == target["id"]


async def test_a_labelled_snapshot_outlives_the_idle_save_in_its_slot(env):
    await env.put()
    await env.run()
    labelled = await snapshot(env, label="before-migration")
    await env.fire_alarm_at_deadline()  # the idle save, minutes later
    ids = [s["id"] for s in body(await env.call("snapshots"))["snapshots"]]
    assert labelled["id"] in ids and len(ids) == 2


# --- forks -----------------------------------------------------------------------------------------------------


def sibling(env: Env, name: str):
    """A second workspace object of the same deployment (its own storage and container)."""
    other = Env(env.settings)
    other.clock = env.clock
    other.container = FakeContainer(env.clock)
    other.backups = env.backups
    other.ws = other.new_object()
    other.ws.name = name
    return other


async def fork(source: Env, target: Env, snapshot_id=None):
    shared = await source.call("share_snapshot", {"snapshot": snapshot_id})
    assert shared.status == 200, shared.body
    ref = body(shared)["ref"]
    config = {"image": "hermes", "instance": None, "persistent": True, "cwd": "/workspace"}
    return await target.call("put_config", {"config": config, "fork": ref})


async def test_three_forks_of_a_running_workspace_diverge_without_touching_it(env):
    await env.put()
    await env.run()
    await write(env, "/workspace/base.txt", b"base")
    forks = [sibling(env, f"fork{i}") for i in range(3)]
    for i, other in enumerate(forks):
        resp = await fork(env, other)
        assert resp.status == 201 and body(resp)["state"] == "stopped"
        events = await other.run()
        assert events[2]["container"] == "restored"
        assert await read(other, "/workspace/base.txt") == b"base"
        await write(other, "/workspace/mine.txt", str(i).encode())
    for i, other in enumerate(forks):
        assert await read(other, "/workspace/mine.txt") == str(i).encode()
    assert await read(env, "/workspace/mine.txt") is None and env.container.running()


async def test_a_fork_of_an_unknown_snapshot_is_404(env):
    await env.put()
    await env.run()
    assert code(await env.call("share_snapshot", {"snapshot": "nope"})) == (404, "snapshot_not_found")


# --- export and import -----------------------------------------------------------------------------------------


async def test_export_streams_the_running_files(env):
    await env.put()
    await env.run()
    await write(env, "/workspace/a.txt", b"abc")
    resp = await env.call("export")
    assert resp.status == 200 and resp.headers["content-type"] == "application/zstd"
    await env.clock.drain()
    assert json.loads(resp.body.data)["/workspace/a.txt"] == b"abc".hex()


async def test_export_of_a_stopped_workspace_boots_its_newest_snapshot(env):
    await env.put()
    await env.run()
    await write(env, "/workspace/a.txt", b"saved")
    await env.call("stop")
    resp = await env.call("export")
    await env.clock.drain()
    assert json.loads(resp.body.data)["/workspace/a.txt"] == b"saved".hex()
    assert env.container.starts[-1].snapshot_id is not None


async def test_import_into_a_running_workspace_is_409(env):
    await env.put()
    await env.run()
    assert code(await env.call("import", {"length": None}, UploadBody([b"{}"]))) == (409, "workspace_running")


async def test_import_into_a_new_workspace_boots_loads_and_saves(env):
    await env.put()
    archive = json.dumps({"/workspace/": "", "/workspace/x": b"imported".hex()}).encode()
    resp = await env.call("import", {"length": len(archive)}, UploadBody([archive]))
    assert resp.status == 200, resp.body
    answer = body(resp)
    assert answer["files"] == 2 and answer["snapshot"] is not None
    assert env.container.starts[-1].snapshot_id is None  # a new container: the archive is all its files
    assert await read(env, "/workspace/x") == b"imported"


async def test_a_damaged_import_changes_nothing(env):
    await env.put()
    await env.run()
    await write(env, "/workspace/a.txt", b"keep me")
    await env.call("stop")
    snaps = body(await env.call("snapshots"))["snapshots"]
    assert code(await env.call("import", {"length": 3}, UploadBody([b"bad"]))) == (400, "invalid_archive")
    assert env.state == "stopped" and not env.container.running()
    assert body(await env.call("snapshots"))["snapshots"] == snaps
    await env.run()
    assert await read(env, "/workspace/a.txt") == b"keep me"


async def test_a_damaged_import_into_a_new_workspace_leaves_it_new(env):
    await env.put()
    assert code(await env.call("import", {"length": 3}, UploadBody([b"bad"]))) == (400, "invalid_archive")
    status = body(await env.call("get"))
    assert (status["state"], status["booted"]) == ("created", False)


# --- backups ---------------------------------------------------------------------------------------------------


async def test_backups_need_a_store():
    env = Env()
    env.backups.available = False
    env.ws = env.new_object()
    await env.put()
    await env.run()
    assert code(await env.call("backup")) == (409, "backups_unavailable")
    assert code(await env.call("backups")) == (409, "backups_unavailable")


async def test_backup_written_listed_and_restored(env):
    await env.put()
    await env.run()
    await write(env, "/workspace/a.txt", b"backed up")
    backup = body(await env.call("backup"))
    assert backup["id"].startswith("b-")
    assert [b["id"] for b in body(await env.call("backups"))["backups"]] == [backup["id"]]
    await write(env, "/workspace/a.txt", b"changed")
    answer = body(await env.call("restore", {"backup": backup["id"], "discard_changes": True}))
    assert answer["backup"]["id"] == backup["id"]
    events = await env.run()
    assert events[2]["container"] == "restored" and events[2]["from"] == "backup"
    assert events[2]["backup"]["id"] == backup["id"]
    assert await read(env, "/workspace/a.txt") == b"backed up"
    assert code(await env.call("restore", {"backup": "b-0000000000000-000000"})) == (404, "backup_not_found")


async def test_a_failed_backup_is_a_clear_error_and_the_workspace_keeps_running(env):
    await env.put()
    await env.run()
    env.backups.fail = 1
    assert code(await env.call("backup")) == (503, "backup_failed")
    assert env.container.running() and env.state == "running"
    assert body(await env.call("backups"))["backups"] == []


async def cloudflare_like() -> Env:
    env = Env()
    env.container.snapshot_lifetime_ms = 30 * DAY_MS
    env.ws = env.new_object()
    return env


async def test_an_expired_snapshot_falls_back_to_the_newest_backup():
    env = await cloudflare_like()
    await env.put()
    await env.run()
    await write(env, "/workspace/a.txt", b"month old")
    await env.call("backup")
    await env.call("stop")
    await env.clock.advance(31 * DAY_MS / 1000)  # the snapshot expired; the backup did not
    assert body(await env.call("get"))["state"] == "stopped"
    events = await env.run()
    assert types(events)[:2] == ["status:restoring", "status:ready"] and "backup" in events[0]["message"]
    assert events[2]["container"] == "restored" and events[2]["from"] == "backup"
    assert await read(env, "/workspace/a.txt") == b"month old"
    assert env.container.imports == 1
    assert body(await env.call("snapshots"))["snapshots"]  # saved again at once


async def test_lost_only_when_neither_a_snapshot_nor_a_backup_is_left():
    env = await cloudflare_like()
    await env.put()
    await env.run()
    await env.call("stop")
    await env.clock.advance(31 * DAY_MS / 1000)
    events = await env.run()
    assert events[-1]["code"] == "workspace_lost"


async def test_a_backup_store_outage_never_makes_a_workspace_lost():
    env = await cloudflare_like()
    await env.put()
    await env.run()
    await env.call("backup")
    await env.call("stop")
    await env.clock.advance(31 * DAY_MS / 1000)
    env.backups.down = True
    assert body(await env.call("get"))["state"] == "stopped"


async def test_a_scheduled_backup_is_written_before_the_idle_save():
    env = Env(Settings(idle_seconds=60, backup_interval_seconds=3600))
    await env.put()
    await env.run()
    await env.fire_alarm_at_deadline()
    assert env.state == "stopped"
    assert len(body(await env.call("backups"))["backups"]) == 1
    await env.run()
    await env.fire_alarm_at_deadline()  # within the interval: no second backup
    assert len(body(await env.call("backups"))["backups"]) == 1


async def test_delete_removes_the_backups_too(env):
    await env.put()
    await env.run()
    await env.call("backup")
    await env.call("delete")
    assert env.backups.archives == {}


async def test_a_disk_left_by_a_runtime_killed_mid_load_is_discarded_not_restarted_on(env):
    await env.put()
    await env.run()
    await write(env, "/workspace/a.txt", b"saved")
    await env.call("stop")
    loads = []

    async def body():
        loads.append(env.ws._store.get("loading_archive"))
        yield b"{}"

    await env.call("import", {"length": None}, body())
    assert loads == [True]  # marked while the archive streams in
    assert env.ws._store.get("loading_archive") is None  # ...and cleared once its files were saved
    await env.call("restore", {"snapshot": "latest", "discard_changes": True})
    # what a runtime SIGKILLed mid-load leaves: the mark, and a disk holding half an archive
    env.ws._store.put("loading_archive", True)
    env.container.disk = {"/workspace/": b"", "/workspace/half": b"x"}
    env.ws = env.new_object()
    assert env.container.has_disk()
    events = await env.run()
    assert events[2]["container"] == "restored"
    assert await read(env, "/workspace/half") is None


async def test_a_restore_during_a_save_waits_for_it_and_latest_is_what_it_saved(env):
    await env.put()
    await env.run()
    gate = env.container.snapshot_gate = asyncio.Event()
    saving = asyncio.ensure_future(env.call("snapshot", {"label": "in flight"}))
    await env.clock.advance(0)
    restoring = asyncio.ensure_future(env.call("restore", {"snapshot": "latest", "discard_changes": True}))
    await env.clock.advance(0)
    assert not saving.done() and not restoring.done()  # the restore waits on the save's lock
    env.container.snapshot_gate = None
    gate.set()
    saved, restored = body(await saving), body(await restoring)
    assert restored["snapshot"]["id"] == saved["id"]


async def test_an_import_during_a_save_waits_for_it(env):
    await env.put()
    await env.run()
    gate = env.container.snapshot_gate = asyncio.Event()
    saving = asyncio.ensure_future(env.call("stop"))
    await env.clock.advance(0)
    importing = asyncio.ensure_future(env.call("import", {"length": 2}, UploadBody([b"{}"])))
    await env.clock.advance(0)
    assert not importing.done()
    env.container.snapshot_gate = None
    gate.set()
    assert (await saving).status == 200
    assert (await importing).status == 200  # after the stop: the workspace was at rest, so the import ran
