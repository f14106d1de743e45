"""The workspace object (one per namespace/workspace): config, lifecycle, container control, exec relay, alarms.

Runtime-neutral: it talks to its runtime only through the ports (durable/ports.py). Lifecycle operations (boot,
stop, snapshot, delete, the alarm's save) hold one lock, so they never interleave; concurrent requests that need
the container share one boot and all see its outcome (`fresh`, `restored`, ...).
"""

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from durable import retention, supervisor
from durable.ledger import CANCEL, EXEC, Ledger
from durable.ports import (
    JSON_TYPE,
    NDJSON_TYPE,
    Alarm,
    Clock,
    Container,
    ContainerGone,
    Response,
    SnapshotInfo,
    StartSpec,
    Storage,
    Streams,
)
from durable.relay import EventWriter
from durable.schedule import CHECKPOINT, IDLE, RETRY, RETRY_FIRST_SECONDS, Schedule
from durable.settings import Settings
from durable.state import WorkspaceState, snapshot_object
from durable.store import Store
from protocol.errors import ProtocolError
from protocol.events import error_event, started_event, status_event
from protocol.validate import parse_exec_request

log = logging.getLogger("flarebox.workspace")

_STREAM_HEADERS = {"content-type": NDJSON_TYPE, "cache-control": "no-store"}
_PASS_HEADERS = ("content-type", "content-length")


@dataclass(frozen=True)
class Boot:
    container: str  # continuing | fresh | restored | restarted
    snapshot: dict | None = None  # the snapshot object a `restored` container came from


class Workspace:
    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        settings: Settings,
        storage: Storage,
        alarm: Alarm,
        clock: Clock,
        container: Container,
        streams: Streams,
    ):
        self.namespace = namespace
        self.name = name
        self.settings = settings
        self.alarm_port = alarm
        self.clock = clock
        self.container = container
        self.streams = streams
        store = Store(storage)
        self._store = store
        self.state = WorkspaceState(store)
        self.ledger = Ledger(store)
        self.schedule = Schedule(store)
        self._lifecycle = asyncio.Lock()
        self._boot: asyncio.Future | None = None
        self._boot_phase: dict | None = None  # the current status event, replayed to requests that join late
        self._listeners: list = []
        self._launching: dict[str, bool] = {}  # exec ids not yet handed to the supervisor -> cancel requested
        # exec and reattach streams being relayed now (from boot to their last byte): each is activity the idle
        # alarm must not cut — between an exec's boot and its hand-over, and between a command's end and the last
        # bytes of its stream, the supervisor counts no running command
        self._relays = 0
        self._transfers = 0  # file uploads/downloads between their boot and the supervisor's answer: activity too
        self._settle_stale_state()

    def _settle_stale_state(self) -> None:
        """A new object has nothing in flight, so a stored transitional state is left over from a runtime that
        stopped mid-operation: fall back to the state the operation started from."""
        state = self.state.state
        if state in ("starting", "restoring"):
            self.state.set_state("stopped" if self.state.booted else "created")
        elif state == "saving":
            self.state.set_state("running")  # the next request notices if the container is gone

    # --- dispatch ------------------------------------------------------------------------------------------

    async def call(self, op: str, args: dict[str, Any], body: Any = None) -> Response:
        handler = getattr(self, f"_op_{op}", None)
        if handler is None:
            return Response.error(ProtocolError("not_found"))
        try:
            return await handler(args, body)
        except ProtocolError as err:
            return Response.error(err)
        except ContainerGone as gone:
            return Response.error(ProtocolError("container_exited", str(gone) or None))
        except Exception:
            log.exception("workspace %s/%s: %s failed", self.namespace, self.name, op)
            return Response.error(ProtocolError("internal_error"))

    def _require(self) -> WorkspaceState:
        if not self.state.exists:
            raise ProtocolError("workspace_not_found")
        return self.state

    def _container_up(self) -> bool:
        return self.state.state in ("running", "saving") and self.container.running()

    async def _touch(self) -> None:
        """Activity: push the idle deadline. A new request also supersedes a pending save retry (the next idle
        deadline saves again)."""
        if not self.state.exists:
            return
        now = self.clock.now_ms()
        self.state.touch(now)
        self.schedule.set_at(IDLE, now + self.settings.idle_seconds * 1000)
        self.schedule.clear(RETRY)
        await self.schedule.arm(self.alarm_port)

    async def _status(self, http_status: int = 200) -> Response:
        running = self._container_up()
        busy = running and await supervisor.running_commands(self.container) > 0
        return Response.json(
            http_status, self.state.status_object(self.namespace, self.name, running=running, busy=busy)
        )

    # --- config and status ---------------------------------------------------------------------------------

    async def _op_put_config(self, args: dict, body: Any) -> Response:
        config = args["config"]
        if not self.state.exists:
            self.state.create(config, self.clock.now_ms())
            return await self._status(201)
        if self.state.config != config:
            raise ProtocolError("config_conflict", f"the workspace exists with config {json.dumps(self.state.config)}")
        return await self._status(200)

    async def _op_get(self, args: dict, body: Any) -> Response:
        self._require()
        return await self._status()

    async def _op_snapshots(self, args: dict, body: Any) -> Response:
        state = self._require()
        return Response.json(200, {"snapshots": [snapshot_object(s) for s in state.snapshots()]})

    # --- boot ----------------------------------------------------------------------------------------------

    async def _ensure_running(self, listener=None) -> Boot:
        """Make the container run, sharing one boot between concurrent callers. `listener` receives the boot's
        status events (an async callable)."""
        if self._boot is None or self._boot.done():
            if self._container_up() and self.state.state == "running" and not self._lifecycle.locked():
                return Boot("continuing")
            self._boot = asyncio.ensure_future(self._boot_once())
            self._boot.add_done_callback(lambda f: f.cancelled() or f.exception())  # always retrieved
        boot = self._boot
        if listener is not None:
            self._listeners.append(listener)
            if self._boot_phase is not None:
                await listener(self._boot_phase)
        try:
            return await asyncio.shield(boot)
        finally:
            if listener is not None and listener in self._listeners:
                self._listeners.remove(listener)

    async def _emit(self, event: dict) -> None:
        self._boot_phase = event
        for listener in list(self._listeners):
            await listener(event)

    async def _boot_once(self) -> Boot:
        async with self._lifecycle:
            try:
                return await self._boot_locked()
            finally:
                self._boot_phase = None

    async def _boot_locked(self) -> Boot:
        state = self._require()
        config = state.config
        if state.state == "running" and self.container.running():
            return Boot("continuing")
        snapshot = None
        if not state.booted:
            mode, phase, message = "fresh", "starting", "starting a new container"
        elif self.container.has_disk():
            mode, phase, message = "restarted", "starting", "restarting the container on its surviving disk"
        else:
            snapshot = state.newest_snapshot()
            if snapshot is None:
                state.set_state("lost")
                self.schedule.clear_all()
                await self.schedule.arm(self.alarm_port)
                raise ProtocolError("workspace_lost")
            mode, phase, message = "restored", "restoring", f"restoring snapshot {snapshot['id']}"
        fallback = "stopped" if state.booted else "created"
        if state.state == "running":  # a crash noticed now: the state machine passes through stopped
            state.set_state("stopped")
        state.set_state(phase)
        await self._emit(status_event(phase, message))
        spec = StartSpec(
            image=config["image"],
            instance=config["instance"] or self.settings.default_instance_type,
            env={},  # nothing secret ever enters the container
            enable_internet=self.settings.enable_internet,
            snapshot_id=snapshot["id"] if snapshot else None,
        )
        try:
            await self.container.start(spec)
            await supervisor.wait_ready(self.container, self.clock)
            if mode == "fresh":
                await supervisor.make_dir(self.container, config["cwd"])
        except BaseException as exc:
            if state.state == phase:
                state.set_state(fallback)
            if mode != "restarted" and not (isinstance(exc, ProtocolError) and exc.code == "snapshot_damaged"):
                await self._destroy_quietly()  # a half-started container must not linger
            raise
        state.mark_booted()
        state.set_state("running")
        if state.persistent and self.settings.snapshot_interval_seconds > 0:
            self.schedule.set_at(CHECKPOINT, self.clock.now_ms() + self.settings.snapshot_interval_seconds * 1000)
            await self.schedule.arm(self.alarm_port)
        await self._emit(status_event("ready"))
        return Boot(mode, snapshot_object(snapshot))

    async def _destroy_quietly(self) -> None:
        try:
            await self.container.destroy()
        except Exception:
            log.warning("destroying the container of %s/%s failed", self.namespace, self.name, exc_info=True)

    # --- exec, reattach, cancel ----------------------------------------------------------------------------

    async def _op_exec(self, args: dict, body: Any) -> Response:
        self._require()
        request = parse_exec_request(args["request"])
        rid = request.request_id
        seen = self.ledger.lookup(rid)
        if seen == EXEC:
            raise ProtocolError("duplicate_request")
        self.ledger.record_exec(rid)
        writer = EventWriter(self.streams.open(), self.clock)
        response = Response(200, writer.readable, dict(_STREAM_HEADERS))
        if seen == CANCEL:
            self.clock.spawn(self._finish(writer, error_event("command_cancelled")))
            return response
        self._launching[rid] = False
        try:
            await self._touch()
        except Exception:  # the id is recorded: from here on the command must run, idle push or not
            log.warning("idle push before exec %s failed", rid, exc_info=True)
        self.clock.spawn(self._run_exec(writer, request.to_json()))
        return response

    async def _finish(self, writer: EventWriter, event: dict) -> None:
        await writer.event(event)
        await writer.close()

    async def _run_exec(self, writer: EventWriter, request: dict) -> None:
        rid = request["request_id"]
        self._relays += 1
        try:
            writer.start_heartbeat()
            try:
                boot = await self._ensure_running(writer.event)
            finally:
                await writer.stop_heartbeat()
            if self._launching.get(rid):
                raise ProtocolError("command_cancelled")
            await writer.event(started_event(rid, boot.container, boot.snapshot))
            if request.get("cwd") is None:
                request = {**request, "cwd": self.state.config["cwd"]}
            resp = await self.container.fetch(
                "POST", "/exec", body=json.dumps(request).encode(), headers={"content-type": JSON_TYPE}
            )
            self._launching.pop(rid, None)
            if resp.status != 200:
                raise await supervisor.error_of(resp)
            await writer.pipe(resp.body)
        except ProtocolError as err:
            await writer.event(error_event(err.code, err.message))
        except ContainerGone as gone:
            await writer.event(error_event("container_exited", str(gone) or None))
        except Exception:
            log.exception("exec %s on %s/%s failed", rid, self.namespace, self.name)
            await writer.event(error_event("internal_error"))
        finally:
            self._relays -= 1
            self._launching.pop(rid, None)
            await writer.close()
            try:
                await self._touch()  # the end of a command is activity too
            except Exception:  # the workspace may have been deleted (and its storage closed) meanwhile
                log.debug("no idle push after exec %s", rid, exc_info=True)

    async def _op_reattach(self, args: dict, body: Any) -> Response:
        self._require()
        rid, offset = args["request_id"], int(args.get("offset", 0))
        # an exec still booting has not reached the supervisor yet; wait for the hand-over
        waited = 0.0
        while rid in self._launching and waited < supervisor.STARTUP_BUDGET_SECONDS + 5:
            await self.clock.sleep(0.05)
            waited += 0.05
        await self._touch()
        if self._container_up():
            try:
                resp = await self.container.fetch("GET", f"/exec/{rid}?{supervisor.query(offset=offset)}")
            except ContainerGone:
                resp = None
            if resp is not None:
                if resp.status != 200:
                    raise await supervisor.error_of(resp, fallback="request_not_found")
                writer = EventWriter(self.streams.open(), self.clock)
                self.clock.spawn(self._pipe(writer, resp.body))
                return Response(200, writer.readable, dict(_STREAM_HEADERS))
        if self.ledger.lookup(rid) == EXEC:
            writer = EventWriter(self.streams.open(), self.clock)
            message = "the container stopped; the command's outcome is unknown"
            self.clock.spawn(self._finish(writer, error_event("container_exited", message)))
            return Response(200, writer.readable, dict(_STREAM_HEADERS))
        raise ProtocolError("request_not_found")

    async def _pipe(self, writer: EventWriter, body: Any) -> None:
        self._relays += 1
        try:
            await writer.pipe(body)
        except ContainerGone as gone:
            await writer.event(error_event("container_exited", str(gone) or None))
        except Exception:
            log.exception("reattach relay on %s/%s failed", self.namespace, self.name)
            await writer.event(error_event("internal_error"))
        finally:
            self._relays -= 1
            await writer.close()

    async def _op_cancel(self, args: dict, body: Any) -> Response:
        self._require()
        rid = args["request_id"]
        if rid in self._launching:
            self._launching[rid] = True  # checked before the exec is handed to the supervisor
            await self._forward_cancel(rid)  # and in case the hand-over is under way right now
            state = "cancelled"
        elif self.ledger.lookup(rid) == EXEC:
            # handed over already (or ended before it could be): a supervisor that never saw it means it is over
            forwarded = await self._forward_cancel(rid)
            state = "cancelled" if forwarded == "cancelled" else "finished"
        else:
            self.ledger.record_cancel(rid)
            state = "pending"
        await self._touch()
        return Response.json(200, {"request_id": rid, "state": state})

    async def _forward_cancel(self, rid: str) -> str | None:
        if not self._container_up():
            return None
        try:
            resp = await self.container.fetch("POST", f"/exec/{rid}/cancel")
            if resp.status != 200:
                await resp.read()  # drained, capped like every control answer
                return None
            data = await resp.json()
        except ContainerGone:
            return None
        except Exception:
            log.warning("forwarding a cancel failed", exc_info=True)
            return None
        state = data.get("state") if isinstance(data, dict) else None
        return state if state in ("cancelled", "pending", "finished") else None

    # --- files ---------------------------------------------------------------------------------------------

    async def _op_read_file(self, args: dict, body: Any) -> Response:
        self._require()
        self._transfers += 1
        try:
            await self._ensure_running()
            await self._touch()
            q = supervisor.query(path=args["path"], max_bytes=self.settings.max_file_read_bytes)
            resp = await self.container.fetch("GET", f"/files?{q}")
        finally:
            self._transfers -= 1
        return Response(resp.status, resp.body, {k: v for k, v in resp.headers.items() if k.lower() in _PASS_HEADERS})

    async def _op_write_file(self, args: dict, body: Any) -> Response:
        self._require()
        self._transfers += 1  # an upload slower than IDLE_SECONDS must not have its container stopped under it
        try:
            await self._ensure_running()
            await self._touch()
            mode = args.get("mode", 0o644)
            q = supervisor.query(path=args["path"], mode=f"{mode:04o}", max_bytes=self.settings.max_file_write_bytes)
            headers = {"content-length": str(args["length"]), "content-type": "application/octet-stream"}
            resp = await self.container.fetch("PUT", f"/files?{q}", body=body, headers=headers)
        finally:
            self._transfers -= 1
        return Response(resp.status, resp.body, {k: v for k, v in resp.headers.items() if k.lower() in _PASS_HEADERS})

    # --- snapshots, stop, delete ---------------------------------------------------------------------------

    async def _checkpoint(self) -> SnapshotInfo:
        """A snapshot that keeps the container running (POST …/snapshot, periodic checkpoints): `saving` while
        it is written. Caller holds the lifecycle lock."""
        self.state.set_state("saving")
        try:
            return await self._take_snapshot()
        finally:
            self.state.set_state("running")

    async def _take_snapshot(self) -> SnapshotInfo:
        """Snapshot the running container, record it and apply retention. Caller holds the lifecycle lock."""
        await supervisor.sync(self.container)
        info = await self.container.snapshot()
        self.state.add_snapshot(info)
        await self._apply_retention()
        return info

    async def _apply_retention(self) -> None:
        snaps = [(s["id"], s["created_at_ms"]) for s in self.state.snapshots()]
        for snapshot_id in retention.drop(snaps, self.clock.now_ms()):
            try:
                await self.container.delete_snapshot(snapshot_id)
            except Exception:
                log.warning("dropping snapshot %s failed; kept for now", snapshot_id, exc_info=True)
                continue
            self.state.remove_snapshot(snapshot_id)

    async def _op_snapshot(self, args: dict, body: Any) -> Response:
        state = self._require()
        if not state.persistent:
            raise ProtocolError("not_persistent")
        if not self._container_up():
            newest = state.newest_snapshot()
            if newest is not None and not self.container.has_disk():
                return Response.json(200, snapshot_object(newest))  # nothing changed since it was taken
            await self._ensure_running()
        async with self._lifecycle:
            if not self._container_up():
                raise ProtocolError("container_exited")
            info = await self._checkpoint()
        return Response.json(200, snapshot_object(self._info_dict(info)))

    @staticmethod
    def _info_dict(info: SnapshotInfo) -> dict:
        return {"id": info.id, "created_at_ms": info.created_at_ms, "size": info.size}

    def _resting_state(self) -> str:
        """Where a workspace whose container is gone rests: stopped if it can come back, else lost."""
        if self.state.newest_snapshot() is not None or self.container.has_disk():
            return "stopped"
        return "lost"

    async def _save_and_stop(self) -> None:
        """Persistent workspaces: snapshot, then destroy. On a failed snapshot the container keeps running and
        the error propagates. Caller holds the lifecycle lock."""
        state = self.state
        state.set_state("saving")
        try:
            await self._take_snapshot()
        except BaseException:
            state.set_state("running")
            raise
        await self._destroy_quietly()  # the snapshot is recorded: from here on the workspace is stopped
        state.set_state("stopped")
        self.schedule.clear_all()
        self.schedule.reset_retry()
        await self.schedule.arm(self.alarm_port)

    async def _forget(self) -> None:
        """Ephemeral end of life / delete: no container, no snapshots, no record, no alarm."""
        await self._destroy_quietly()
        for snap in self.state.snapshots():
            try:
                await self.container.delete_snapshot(snap["id"])
            except Exception:
                log.warning("deleting snapshot %s failed", snap["id"], exc_info=True)
        self._store.wipe()
        await self.alarm_port.clear()
        self._launching.clear()

    async def _op_stop(self, args: dict, body: Any) -> Response:
        state = self._require()
        async with self._lifecycle:
            if not state.persistent:
                await self._forget()
                return Response.json(200, {"deleted": True})
            if self._container_up():
                await self._save_and_stop()
            elif state.state in ("running", "saving"):
                state.set_state(self._resting_state())
                self.schedule.clear_all()
                await self.schedule.arm(self.alarm_port)
        return await self._status()

    async def _op_delete(self, args: dict, body: Any) -> Response:
        self._require()
        async with self._lifecycle:
            await self._forget()
        return Response.json(200, {"deleted": True})

    # --- the alarm -----------------------------------------------------------------------------------------

    async def alarm(self) -> None:
        """Called by the runtime when the alarm fires (possibly late, possibly spuriously)."""
        async with self._lifecycle:
            if not self.state.exists:
                await self.alarm_port.clear()
                return
            try:
                now = self.clock.now_ms()
                due = self.schedule.due(now)
                if due:
                    await self._on_due(due, now)
            except Exception:
                # the alarm re-arms below; a state left mid-save goes back to running (the container was not
                # destroyed before the snapshot was recorded)
                log.exception("alarm of %s/%s failed", self.namespace, self.name)
                if self.state.state == "saving":
                    self.state.set_state("running")
                # never leave a past deadline behind: the alarm would fire again at once, forever
                later = self.clock.now_ms() + RETRY_FIRST_SECONDS * 1000
                for name, at in self.schedule.deadlines().items():
                    if at <= later:
                        self.schedule.set_at(name, later)
            finally:
                if self.state.exists:
                    await self.schedule.arm(self.alarm_port)

    async def _on_due(self, due: set[str], now: int) -> None:
        state = self.state
        if state.state != "running":
            self.schedule.clear_all()  # nothing runs, nothing to save
            return
        if not self.container.running():
            # the container died on its own; the next request restores or reports workspace_lost
            self.schedule.clear_all()
            if state.persistent:
                state.set_state(self._resting_state())
            else:
                await self._forget()
            return
        if due & {IDLE, RETRY}:
            if not (self._relays or self._transfers) and await supervisor.running_commands(self.container) == 0:
                await self._idle_end()
                return
            # a command is still running (or a stream still relayed): it keeps the workspace awake
            self.schedule.clear(RETRY)
            self.schedule.set_at(IDLE, now + self.settings.idle_seconds * 1000)
        if CHECKPOINT in due:
            try:
                await self._checkpoint()
            except Exception as exc:  # a failed checkpoint changes nothing; the next one comes on schedule
                log.warning("checkpoint of %s/%s failed: %s", self.namespace, self.name, exc)
            self.schedule.set_at(CHECKPOINT, now + self.settings.snapshot_interval_seconds * 1000)

    async def _idle_end(self) -> None:
        """Idle with nothing running: persistent → save and stop (retrying a failed save with backoff);
        ephemeral → forget."""
        state = self.state
        if not state.persistent:
            await self._forget()
            return
        try:
            await self._save_and_stop()
        except Exception as exc:  # any failed save: keep running, retry with backoff
            log.warning("saving %s/%s failed: %s", self.namespace, self.name, exc)
            self.schedule.clear(IDLE, RETRY)
            if self.container.running():
                delay_ms = self.schedule.next_retry_delay() * 1000
                self.schedule.set_at(RETRY, self.clock.now_ms() + delay_ms)
                if self.schedule.get(CHECKPOINT) is not None:  # the retry is the next snapshot attempt
                    self.schedule.set_at(CHECKPOINT, self.clock.now_ms() + delay_ms)
            else:
                state.set_state(self._resting_state())
                self.schedule.clear_all()
