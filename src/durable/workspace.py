"""The workspace object (one per namespace/workspace): config, lifecycle, container control, exec relay, alarms.

Runtime-neutral: it talks to its runtime only through the ports (durable/ports.py). Lifecycle operations (boot,
stop, snapshot, delete, the alarm's save) hold one lock, so they never interleave; concurrent requests that need
the container share one boot (durable/boot.py) and all see its outcome (`fresh`, `restored`, ...).
"""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from durable import operations as ops
from durable import retention, supervisor_client, terminal
from durable.backups import BackupBook
from durable.boot import BootOutcome, Listener, SharedBoot
from durable.launches import Launches
from durable.ledger import CANCELLED_EARLY, EXEC, Ledger
from durable.ports import (
    JSON_TYPE,
    Alarm,
    BackupInfo,
    BackupStore,
    Cipher,
    Clock,
    Container,
    ContainerGone,
    Response,
    SnapshotInfo,
    Socket,
    StartSpec,
    Storage,
    Streams,
)
from durable.relay import EventWriter, InFlight, relaying, stream_response
from durable.schedule import BACKUP, CHECKPOINT, IDLE, RETRY, RETRY_FIRST_SECONDS, Schedule
from durable.services import ServiceBook, describe
from durable.settings import Settings
from durable.state import BootMode, Lifecycle, WorkspaceState
from durable.store import Store
from durable.timefmt import iso_ms
from protocol import limits, proxy
from protocol.errors import ProtocolError
from protocol.events import error_event, started_event, status_event
from protocol.files import ListRequest, MkdirRequest, MoveRequest
from protocol.pty import PtyRequest
from protocol.services import service_from_json
from protocol.snapshots import LATEST
from protocol.validate import ExecRequest

log = logging.getLogger("flarebox.workspace")

_PASS_HEADERS = ("content-type", "content-length")
# Set while a boot loads an archive (an import, a backup) into a new container, until the loaded files are saved: a
# disk left behind by a runtime killed meanwhile is discarded, never restarted on (it holds a half-loaded tree).
_LOADING = "loading_archive"
# An idle push is skipped while the stored deadline already covers it (see _touch): at most one write a second, the
# deadline that much later than idle_seconds after the last activity, never earlier.
TOUCH_SLACK_MS = 1000


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
        cipher: Cipher,
        backups: BackupStore,
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
        self.services = ServiceBook(storage, cipher, namespace, name)
        self.backups = BackupBook(backups, store, namespace, name, settings.backup_interval_seconds)
        self._lifecycle = asyncio.Lock()
        self._boot = SharedBoot()
        self._launches = Launches()
        self._in_flight = InFlight()
        self.handlers: dict[ops.Operation, Callable[[Any, Any], Awaitable[Response]]] = {
            ops.GET: self._op_get,
            ops.PUT_CONFIG: self._op_put_config,
            ops.DELETE: self._op_delete,
            ops.EXEC: self._op_exec,
            ops.REATTACH: self._op_reattach,
            ops.CANCEL: self._op_cancel,
            ops.READ_FILE: self._op_read_file,
            ops.WRITE_FILE: self._op_write_file,
            ops.LIST_FILES: self._op_list_files,
            ops.STAT_FILE: self._op_stat_file,
            ops.DELETE_FILE: self._op_delete_file,
            ops.MOVE_FILE: self._op_move_file,
            ops.MAKE_DIR: self._op_make_dir,
            ops.GET_ARCHIVE: self._op_get_archive,
            ops.PUT_ARCHIVE: self._op_put_archive,
            ops.PROCESSES: self._op_processes,
            ops.SIGNAL_PROCESS: self._op_signal_process,
            ops.PTY: self._op_pty,
            ops.SNAPSHOT: self._op_snapshot,
            ops.SNAPSHOTS: self._op_snapshots,
            ops.PATCH_SNAPSHOT: self._op_patch_snapshot,
            ops.RESTORE: self._op_restore,
            ops.SHARE_SNAPSHOT: self._op_share_snapshot,
            ops.EXPORT: self._op_export,
            ops.IMPORT: self._op_import,
            ops.BACKUP: self._op_backup,
            ops.BACKUPS: self._op_backups,
            ops.STOP: self._op_stop,
            ops.PUT_SERVICE: self._op_put_service,
            ops.LIST_SERVICES: self._op_list_services,
            ops.DELETE_SERVICE: self._op_delete_service,
            ops.SERVICE_LOGS: self._op_service_logs,
            ops.PROXY: self._op_proxy,
            ops.PUT_SECRET: self._op_put_secret,
            ops.LIST_SECRETS: self._op_list_secrets,
            ops.DELETE_SECRET: self._op_delete_secret,
        }
        if store.added_expiry:  # snapshots recorded before they carried an expiry
            self.state.fill_expiries(self.container.snapshot_expiry)
        self._settle_stale_state()

    def _settle_stale_state(self) -> None:
        """A new object has nothing in flight, so a stored transitional state is left over from a runtime that
        stopped mid-operation: fall back to the state the operation started from; and a `running` whose container
        is gone (the server was killed) rests where it really is, so GET never says running of nothing."""
        state = self.state.state
        if state in (Lifecycle.STARTING, Lifecycle.RESTORING):
            self.state.set_state(Lifecycle.STOPPED if self.state.booted else Lifecycle.CREATED)
        elif state == Lifecycle.SAVING:
            self.state.set_state(Lifecycle.RUNNING)
        if self.state.state == Lifecycle.RUNNING and not self.container.running():
            self.state.set_state(self._resting_state_now())

    def _resting_state_now(self) -> Lifecycle:
        """_resting_state without asking the backup store (a constructor cannot wait): stopped while a backup
        may still bring it back — GET then says lost once the store says there is none (_status)."""
        now = self.clock.now_ms()
        comes_back = self.container.has_disk() or self.state.restore_to or self.state.newest_snapshot(now)
        return Lifecycle.STOPPED if comes_back or self.backups.available else Lifecycle.LOST

    # --- dispatch ------------------------------------------------------------------------------------------

    async def call(self, op: str, args: Any, body: Any = None) -> Response:
        """Run operation `op` with its typed arguments (durable/operations.py)."""
        handler = self.handlers.get(ops.OPERATIONS.get(op))
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
        return self.state.state in (Lifecycle.RUNNING, Lifecycle.SAVING) and self.container.running()

    async def _touch(self) -> None:
        """Activity: push the idle deadline. A new request also supersedes a pending save retry (the next idle
        deadline saves again).

        Coalesced, because activity comes fast (an exec touches twice, a proxied port may be asked a thousand times
        a second): the deadline is pushed TOUCH_SLACK_MS further than asked, and a touch that the stored deadline
        already covers (one less than TOUCH_SLACK_MS after the last one that wrote, with no save retry pending)
        writes nothing: one read instead of three writes and the alarm's, for every exec in a busy second. The idle
        deadline is thus never earlier than idle_seconds after any activity, and at most TOUCH_SLACK_MS later; only
        last_activity_at may lag by up to TOUCH_SLACK_MS."""
        now = self.clock.now_ms()
        idle_at = now + self.settings.idle_seconds * 1000
        deadlines = self.schedule.deadlines()  # a forgotten workspace has none: never skipped
        if RETRY not in deadlines and deadlines.get(IDLE, -1) >= idle_at:
            return
        idle_at += TOUCH_SLACK_MS
        if not self.state.exists:
            return
        self.state.touch(now)
        self.schedule.push_idle(idle_at)
        await self.schedule.arm(self.alarm_port)

    async def _status(self, http_status: int = 200) -> Response:
        now = self.clock.now_ms()
        if self.state.state == Lifecycle.STOPPED and await self._resting_state() == Lifecycle.LOST:
            self.state.set_state(Lifecycle.LOST)  # its last snapshot expired: say so now, not at the next boot
        running = self._container_up()
        busy = running and await supervisor_client.running_commands(self.container) > 0
        status = self.state.status_object(self.namespace, self.name, running=running, busy=busy, now_ms=now)
        return Response.json(http_status, status)

    # --- config and status ---------------------------------------------------------------------------------

    async def _op_put_config(self, args: ops.PutConfigArgs, body: Any) -> Response:
        config = args.config.to_json()
        if not self.state.exists:
            adopted = await self.container.adopt_snapshot(args.fork) if args.fork is not None else None
            now = self.clock.now_ms()
            self.state.create(config, now)
            if adopted is not None:  # a fork: its first boot restores the source's snapshot
                self.state.add_snapshot(replace(adopted, label=None, kept=False))
                self.state.set_restore_to({"snapshot": adopted.id})
                self.state.rest(now)
            return await self._status(201)
        if self.state.config != config:
            raise ProtocolError("config_conflict", f"the workspace exists with config {json.dumps(self.state.config)}")
        return await self._status(200)

    async def _op_get(self, args: ops.NoArgs, body: Any) -> Response:
        self._require()
        return await self._status()

    async def _op_snapshots(self, args: ops.NoArgs, body: Any) -> Response:
        state = self._require()
        live = state.live_snapshots(self.clock.now_ms())  # an expired snapshot is gone: never listed
        return Response.json(200, {"snapshots": [s.to_wire() for s in live]})

    async def _op_patch_snapshot(self, args: ops.PatchSnapshotArgs, body: Any) -> Response:
        self._require()
        snap = self._live_snapshot(args.snapshot_id)
        label = args.label if args.set_label else snap.label
        return Response.json(200, self._mark(snap, label, snap.kept if args.keep is None else args.keep).to_wire())

    def _live_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        now = self.clock.now_ms()
        if snapshot_id == LATEST:
            snap = self.state.newest_snapshot(now)
        else:
            snap = self.state.live_snapshot(snapshot_id, now)
        if snap is None:
            raise ProtocolError("snapshot_not_found")
        return snap

    def _mark(self, snap: SnapshotInfo, label: str | None, kept: bool) -> SnapshotInfo:
        """Give a recorded snapshot its label and pin; too_many_kept when pinning one more than MAX_KEPT_SNAPSHOTS."""
        if kept and not snap.kept:
            self._room_to_keep()
        marked = replace(snap, label=label, kept=kept)
        if marked != snap:
            self.state.add_snapshot(marked)
        return marked

    def _room_to_keep(self) -> None:
        limit = self.settings.max_kept_snapshots
        if self.state.kept_count(self.clock.now_ms()) >= limit:
            raise ProtocolError(
                "too_many_kept",
                f"the workspace already keeps {limit} snapshots (MAX_KEPT_SNAPSHOTS): unpin one with"
                ' PATCH …/snapshots/{id} {"keep": false} first',
            )

    # --- boot ----------------------------------------------------------------------------------------------

    async def _ensure_running(self, listener: Listener | None = None) -> BootOutcome:
        """Make the container run, sharing one boot between concurrent callers; `listener` gets its status events."""
        if self._already_running():
            return BootOutcome(BootMode.CONTINUING)
        if not self._boot.in_progress:
            self._boot.start(self._boot_once)
        return await self._boot.join(listener)

    def _already_running(self) -> bool:
        """Running, with no boot or lifecycle change under way: a request may go straight to the container."""
        return (
            not self._boot.in_progress
            and self._container_up()
            and self.state.state == Lifecycle.RUNNING
            and not self._lifecycle.locked()
        )

    async def _boot_once(self) -> BootOutcome:
        async with self._lifecycle:
            return await self._boot_locked()

    async def _boot_locked(
        self, *, blank: bool = False, load: Callable[[], Awaitable[Any]] | None = None
    ) -> BootOutcome:
        """Boot the container. `blank` (an import, which replaces every file): a new container from the image
        whatever the workspace held, `load` run in it before it counts as booted — a failure there ends the boot
        like any other, so the workspace rests where it was and its snapshots stay as they were."""
        state = self._require()
        config = state.config
        if state.state == Lifecycle.RUNNING and self.container.running():
            return BootOutcome(BootMode.CONTINUING)
        if self._store.get(_LOADING):
            if self.container.has_disk():
                # a runtime killed while an archive was loaded left a disk that is neither the old files nor the new
                await self._destroy_quietly()
            self._store.delete(_LOADING)
        snapshot: SnapshotInfo | None = None
        backup: str | None = None  # a backup's id: a new container, then the backup imported into it
        if blank or not state.booted:
            mode, phase = BootMode.FRESH, Lifecycle.STARTING
            message = "starting a new container for the import" if blank else "starting a new container"
        elif self.container.has_disk():
            mode, phase = BootMode.RESTARTED, Lifecycle.STARTING
            message = "restarting the container on its surviving disk"
        else:
            point = await self._restore_point(self.clock.now_ms())
            if point is None:
                state.set_state(Lifecycle.LOST)
                self.schedule.clear_all()
                await self.schedule.arm(self.alarm_port)
                raise self._lost()
            mode, phase = BootMode.RESTORED, Lifecycle.RESTORING
            if isinstance(point, SnapshotInfo):
                snapshot, message = point, f"restoring snapshot {point.id}"
            else:
                chosen = "backup" in (state.restore_to or {})  # a rollback to it, or every snapshot expired
                backup, message = point, f"restoring backup {point}" + ("" if chosen else " (every snapshot expired)")
        fallback = Lifecycle.STOPPED if state.booted else Lifecycle.CREATED
        if state.state == Lifecycle.RUNNING:  # a crash noticed now: the state machine passes through stopped
            state.set_state(Lifecycle.STOPPED)
        state.set_state(phase)
        await self._boot.emit(status_event(phase, message))
        spec = StartSpec(
            image=config["image"],
            instance=config["instance"] or self.settings.default_instance_type,
            env={},  # nothing secret ever enters the container
            enable_internet=self.settings.enable_internet,
            snapshot_id=snapshot.id if snapshot else None,
        )
        restore_at = self.clock.now_ms()  # the platform restores no earlier: a renewed life counted from here
        restored_backup: BackupInfo | None = None
        if backup is not None or load is not None:
            self._store.put(_LOADING, True)  # until the loaded files are saved (or the boot failed)
        try:
            await self.container.start(spec)
            await supervisor_client.wait_ready(self.container, self.clock)
            if mode == BootMode.FRESH and config["cwd"] != limits.DEFAULT_CWD:  # the image has /workspace
                await supervisor_client.make_dir(self.container, config["cwd"])
            if backup is not None:
                restored_backup = await self.backups.load_into(self.container, backup)
            if load is not None:
                await load()
            await self.services.start_all(self.container, config["cwd"])  # processes never survive a boot
        except BaseException as exc:
            if state.state == phase:
                state.set_state(fallback)
            damaged = isinstance(exc, ProtocolError) and exc.code == "snapshot_damaged"
            if mode != BootMode.RESTARTED and not damaged:
                await self._destroy_quietly()  # a half-started container must not linger
                self._store.delete(_LOADING)
            raise
        if snapshot is not None:
            snapshot = self._renewed(snapshot, restore_at)
        state.mark_booted()
        state.set_state(Lifecycle.RUNNING)
        if restored_backup is not None and state.persistent:
            await self._save_quietly()  # its files are a snapshot again at once: the next stop need not wait
        if state.persistent and self.settings.snapshot_interval_seconds > 0:
            self.schedule.set_at(CHECKPOINT, self.clock.now_ms() + self.settings.snapshot_interval_seconds * 1000)
        if state.persistent and self.backups.available and self.settings.backup_interval_seconds > 0:
            self.schedule.set_at(BACKUP, self.clock.now_ms() + self.settings.backup_interval_seconds * 1000)
        await self.schedule.arm(self.alarm_port)
        await self._boot.emit(status_event("ready"))
        return BootOutcome(mode, snapshot, restored_backup)

    async def _save_quietly(self) -> None:
        try:
            await self._checkpoint()
        except Exception as exc:
            log.warning("saving %s/%s after restoring a backup failed: %s", self.namespace, self.name, exc)

    async def _restore_point(self, now_ms: int) -> SnapshotInfo | str | None:
        """What a boot restores when the workspace booted before and no disk survived: the point a rollback chose,
        else the newest snapshot that has not expired, else (every snapshot expired) the newest backup's id. None:
        nothing to come back from (workspace_lost). A backup store that cannot answer raises: never `lost` for an
        outage."""
        chosen = self.state.restore_to or {}
        if "backup" in chosen:
            return chosen["backup"]
        if "snapshot" in chosen:
            picked = self.state.live_snapshot(chosen["snapshot"], now_ms)
            if picked is not None:
                return picked
        newest = self.state.newest_snapshot(now_ms)
        if newest is not None:
            return newest
        backup = await self.backups.newest()
        return backup.id if backup is not None else None

    def _lost(self) -> ProtocolError:
        """workspace_lost, saying why when snapshots were taken but all of them expired."""
        expiries = [s.expires_at_ms for s in self.state.snapshots() if s.expires_at_ms is not None]
        if not expiries:
            return ProtocolError("workspace_lost")
        return ProtocolError(
            "workspace_lost",
            f"the workspace booted before and its last snapshot expired at {iso_ms(max(expiries))} (the platform"
            " keeps a snapshot only so long after it was made or last restored): there is nothing to come back from",
        )

    def _renewed(self, snapshot: SnapshotInfo, restored_at_ms: int) -> SnapshotInfo:
        """A restored snapshot lives on from its restore where the platform counts so (Cloudflare): record that."""
        renewed = replace(snapshot, expires_at_ms=self.container.snapshot_expiry(restored_at_ms))
        if renewed != snapshot:
            self.state.add_snapshot(renewed)
        return renewed

    async def _destroy_quietly(self) -> None:
        try:
            await self.container.destroy()
        except Exception:
            log.warning("destroying the container of %s/%s failed", self.namespace, self.name, exc_info=True)

    # --- exec, reattach, cancel ----------------------------------------------------------------------------

    def _stream(self, relay: Callable[[EventWriter], Awaitable[None]]) -> Response:
        return stream_response(self.streams, self.clock, relay)

    async def _finish(self, writer: EventWriter, event: dict) -> None:
        await writer.event(event)
        await writer.close()

    async def _op_exec(self, args: ops.ExecArgs, body: Any) -> Response:
        self._require()
        request = args.request  # validated at the edge (and again by the supervisor)
        rid = request.request_id
        if self.ledger.lookup(rid) in (EXEC, CANCELLED_EARLY):
            raise ProtocolError("duplicate_request")
        self.services.require_secrets(request.secrets)  # before the id is recorded: a refused exec never ran
        if self.ledger.record_exec(rid) == CANCELLED_EARLY:
            return self._stream(lambda writer: self._finish(writer, error_event("command_cancelled")))
        self._launches.begin(rid)
        try:
            await self._touch()
        except Exception:  # the id is recorded: from here on the command must run, idle push or not
            log.warning("idle push before exec %s failed", rid, exc_info=True)
        return self._stream(lambda writer: self._run_exec(writer, request))

    async def _run_exec(self, writer: EventWriter, request: ExecRequest) -> None:
        rid = request.request_id
        try:
            async with relaying(writer, self._in_flight, f"exec {rid} on {self.namespace}/{self.name}"):
                await self._launch(writer, request)
        finally:
            self._launches.hand_over(rid)
            await writer.close()
            try:
                await self._touch()  # the end of a command is activity too
            except Exception:  # the workspace may have been deleted (and its storage closed) meanwhile
                log.debug("no idle push after exec %s", rid, exc_info=True)

    async def _launch(self, writer: EventWriter, request: ExecRequest) -> None:
        """Boot if needed, hand the request to the supervisor, relay its stream."""
        rid = request.request_id
        if self._already_running():  # nothing to wait for: no heartbeat task to start and cancel
            boot = BootOutcome(BootMode.CONTINUING)
        else:
            writer.start_heartbeat()
            try:
                boot = await self._ensure_running(writer.event)
            finally:
                await writer.stop_heartbeat()
        if self._launches.cancelled(rid):
            raise ProtocolError("command_cancelled")
        snapshot = boot.snapshot.to_wire() if boot.snapshot is not None else None
        backup = boot.backup.to_wire() if boot.backup is not None else None
        await writer.event(started_event(rid, boot.container, snapshot, backup))
        env = {**request.env, **await self.services.open_secrets(request.secrets)}
        payload = {**request.to_json(), "cwd": request.cwd or self.state.config["cwd"], "env": env, "secrets": []}
        resp = await self.container.fetch(
            "POST", "/exec", body=json.dumps(payload).encode(), headers={"content-type": JSON_TYPE}
        )
        self._launches.hand_over(rid)
        if resp.status != 200:
            raise await supervisor_client.error_of(resp)
        await writer.pipe(resp.body)

    async def _op_reattach(self, args: ops.ReattachArgs, body: Any) -> Response:
        self._require()
        rid = args.request_id
        # an exec still booting has not reached the supervisor yet
        await self._launches.wait_handed_over(rid, self.clock)
        await self._touch()
        if self.ledger.lookup(rid) == CANCELLED_EARLY:  # it never reached a supervisor: its stream ended with this
            return self._stream(lambda writer: self._finish(writer, error_event("command_cancelled")))
        if self._container_up():
            try:
                resp = await self.container.fetch("GET", f"/exec/{rid}?{supervisor_client.query(offset=args.offset)}")
            except ContainerGone:
                resp = None
            if resp is not None:
                if resp.status != 200:
                    raise await supervisor_client.error_of(resp, fallback="request_not_found")
                return self._stream(lambda writer: self._pipe(writer, resp.body))
        if self.ledger.lookup(rid) == EXEC:
            message = "the container stopped; the command's outcome is unknown"
            return self._stream(lambda writer: self._finish(writer, error_event("container_exited", message)))
        raise ProtocolError("request_not_found")

    async def _pipe(self, writer: EventWriter, body: Any) -> None:
        try:
            async with relaying(writer, self._in_flight, f"reattach relay on {self.namespace}/{self.name}"):
                await writer.pipe(body)
        finally:
            await writer.close()

    async def _op_cancel(self, args: ops.CancelArgs, body: Any) -> Response:
        self._require()
        rid = args.request_id
        if rid in self._launches:
            self._launches.cancel(rid)  # checked before the exec is handed to the supervisor
            await self._forward_cancel(rid)  # and in case the hand-over is under way right now
            state = "cancelled"
        elif self.ledger.lookup(rid) == EXEC:
            # handed over already (or ended before it could be): a supervisor that never saw it means it is over
            forwarded = await self._forward_cancel(rid)
            state = "cancelled" if forwarded == "cancelled" else "finished"
        elif self.ledger.lookup(rid) == CANCELLED_EARLY:
            state = "finished"  # it ended (command_cancelled) without running
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

    async def _op_read_file(self, args: ops.ReadFileArgs, body: Any) -> Response:
        q = supervisor_client.query(path=args.path, max_bytes=self.settings.max_file_read_bytes)
        return await self._transfer("GET", f"/files?{q}")

    async def _op_write_file(self, args: ops.WriteFileArgs, body: Any) -> Response:
        q = supervisor_client.query(
            path=args.path, mode=f"{args.mode:04o}", max_bytes=self.settings.max_file_write_bytes
        )
        headers = {"content-length": str(args.length), "content-type": "application/octet-stream"}
        return await self._transfer("PUT", f"/files?{q}", body=body, headers=headers)

    async def _transfer(self, method: str, target: str, **fetch: Any) -> Response:
        """The supervisor's answer (the file, or its error) passed through: status, body stream, describing headers."""
        self._require()
        with self._in_flight:  # a transfer slower than IDLE_SECONDS must not have its container stopped under it
            await self._ensure_running()
            await self._touch()
            resp = await self.container.fetch(method, target, **fetch)
        return Response(resp.status, resp.body, {k: v for k, v in resp.headers.items() if k.lower() in _PASS_HEADERS})

    async def _op_list_files(self, args: ListRequest, body: Any) -> Response:
        return await self._supervised(args)

    async def _op_stat_file(self, args: ops.StatArgs, body: Any) -> Response:
        return await self._supervised(args)

    async def _op_delete_file(self, args: ops.DeleteFileArgs, body: Any) -> Response:
        return await self._supervised(args)

    async def _op_move_file(self, args: MoveRequest, body: Any) -> Response:
        return await self._supervised(args)

    async def _op_make_dir(self, args: MkdirRequest, body: Any) -> Response:
        return await self._supervised(args)

    async def _supervised(self, args: Any) -> Response:
        """One supervisor request as the sandbox user, its answer passed through (the workspace boots first where
        it sleeps, like a file read)."""
        method, target, data = supervisor_client.tree_request(args)
        headers = {"content-type": JSON_TYPE} if data is not None else None
        timeout = supervisor_client.TREE_SILENCE_SECONDS
        return await self._transfer(method, target, body=data, headers=headers, timeout=timeout)

    async def _op_get_archive(self, args: ops.ArchiveArgs, body: Any) -> Response:
        """A directory as a tar.zst, streamed; work in flight until its last byte (like an export)."""
        self._require()

        async def upstream() -> Any:
            await self._ensure_running()
            await self._touch()
            return await supervisor_client.dir_archive(self.container, args.path)

        _, readable = await self._relayed(upstream)
        name = args.path.rstrip("/").rpartition("/")[2] or "root"
        headers = {"content-type": supervisor_client.ARCHIVE_TYPE, "content-disposition": _attachment(name)}
        return Response(200, readable, headers)

    async def _op_put_archive(self, args: ops.ArchiveArgs, body: Any) -> Response:
        q = supervisor_client.query(path=args.path)
        headers = {"content-type": supervisor_client.ARCHIVE_TYPE}
        if args.length is not None:
            headers["content-length"] = str(args.length)
        timeout = supervisor_client.IMPORT_SILENCE_SECONDS
        return await self._transfer("PUT", f"/files/archive?{q}", body=body, headers=headers, timeout=timeout)

    # --- processes -----------------------------------------------------------------------------------------

    async def _op_processes(self, args: ops.NoArgs, body: Any) -> Response:
        """What runs in the workspace. A sleeping one runs nothing: answered without waking it."""
        self._require()
        if not self._container_up():
            return Response.json(200, {"commands": [], "processes": [], "truncated": False})
        resp = await self.container.fetch("GET", "/processes")
        return Response(resp.status, resp.body, {k: v for k, v in resp.headers.items() if k.lower() in _PASS_HEADERS})

    async def _op_signal_process(self, args: ops.SignalArgs, body: Any) -> Response:
        self._require()
        if not self._container_up():
            raise ProtocolError("process_not_found", "the workspace is not running, so no process runs in it")
        return await self._supervised(args)

    # --- terminals -----------------------------------------------------------------------------------------

    async def _op_pty(self, args: PtyRequest, client: Socket) -> Response:
        """Answer the upgrade, then run the session in the background (durable/terminal.py): 101 returns at once,
        so the runtime can hand the client its socket while the boot reports progress in it."""
        self._require()
        await client.accept()
        self.clock.spawn(self._terminal(args, client))
        return Response(101, None)

    async def _terminal(self, args: PtyRequest, client: Socket) -> None:
        """A connected terminal is work in flight (a person is at it): the idle save never stops the container
        under it. Once the client leaves, its session lingers in the supervisor without keeping anything awake."""
        with self._in_flight:

            async def connect() -> Socket:
                q = supervisor_client.query(session=args.session, cols=args.cols, rows=args.rows, offset=args.offset)
                return await self.container.connect(f"/pty?{q}")

            try:
                await terminal.run(client, self._ensure_running, connect)
            finally:
                try:
                    await self._touch()
                except Exception:
                    log.debug("no idle push after a terminal session", exc_info=True)

    # --- services and secrets ------------------------------------------------------------------------------

    async def _op_put_service(self, args: ops.PutServiceArgs, body: Any) -> Response:
        self._require()
        spec = service_from_json(args.spec)
        new = self.services.define(args.name, spec, self.clock.now_ms())
        runtime = None
        if self._container_up():  # a sleeping workspace starts it at its next boot
            runtime = await self.services.start(self.container, args.name, spec, self.state.config["cwd"])
        await self._touch()
        return Response.json(201 if new else 200, describe(args.name, spec, runtime))

    async def _op_list_services(self, args: ops.NoArgs, body: Any) -> Response:
        self._require()
        runtime = await self.services.runtime(self.container if self._container_up() else None)
        listed = [describe(name, spec, runtime.get(name)) for name, spec in self.services.specs().items()]
        return Response.json(200, {"services": listed})

    async def _op_delete_service(self, args: ops.ServiceArgs, body: Any) -> Response:
        self._require()
        self.services.remove(args.name)
        if self._container_up():
            await self.services.stop(self.container, args.name)
        return Response.json(200, {"name": args.name, "deleted": True})

    async def _op_service_logs(self, args: ops.ServiceLogsArgs, body: Any) -> Response:
        self._require()
        self.services.spec(args.name)  # service_not_found
        if not self._container_up():
            # logs live with the processes: a sleeping workspace has none to show
            end = {"type": "service", "state": "stopped", "restarts": 0, "last_exit": None}
            return self._stream(lambda writer: self._finish(writer, end))
        resp = await self.services.logs(self.container, args.name, args.offset)
        return self._stream(lambda writer: self._follow_log(writer, resp.body))

    async def _follow_log(self, writer: EventWriter, body: Any) -> None:
        """Relay a service's log. Not work in flight: someone reading a log is not a request to the service, so it
        never keeps the workspace awake (its stream ends when the idle save stops the container)."""
        try:
            await writer.pipe(body)
        except ContainerGone:
            pass  # the container stopped: there is no more log to follow
        except Exception:
            log.debug("a service log stream ended early", exc_info=True)
        finally:
            await writer.close()

    async def _op_put_secret(self, args: ops.PutSecretArgs, body: Any) -> Response:
        self._require()
        new = await self.services.put_secret(args.name, args.value, self.clock.now_ms())
        secret = next(s for s in self.services.secrets() if s["name"] == args.name)
        return Response.json(201 if new else 200, secret)

    async def _op_list_secrets(self, args: ops.NoArgs, body: Any) -> Response:
        self._require()
        return Response.json(200, {"secrets": self.services.secrets()})

    async def _op_delete_secret(self, args: ops.SecretArgs, body: Any) -> Response:
        self._require()
        self.services.delete_secret(args.name)
        return Response.json(200, {"name": args.name, "deleted": True})

    # --- the port proxy ------------------------------------------------------------------------------------

    async def _op_proxy(self, args: ops.ProxyArgs, body: Any) -> Response:
        """Forward one HTTP request to a port inside the workspace, waking it first. The request counts as work in
        flight (the idle alarm never stops the container under it) until the answer's last byte."""
        self._require()
        if args.service is not None:
            name, spec = args.service, self.services.spec(args.service)
        else:
            found = self.services.by_port(args.port)
            name, spec = found if found is not None else (None, None)
        if spec is not None and not proxy.path_allowed(args.path, spec.allow_paths):
            raise ProtocolError("path_not_allowed", f"service {name!r} allows only {', '.join(spec.allow_paths)}")
        port = spec.port if spec is not None else args.port
        target = proxy.encode_path(args.path) + (f"?{args.query}" if args.query else "")
        headers = args.headers
        if spec is not None and spec.bearer_secret is not None:  # the service's own key, never the caller's
            opened = await self.services.open_secrets((spec.bearer_secret,))
            if spec.bearer_secret in opened:
                headers = {**headers, "authorization": f"Bearer {opened[spec.bearer_secret]}"}

        async def upstream() -> Any:
            boot = await self._ensure_running()
            await self._touch()
            if spec is not None and boot.container != BootMode.CONTINUING:
                await self.services.ready(self.container, name)  # just started: let it come up first
            return await self.container.fetch_port(port, args.method, target, body=body, headers=headers)

        resp, readable = await self._relayed(upstream)
        return Response(resp.status, readable, header_pairs=proxy.response_headers(resp.header_pairs))

    async def _relayed(self, upstream: Callable[[], Awaitable[Any]]) -> tuple[Any, Any]:
        """Open a streamed answer from the container (`upstream` boots first where it must) and relay its body in
        the background. Work in flight from the start to the answer's last byte (or the client leaving): the idle
        alarm never stops the container under it. Returns the answer and the stream for the client."""
        self._in_flight.__enter__()
        try:
            resp = await upstream()
            sink = self.streams.open()
        except BaseException:
            self._in_flight.__exit__(None, None, None)
            raise
        self.clock.spawn(self._relay_answer(sink, resp))  # which leaves the in-flight count
        return resp, sink.readable

    async def _relay_answer(self, sink: Any, resp: Any) -> None:
        """Relay a streamed answer; holds the in-flight count _relayed took, until the last byte or the client left."""
        try:
            try:
                if resp.body is not None:
                    await sink.pipe_from(resp.body)
            except ContainerGone:
                await sink.abort()  # broken upstream: the client must not see a complete body
                return
            except Exception:
                log.debug("a proxied answer ended early", exc_info=True)
                await sink.abort()
                return
            await sink.close()
        finally:
            self._in_flight.__exit__(None, None, None)
            try:
                await self._touch()
            except Exception:
                log.debug("no idle push after a proxied request", exc_info=True)

    # --- snapshots, stop, delete ---------------------------------------------------------------------------

    async def _checkpoint(
        self, label: str | None = None, keep: bool = False, protect: str | None = None
    ) -> SnapshotInfo:
        """A snapshot that keeps the container running (POST …/snapshot, periodic checkpoints): `saving` while
        it is written. Caller holds the lifecycle lock."""
        self.state.set_state(Lifecycle.SAVING)
        try:
            return await self._take_snapshot(label, keep, protect)
        finally:
            self.state.set_state(Lifecycle.RUNNING)

    async def _take_snapshot(
        self, label: str | None = None, keep: bool = False, protect: str | None = None
    ) -> SnapshotInfo:
        """Snapshot the running container, record it with its label and pin, and apply retention (never to
        `protect`: a rollback's target). Caller holds the lifecycle lock."""
        if keep:
            self._room_to_keep()  # before the save: a refused pin costs nothing
        await supervisor_client.sync(self.container)
        info = replace(await self.container.snapshot(), label=label, kept=keep)
        self.state.add_snapshot(info)
        # a rollback's point is superseded (these files are newer), and loaded files are a snapshot now (a surviving
        # disk may be restarted on): cleared only where set, so a plain save writes nothing more
        if self.state.restore_to is not None:
            self.state.set_restore_to(None)
        if self._store.get(_LOADING):
            self._store.delete(_LOADING)
        await self._apply_retention(protect)
        return info

    async def _apply_retention(self, protect: str | None = None) -> None:
        doomed = [s for s in retention.drop(self.state.snapshots(), self.clock.now_ms()) if s.id != protect]
        for snap in doomed:
            try:
                await self.container.delete_snapshot(snap.id)
            except Exception:
                log.warning("dropping snapshot %s failed; kept for now", snap.id, exc_info=True)
                continue
            self.state.remove_snapshot(snap.id)

    async def _op_snapshot(self, args: ops.SnapshotArgs, body: Any) -> Response:
        return Response.json(200, (await self._save_now(args.label, args.keep)).to_wire())

    async def _save_now(self, label: str | None = None, keep: bool = False) -> SnapshotInfo:
        """Save now. A stop, delete or idle save may take the lifecycle lock between this request's boot and its
        own turn: what it left decides the answer (its snapshot, 404), never container_exited for a container
        stopped on purpose. A label or pin asked of a workspace at rest goes to the snapshot its files are."""
        resting = await self._snapshot_without_saving()
        if resting is not None:
            return self._mark(resting, label or resting.label, keep or resting.kept)
        if not self._container_up():
            await self._ensure_running()
        async with self._lifecycle:
            resting = await self._snapshot_without_saving()  # again: whatever ran while this request waited
            if resting is not None:
                return self._mark(resting, label or resting.label, keep or resting.kept)
            if not self._container_up():
                raise ProtocolError("container_exited")  # it died on its own since the boot: nothing was saved
            return await self._checkpoint(label, keep)

    async def _snapshot_without_saving(self) -> SnapshotInfo | None:
        """The answer of POST …/snapshot that needs no save, or None when the container's files must be saved (its
        container booted first if it does not run). Raises workspace_not_found, not_persistent, nothing_to_snapshot
        (it never ran: its files are the image's, and booting a container only to save them would cost a boot and a
        snapshot for nothing) and workspace_lost. A workspace at rest whose files are exactly its newest snapshot
        (stopped — by a stop that just ran, too — or its container's disk died) answers that snapshot."""
        state = self._require()
        if not state.persistent:
            raise ProtocolError("not_persistent")
        if not state.booted:
            raise ProtocolError("nothing_to_snapshot")
        if state.state == Lifecycle.LOST:
            raise self._lost()
        if self._container_up() or self.container.has_disk():
            return None
        point = await self._restore_point(self.clock.now_ms())
        return point if isinstance(point, SnapshotInfo) else None  # None: a boot restores or answers workspace_lost

    async def _resting_state(self) -> Lifecycle:
        """Where a workspace whose container is gone rests: stopped if it can come back, else lost (never for a
        backup store that could not say: the next boot asks it again)."""
        try:
            if self.container.has_disk() or await self._restore_point(self.clock.now_ms()) is not None:
                return Lifecycle.STOPPED
        except Exception:
            log.warning("the backup store of %s/%s did not answer", self.namespace, self.name, exc_info=True)
            return Lifecycle.STOPPED
        return Lifecycle.LOST

    async def _save_and_stop(self) -> None:
        """Persistent workspaces: snapshot, then destroy. On a failed snapshot the container keeps running and
        the error propagates. Caller holds the lifecycle lock."""
        state = self.state
        await self._backup_if_due()
        state.set_state(Lifecycle.SAVING)
        try:
            await self._take_snapshot()
        except BaseException:
            state.set_state(Lifecycle.RUNNING)
            raise
        await self._destroy_quietly()  # the snapshot is recorded: from here on the workspace is stopped
        state.set_state(Lifecycle.STOPPED)
        self.schedule.clear_all()
        self.schedule.reset_retry()
        await self.schedule.arm(self.alarm_port)

    async def _forget(self) -> None:
        """Ephemeral end of life / delete: no container, no snapshots, no record, no alarm."""
        await self._destroy_quietly()
        for snap in self.state.snapshots():
            try:
                await self.container.delete_snapshot(snap.id)
            except Exception:
                log.warning("deleting snapshot %s failed", snap.id, exc_info=True)
        await self.backups.delete_all()
        self._store.wipe()
        self.services.wipe()
        await self.alarm_port.clear()
        self._launches.clear()

    async def _op_stop(self, args: ops.NoArgs, body: Any) -> Response:
        state = self._require()
        async with self._lifecycle:
            if not state.persistent:
                await self._forget()
                return Response.json(200, {"deleted": True})
            if self._container_up():
                await self._save_and_stop()
            elif state.state in (Lifecycle.RUNNING, Lifecycle.SAVING):
                state.set_state(await self._resting_state())
                self.schedule.clear_all()
                await self.schedule.arm(self.alarm_port)
        return await self._status()

    async def _op_delete(self, args: ops.NoArgs, body: Any) -> Response:
        self._require()
        async with self._lifecycle:
            await self._forget()
        return Response.json(200, {"deleted": True})

    # --- rollback, forks, export and import, backups -------------------------------------------------------

    async def _op_restore(self, args: ops.RestoreArgs, body: Any) -> Response:
        """Make a snapshot (or a backup) the workspace's next start. A running container stops (its processes
        end); its unsaved files are snapshotted first unless the caller discards them. Waits for a save under way
        (the lifecycle lock)."""
        state = self._require()
        async with self._lifecycle:
            if args.backup is not None:
                self.backups.require()
                target: dict[str, Any] = {"backup": (await self.backups.find(args.backup)).to_wire()}
                point = {"backup": args.backup}
            else:
                snap = self._live_snapshot(args.snapshot or LATEST)
                target, point = {"snapshot": snap.to_wire()}, {"snapshot": snap.id}
            safety = None
            unsaved = self._container_up() or self.container.has_disk()
            if unsaved and not args.discard_changes:
                if not state.persistent:
                    raise ProtocolError("not_persistent")
                safety = await self._save_before_restore(point.get("snapshot"))
            if unsaved:
                await self._destroy_quietly()
            state.set_restore_to(point)
            if state.state in (Lifecycle.RUNNING, Lifecycle.SAVING):
                state.set_state(Lifecycle.STOPPED)
            state.rest(self.clock.now_ms())
            self.schedule.clear_all()
            await self.schedule.arm(self.alarm_port)
        answer = {**target, "safety_snapshot": safety.to_wire() if safety is not None else None}
        return Response.json(200, {**answer, "state": Lifecycle.STOPPED})

    async def _save_before_restore(self, keep_id: str | None) -> SnapshotInfo:
        """The safety snapshot of a rollback: the files as they are, labelled so a person finds them; the rollback's
        target is protected from the retention this save applies."""
        label = "before restore"
        if self.container.running():
            return await self._checkpoint(label, protect=keep_id)
        info = replace(await self.container.snapshot(), label=label)  # a crashed sandbox's surviving disk
        self.state.add_snapshot(info)
        return info

    async def _op_share_snapshot(self, args: ops.ShareArgs, body: Any) -> Response:
        """A fork's first step, asked by the edge of the source: a snapshot (None: its files now, saved if it runs)
        and a reference the new workspace adopts. The source is otherwise untouched."""
        state = self._require()
        if not state.persistent:
            raise ProtocolError("not_persistent", "only a persistent workspace has snapshots to fork from")
        snap = await self._save_now() if args.snapshot is None else self._live_snapshot(args.snapshot)
        ref = await self.container.snapshot_ref(snap.id)
        return Response.json(200, {"snapshot": snap.to_wire(), "ref": ref, "image": state.config["image"]})

    async def _op_export(self, args: ops.NoArgs, body: Any) -> Response:
        """The workspace's files as a portable tar.zst (docs/protocol.md, "Export archives"), streamed from the
        running container — booted first if it sleeps, so a stopped workspace exports its newest snapshot. Work
        in flight until the last byte: the idle save never stops the container under it."""
        self._require()

        async def upstream() -> Any:
            await self._ensure_running()
            await self._touch()
            return await supervisor_client.export_archive(self.container)

        _, readable = await self._relayed(upstream)
        disposition = _attachment(f"{self.namespace}-{self.name}")
        headers = {"content-type": "application/zstd", "content-disposition": disposition}
        return Response(200, readable, headers)

    async def _op_import(self, args: ops.ImportArgs, body: Any) -> Response:
        """Replace every file with an export's: into a new container, verified by the supervisor while it extracts
        (a damaged archive changes nothing: the new container is discarded, the snapshots stay), then saved at once
        when the workspace is persistent. Only a workspace at rest: an import under running processes would pull
        their files away."""
        state = self._require()
        async with self._lifecycle:
            if self._container_up():
                raise ProtocolError("workspace_running")
            if state.booted and self.container.has_disk():
                raise ProtocolError(
                    "workspace_running",
                    "the workspace's disk survived a crash with files no snapshot holds: run any command (it restarts"
                    " on them), POST …/stop to save them, then import",
                )
            result: dict[str, Any] = {}

            async def load() -> None:
                result.update(await supervisor_client.import_archive(self.container, body, args.length))

            await self._boot_locked(blank=True, load=load)
            saved = await self._checkpoint() if state.persistent else None
            await self._touch()
        return Response.json(200, {**result, "snapshot": saved.to_wire() if saved is not None else None})

    async def _op_backup(self, args: ops.NoArgs, body: Any) -> Response:
        """Write a backup now (the container booted first if it sleeps). A full or missing store answers
        backup_failed and the workspace keeps running."""
        state = self._require()
        self.backups.require()
        if not state.persistent:
            raise ProtocolError("not_persistent", "backups are of persistent workspaces")
        if not state.booted:
            raise ProtocolError("nothing_to_snapshot", "nothing to back up yet: the workspace has never run")
        with self._in_flight:
            await self._ensure_running()
            info = await self.backups.write(self.container, self.clock.now_ms())
        return Response.json(200, info.to_wire())

    async def _op_backups(self, args: ops.NoArgs, body: Any) -> Response:
        self._require()
        self.backups.require()
        return Response.json(200, {"backups": [b.to_wire() for b in await self.backups.list()]})

    async def _backup_if_due(self) -> None:
        """A scheduled backup (BACKUP_INTERVAL_SECONDS) of the running container, before an idle save stops it or
        when its deadline comes. A failure is logged and changes nothing else: the save goes on."""
        if not self.state.persistent or not self.backups.due(self.clock.now_ms()):
            return
        if not self.container.running():
            return
        try:
            await self.backups.write(self.container, self.clock.now_ms())
        except Exception as exc:
            log.warning("backup of %s/%s failed: %s", self.namespace, self.name, exc)

    # --- the alarm -----------------------------------------------------------------------------------------

    async def alarm(self) -> None:
        """Called by the runtime when the alarm fires (possibly late, possibly spuriously)."""
        async with self._lifecycle:
            if not self.state.exists:
                await self.alarm_port.clear()
                return
            rearm = True
            try:
                now = self.clock.now_ms()
                due = self.schedule.due(now)
                if due:
                    await self._on_due(due, now)
            except Exception:
                # the alarm re-arms below; a state left mid-save goes back to running (the container was not
                # destroyed before the snapshot was recorded)
                log.exception("alarm of %s/%s failed", self.namespace, self.name)
                rearm = False
                if self.state.state == Lifecycle.SAVING:
                    self.state.set_state(Lifecycle.RUNNING)
                # never leave a past deadline behind: the alarm would fire again at once, forever
                self.schedule.postpone_until(self.clock.now_ms() + RETRY_FIRST_SECONDS * 1000)
                rearm = True
            finally:
                # Not when the recovery above failed too (its storage is failing): the deadlines may be past, and
                # the runtime retries a handler that raises, with backoff, instead.
                if rearm and self.state.exists:
                    await self.schedule.arm(self.alarm_port)

    async def _on_due(self, due: set[str], now: int) -> None:
        state = self.state
        if state.state != Lifecycle.RUNNING:
            self.schedule.clear_all()  # nothing runs, nothing to save
            return
        if not self.container.running():
            # the container died on its own; the next request restores or reports workspace_lost
            self.schedule.clear_all()
            if state.persistent:
                state.set_state(await self._resting_state())
            else:
                await self._forget()
            return
        if due & {IDLE, RETRY}:
            if not self._in_flight.count and await supervisor_client.running_commands(self.container) == 0:
                await self._idle_end()
                return
            # a command is still running (or a stream still relayed): it keeps the workspace awake
            self.schedule.push_idle(now + self.settings.idle_seconds * 1000)
        if BACKUP in due:
            await self._backup_if_due()
            self.schedule.set_at(BACKUP, now + self.settings.backup_interval_seconds * 1000)
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
            if self.container.running():
                self.schedule.retry_save(self.clock.now_ms())
            else:
                state.set_state(await self._resting_state())
                self.schedule.clear_all()


def _attachment(name: str) -> str:
    """Content-Disposition of a downloaded tar.zst named after `name` (quotes and controls replaced: the name may
    come from a path the caller chose)."""
    safe = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)
    return f'attachment; filename="{safe}.tar.zst"'
