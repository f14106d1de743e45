"""TEST DOUBLES for the workspace's ports, small and in-process. They are not runtimes: the real adapters
(src/standalone/, src/entry.py) are tested end-to-end by their own suites. Storage is real SQLite (:memory:)."""

import asyncio
import json
import sqlite3
from urllib.parse import parse_qs, urlsplit

from durable.ports import BackupInfo, ContainerGone, SnapshotInfo
from protocol.errors import ProtocolError, error_body
from protocol.events import encode_event, exit_event, output_event
from protocol.limits import CONTROL_BODY_BYTES


class MemoryStorage:
    """Real SQLite, autocommit, rows as dicts (the shape ctx.storage.sql and the standalone storage return)."""

    def __init__(self):
        self.db = sqlite3.connect(":memory:", isolation_level=None)
        self.db.row_factory = sqlite3.Row

    def sql(self, query, *params):
        return [dict(r) for r in self.db.execute(query, params).fetchall()]


async def settle(rounds: int = 20) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


class ManualClock:
    """Time moves only when a test calls advance(); spawned tasks are tracked so tests can wait for them."""

    def __init__(self, now_ms: int = 1_700_000_000_000):
        self.now = now_ms
        self.sleepers: list[tuple[float, int, asyncio.Future]] = []
        self.tasks: list[asyncio.Task] = []
        self._seq = 0

    def now_ms(self) -> int:
        return int(self.now)

    async def sleep(self, seconds: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._seq += 1
        entry = (self.now + seconds * 1000, self._seq, fut)
        self.sleepers.append(entry)
        try:
            await fut
        finally:
            self.sleepers.remove(entry)

    def spawn(self, coro) -> None:
        self.tasks.append(asyncio.ensure_future(coro))

    async def advance(self, seconds: float) -> None:
        target = self.now + seconds * 1000
        while True:
            await settle()
            ready = [s for s in self.sleepers if s[0] <= target and not s[2].done()]
            if not ready:
                break
            at, _, fut = min(ready, key=lambda s: (s[0], s[1]))
            self.now = max(self.now, at)
            fut.set_result(None)
        self.now = target
        await settle()

    async def drain(self) -> None:
        await asyncio.wait_for(asyncio.gather(*self.tasks), timeout=5)


class RecordingAlarm:
    def __init__(self):
        self.at_ms: int | None = None

    async def set(self, at_ms):
        self.at_ms = at_ms

    async def clear(self):
        self.at_ms = None


class ListSink:
    """Collects what the workspace writes; `readable` is the sink itself so tests can read it back."""

    def __init__(self):
        self.data = bytearray()
        self.closed = False
        self.readable = self

    async def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.data += data

    async def pipe_from(self, body) -> None:
        async for chunk in body:  # the double's bodies raise ContainerGone when the container dies
            await self.write(chunk)

    async def close(self) -> None:
        self.closed = True

    async def abort(self) -> None:
        self.closed = self.aborted = True

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.data.decode().splitlines()]


class ListStreams:
    def __init__(self):
        self.opened: list[ListSink] = []

    def open(self) -> ListSink:
        sink = ListSink()
        self.opened.append(sink)
        return sink


class Reply:
    def __init__(self, status, body=b"", headers=None):
        self.status = status
        self.headers = headers or {}
        self.header_pairs = list(self.headers.items())
        self.body = body  # bytes, or an async iterator of bytes (an opaque stream to the workspace)

    async def read(self, limit: int = CONTROL_BODY_BYTES) -> bytes:
        """As ports.ContainerResponse: ContainerGone as soon as the body passes `limit` bytes."""
        chunks = [self.body] if isinstance(self.body, bytes) else self.body
        data = b""
        async for chunk in _aiter(chunks):
            data += chunk
            if len(data) > limit:
                raise ContainerGone(f"the sandbox sent more than {limit} bytes for a control answer")
        return data

    async def json(self):
        return json.loads(await self.read())


async def _aiter(chunks):
    if isinstance(chunks, list):
        for chunk in chunks:
            yield chunk
    else:
        async for chunk in chunks:
            yield chunk


def _json(status, obj):
    return Reply(status, json.dumps(obj).encode(), {"content-type": "application/json"})


class FakeContainer:
    """TEST DOUBLE of ports.Container: serves the supervisor routes in-process. Commands: `hold` runs until
    release(); `fail` exits 1; anything else prints `ran: <command>` and exits 0."""

    def __init__(self, clock: ManualClock):
        self.clock = clock
        self.up = False
        self.disk: dict[str, bytes] | None = None  # None: no filesystem exists
        self.keep_disk_on_crash = False
        self.snapshots: dict[str, dict[str, bytes]] = {}
        self.damaged: set[str] = set()
        self.starts: list = []
        self.empty_starts: list[bool] = []
        self.start_gate: asyncio.Event | None = None
        self.start_error: ProtocolError | None = None
        self.unready_polls = 0  # /health answers 503 this many times after a start
        self.fail_snapshots = 0
        self.snapshot_error: Exception = ProtocolError("snapshot_failed")
        self.snapshot_gate: asyncio.Event | None = None
        # The platform's snapshot lifetime, counted from the snapshot or its last restore (Cloudflare: 30 days); None:
        # snapshots never expire (standalone). `alive_from` is the platform's own clock of each, not the workspace's.
        self.snapshot_lifetime_ms: int | None = None
        self.alive_from: dict[str, int] = {}
        self.deleted_snapshots: list[str] = []
        self.destroys = 0
        self.execs: list[dict] = []
        self.cancels: list[str] = []
        self.pending_cancels: set[str] = set()
        self.journal: dict[str, list[dict]] = {}
        self.holds: dict[str, asyncio.Event] = {}
        self.syncs = 0
        self.answers: dict[tuple[str, str], Reply] = {}  # (method, path without query) → served instead of the route
        self.services: dict[str, dict] = {}  # what the supervisor was told to run (its supervised bodies)
        self.port_calls: list[tuple] = []  # (port, method, path, headers)
        self.port_answers: dict[int, Reply] = {}  # port → its answer; a port without one: nothing listens
        self.imports = 0
        self._n = 0

    # --- ports.Container ---
    def running(self) -> bool:
        return self.up

    def has_disk(self) -> bool:
        return not self.up and self.disk is not None

    async def start(self, spec) -> None:
        self.starts.append(spec)
        self.empty_starts.append(spec.snapshot_id is None and self.disk is None)  # would start with no files
        if self.start_gate is not None:
            await self.start_gate.wait()
        if self.start_error is not None:
            raise self.start_error
        if spec.snapshot_id is not None:
            if spec.snapshot_id in self.damaged:
                raise ProtocolError("snapshot_damaged")
            if self._expired(spec.snapshot_id):  # as Cloudflare: the restore of an expired snapshot fails
                raise ProtocolError("container_unavailable", "the container could not be started")
            self.disk = dict(self.snapshots[spec.snapshot_id])
            self.alive_from[spec.snapshot_id] = self.clock.now_ms()  # a restore renews its life
        elif self.disk is None:
            self.disk = {"/workspace/": b""}  # the image's (and the standalone sandbox's) /workspace
        self.up = True

    async def snapshot(self) -> SnapshotInfo:
        if self.snapshot_gate is not None:
            await self.snapshot_gate.wait()
        if not self.up:
            raise ContainerGone()
        if self.fail_snapshots:
            self.fail_snapshots -= 1
            raise self.snapshot_error
        self._n += 1
        sid = f"snap-{self._n}"
        self.snapshots[sid] = dict(self.disk)
        now = self.clock.now_ms()
        self.alive_from[sid] = now
        return SnapshotInfo(sid, 100 + self._n, now, self.snapshot_expiry(now))

    def snapshot_expiry(self, alive_from_ms) -> int | None:
        return None if self.snapshot_lifetime_ms is None else alive_from_ms + self.snapshot_lifetime_ms

    def _expired(self, sid) -> bool:
        expiry = self.snapshot_expiry(self.alive_from.get(sid, self.clock.now_ms()))
        return expiry is not None and self.clock.now_ms() >= expiry

    async def delete_snapshot(self, snapshot_id) -> None:
        self.deleted_snapshots.append(snapshot_id)
        self.snapshots.pop(snapshot_id, None)

    async def snapshot_ref(self, snapshot_id) -> dict:
        if snapshot_id not in self.snapshots:
            raise ProtocolError("snapshot_not_found")
        files = {path: data.hex() for path, data in self.snapshots[snapshot_id].items()}
        return {"id": snapshot_id, "files": files, "created_at_ms": self.alive_from.get(snapshot_id, 0)}

    async def adopt_snapshot(self, ref) -> SnapshotInfo:
        self._n += 1
        sid = f"adopted-{self._n}-{ref['id']}"
        self.snapshots[sid] = {path: bytes.fromhex(data) for path, data in ref["files"].items()}
        self.alive_from[sid] = ref["created_at_ms"]
        return SnapshotInfo(sid, 1, ref["created_at_ms"], self.snapshot_expiry(ref["created_at_ms"]))

    async def destroy(self) -> None:
        self.destroys += 1
        self.up = False
        self.disk = None
        for ev in self.holds.values():
            ev.set()

    # --- test controls ---
    def crash(self) -> None:
        self.up = False
        if not self.keep_disk_on_crash:
            self.disk = None
        for ev in self.holds.values():
            ev.set()

    def release(self, rid: str) -> None:
        self.holds[rid].set()

    async def fetch_port(self, port, method, path, *, body=None, headers=None):
        if not self.up:
            raise ContainerGone()
        self.port_calls.append((port, method, path, dict(headers or {})))
        if port not in self.port_answers:
            raise ProtocolError("upstream_unavailable")
        return self.port_answers[port]

    # --- the supervisor routes ---
    async def fetch(self, method, path, *, body=None, headers=None, timeout=None):
        if not self.up:
            raise ContainerGone()
        url = urlsplit(path)
        if (method, url.path) in self.answers:
            return self.answers[(method, url.path)]
        if url.path.startswith("/services"):
            return self._services(method, url.path.split("/")[2:], body)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        if (method, url.path) == ("GET", "/health"):
            if self.unready_polls:
                self.unready_polls -= 1
                return _json(503, {"ok": False})
            running = sum(1 for ev in self.holds.values() if not ev.is_set())
            return _json(200, {"ok": True, "running": running, "user": "sandbox"})
        if (method, url.path) == ("POST", "/sync"):
            self.syncs += 1
            return _json(200, {"ok": True})
        if (method, url.path) == ("POST", "/exec"):
            return self._exec(json.loads(body))
        if method == "GET" and parts[0] == "exec" and len(parts) == 2:
            if parts[1] not in self.journal:
                return _json(404, error_body("request_not_found"))
            offset = int(q.get("offset", 0))
            return Reply(200, self._replay(parts[1], offset))
        if method == "POST" and parts[0] == "exec" and parts[-1] == "cancel":
            rid = parts[1]
            self.cancels.append(rid)
            if rid in self.holds and not self.holds[rid].is_set():
                self.holds[rid].set()
                return _json(200, {"request_id": rid, "state": "cancelled"})
            if rid in self.journal:
                return _json(200, {"request_id": rid, "state": "finished"})
            self.pending_cancels.add(rid)
            return _json(200, {"request_id": rid, "state": "pending"})
        if url.path == "/files" and method == "GET":
            data = self.disk.get(q["path"])
            if data is None:
                return _json(404, error_body("file_not_found"))
            return Reply(200, data, {"content-type": "application/octet-stream", "content-length": str(len(data))})
        if (method, url.path) == ("GET", "/export"):
            files = {path: data.hex() for path, data in self.disk.items()}
            return Reply(200, _chunks([json.dumps(files).encode()]), {"content-type": "application/zstd"})
        if (method, url.path) == ("PUT", "/import"):
            data = b"".join(body.chunks) if isinstance(body, UploadBody) else b"".join([c async for c in body])
            try:
                files = json.loads(data)
            except ValueError:
                return _json(400, error_body("invalid_archive"))
            self.disk = {path: bytes.fromhex(hexed) for path, hexed in files.items()}
            self.imports += 1
            return _json(200, {"files": len(files), "bytes": sum(len(v) // 2 for v in files.values())})
        if url.path == "/files" and method == "PUT":
            data = b"".join(body.chunks)
            assert len(data) == int(headers["content-length"])
            self.disk[q["path"]] = data
            self.last_write_query = q
            return _json(200, {"path": q["path"], "size": len(data)})
        return _json(404, error_body("not_found"))

    def _services(self, method, parts, body):
        def obj(name):
            return {"name": name, "state": "running", "restarts": 0, "pid": 7, "started_at": None, "last_exit": None}

        if method == "PUT" and not parts:
            self.services = json.loads(body)["services"]
            return _json(200, {"services": [obj(n) for n in sorted(self.services)]})
        if method == "GET" and not parts:
            return _json(200, {"services": [obj(n) for n in sorted(self.services)]})
        if method == "PUT" and len(parts) == 1:
            self.services[parts[0]] = json.loads(body)
            return _json(200, obj(parts[0]))
        if method == "DELETE" and len(parts) == 1:
            if self.services.pop(parts[0], None) is None:
                return _json(404, error_body("service_not_found"))
            return _json(200, {"name": parts[0], "deleted": True})
        if method == "GET" and parts[1:] == ["ready"]:
            return _json(200, {"ready": True, "service": obj(parts[0])})
        return _json(404, error_body("not_found"))

    def _exec(self, req):
        self.execs.append(req)
        rid, command = req["request_id"], req["command"]
        if rid in self.pending_cancels:
            return _json(409, error_body("command_cancelled"))
        if command.startswith("mkdir -p -- "):
            self.disk[command.removeprefix("mkdir -p -- ").strip("'") + "/"] = b""
            return Reply(200, encode_event(exit_event(0, "exited", 1)))
        if req["cwd"] + "/" not in self.disk and req["cwd"] != "/":
            return _json(400, error_body("invalid_cwd"))
        self.journal[rid] = []
        if command == "hold":
            self.holds[rid] = asyncio.Event()
        return Reply(200, self._run(rid, command))

    async def _run(self, rid, command):
        out = output_event(f"ran: {command}\n", 0)
        self.journal[rid].append(out)
        yield encode_event(out)
        if command == "hold":
            await self.holds[rid].wait()
            if not self.up:
                raise ContainerGone()
        end = exit_event(1 if command == "fail" else 0, "exited", 5)
        self.journal[rid].append(end)
        yield encode_event(end)

    async def _replay(self, rid, offset):
        for ev in self.journal[rid]:
            if ev["type"] != "output" or ev["offset"] >= offset:
                yield encode_event(ev)


async def _chunks(chunks):
    for chunk in chunks:
        yield chunk


class MemoryBackupStore:
    """TEST DOUBLE of ports.BackupStore: archives kept in a dict; `fail` makes the next writes fail as a full or
    missing store does, `down` makes every call raise as an unreachable one."""

    def __init__(self, available: bool = True):
        self.available = available
        self.archives: dict[tuple[str, str, str], tuple[BackupInfo, bytes]] = {}
        self.fail = 0
        self.down = False

    def _check(self):
        if self.down:
            raise OSError("the backup store is unreachable")

    async def write(self, namespace, workspace, backup_id, body, created_at_ms):
        self._check()
        data = b"".join([chunk async for chunk in _aiter(body)]) if not isinstance(body, bytes) else body
        if self.fail:
            self.fail -= 1
            raise ProtocolError("backup_failed", "no space left on the backup store")
        info = BackupInfo(backup_id, len(data), created_at_ms, "0" * 64)
        self.archives[(namespace, workspace, backup_id)] = (info, data)
        return info

    async def list(self, namespace, workspace):
        self._check()
        found = [info for (ns, ws, _), (info, _) in self.archives.items() if (ns, ws) == (namespace, workspace)]
        return sorted(found, key=lambda b: (b.created_at_ms, b.id), reverse=True)

    async def open(self, namespace, workspace, backup_id):
        self._check()
        if (namespace, workspace, backup_id) not in self.archives:
            raise ProtocolError("backup_not_found")
        info, data = self.archives[(namespace, workspace, backup_id)]
        return info, UploadBody([data])

    async def delete(self, namespace, workspace, backup_id):
        self._check()
        self.archives.pop((namespace, workspace, backup_id), None)


class UploadBody:
    """An opaque upload stream: the workspace must pass it on without reading it."""

    def __init__(self, chunks):
        self.chunks = chunks


def rid(n: int) -> str:
    """The n-th request id (32 hex characters)."""
    return f"{n:032x}"
