"""`flarebox serve`: assemble the standalone runtime (settings, token, registry, edge, ASGI app) and run uvicorn.

uvicorn handles SIGINT/SIGTERM: it stops accepting, gives open streams a short grace, then runs the ASGI lifespan
shutdown, where the registry stops the sandboxes (files stay on disk) and closes every SQLite file.

With --workers N (or FLAREBOX_WORKERS) above 1, standalone/workers.py runs N such processes sharing the listening
socket, each the owner of a share of the workspaces (standalone/placement.py, standalone/shards.py); 1, the default,
is this one process.
"""

import asyncio
import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path

import uvicorn

from directory.directory import Directory
from durable.ports import Cipher
from standalone import network, redact
from standalone.access import access_gate
from standalone.cipher import AesGcmCipher, load_or_create_key
from standalone.clock import AsyncioClock
from standalone.config import load_settings
from standalone.http_protocol import FlareboxHttpToolsProtocol
from standalone.placement import WORKERS_ENV, owner, parse_workers
from standalone.registry import WorkspaceRegistry
from standalone.sandbox_driver import SandboxDriver, ServerClaim
from standalone.seccomp import SeccompUnavailable
from standalone.server import FlareboxApp
from standalone.storage import SqliteStorage
from standalone.token import load_or_create_token, token_notice
from standalone.uids import UidRangeError, UnsafeDirError
from worker.edge import Edge

log = logging.getLogger("flarebox.serve")

DIRECTORY_FILE = "directory.sqlite3"  # keys, the workspace index and the audit log (directory/)
GRACEFUL_SECONDS = 3  # open exec streams get this long at shutdown; clients reattach by request id afterwards


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flarebox")
    except PackageNotFoundError:
        return "0.0.0"


def build_app(
    data_dir: Path,
    settings,
    token: str | None,
    cipher: Cipher | None = None,
    *,
    claim: ServerClaim | None = None,
    shard: tuple[int, int] | None = None,
) -> tuple[FlareboxApp, WorkspaceRegistry, SandboxDriver]:
    """The app of the one server process, or, with `shard` = (index, workers), of one worker process: its registry
    builds only the workspaces it owns, and its edge calls every other one at its owner (shards.py). A worker
    shares its parent's `claim` (the uid range, the runtime dir); the parent indexed the workspaces on disk."""
    driver = SandboxDriver(data_dir, settings, claim=claim)
    clock = AsyncioClock()
    owns = None if shard is None else partial(owns_workspace, shard)
    registry = WorkspaceRegistry(data_dir, settings, clock, driver.make, driver.stop, cipher, owns=owns)
    directory_storage = SqliteStorage(data_dir / DIRECTORY_FILE, registry.reserve)
    directory = Directory(directory_storage, clock, settings)
    sharded = None
    if shard is None:
        for namespace, workspace in registry.known_workspaces():
            directory.adopt(namespace, workspace)
    else:
        from standalone.shards import ShardedWorkspaces

        sharded = ShardedWorkspaces(registry, shard[0], shard[1], driver.runtime_dir)
    edge = Edge(
        token=token,
        settings=settings,
        workspaces=registry if sharded is None else sharded,
        directory=directory,
        version=_version(),
        access=access_gate(settings),
    )

    async def shutdown() -> None:
        if sharded is not None:
            await sharded.close()  # calls from and to the other workers end first
        await registry.shutdown()
        directory_storage.close()

    app = FlareboxApp(edge, on_shutdown=shutdown)
    app.sharded = sharded
    return app, registry, driver


def owns_workspace(shard: tuple[int, int], namespace: str, workspace: str) -> bool:
    return owner(namespace, workspace, shard[1]) == shard[0]


def adopt_workspaces(data_dir: Path, settings) -> None:
    """Index the workspaces found on disk (what build_app does for one process; the parent of workers does it once
    for all of them, before they start)."""
    from standalone.registry import known_workspaces

    storage = SqliteStorage(data_dir / DIRECTORY_FILE)
    try:
        directory = Directory(storage, AsyncioClock(), settings)
        for namespace, workspace in known_workspaces(data_dir):
            directory.adopt(namespace, workspace)
    finally:
        storage.close()


def uvicorn_config(app: FlareboxApp, host: str, port: int, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=FlareboxHttpToolsProtocol,  # httptools, with the documented 400, 408 and 431 answers
        # the terminal route's WebSockets; pings every 20 s keep a quiet terminal's connection (and proxies) alive
        ws="websockets-sansio",
        lifespan="on",
        # the caller's address is the connection's: X-Forwarded-For from a loopback client is not believed (the
        # port proxy passes the real one on to services, which must not be told a forged one)
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
        server_header=False,
        # the access log holds method, path and status only; headers (the token) are never logged
        access_log=True,
    )


def banner(out, data_dir: Path, host: str, token, base_url: str, limits_report: str, settings, workers: int) -> None:
    out.write(f"Flarebox {_version()} (protocol 1) — data in {data_dir}\n")
    if host not in ("127.0.0.1", "::1", "localhost"):
        out.write(f"Warning: listening on {host} over plain HTTP; put TLS in front before other machines use it.\n")
    out.write(token_notice(token, base_url, terminal=out.isatty()))  # never the token into a redirected log
    out.write(f"Instance limits: {limits_report}\n")
    out.write(
        f"Idle workspaces are saved after {settings.idle_seconds} s; internet in sandboxes: "
        f"{network.describe(settings.enable_internet)}.\n"
    )
    if workers > 1:
        out.write(f"Worker processes: {workers}, each owning a share of the workspaces.\n")
    out.flush()


def run_server(
    *, host: str, port: int, data_dir: Path, log_level: str = "info", workers: str | int | None = None
) -> int:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # one line per supervisor request is noise (the access log already has one per client request)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    data_dir = Path(data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        settings = load_settings()
    except ValueError as err:
        print(f"flarebox: bad setting: {err}", file=sys.stderr)
        return 2
    token = load_or_create_token(data_dir)
    try:
        cipher = AesGcmCipher(load_or_create_key(data_dir))  # before anything starts: a bad SECRETS_KEY stops here
    except ValueError as err:
        print(f"flarebox: bad setting: {err}", file=sys.stderr)
        return 2
    try:
        count = parse_workers(workers if workers is not None else os.environ.get(WORKERS_ENV))
    except ValueError as err:
        print(f"flarebox: bad setting: --workers / {WORKERS_ENV}: {err}", file=sys.stderr)
        return 2
    base_url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
    if count > 1:
        from standalone.workers import run_workers

        return run_workers(
            host=host,
            port=port,
            data_dir=data_dir,
            settings=settings,
            token=token,
            cipher=cipher,
            workers=count,
            log_level=log_level,
            base_url=base_url,
        )
    try:
        app, registry, driver = build_app(data_dir, settings, token.value if token.usable else None, cipher)
    except (UidRangeError, UnsafeDirError, SeccompUnavailable) as err:
        print(f"flarebox: {err}", file=sys.stderr)
        return 2

    out = sys.stdout
    banner(out, data_dir, host, token, base_url, driver.limits_report, settings, 1)

    config = uvicorn_config(app, host, port, log_level)
    server = uvicorn.Server(config)
    redact.install(token.value)  # after uvicorn.Config, which set up uvicorn's log handlers

    async def main() -> None:
        armed = registry.rearm_alarms()
        if armed:
            log.info("re-armed %d workspace alarm(s)", armed)
        serving = asyncio.ensure_future(server.serve())
        # uvicorn has no "started" event to wait on
        while not server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if server.started:
            out.write(f"Listening on {base_url}  (Ctrl-C to stop)\n")
            out.flush()
        await serving

    # uvicorn handles SIGINT/SIGTERM while serving and re-raises the signal afterwards; with this no-op as the
    # "previous" handler a SIGTERM ends the process with status 0 after the clean shutdown, not with -15
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        driver.close()  # the sandboxes are stopped by now (lifespan shutdown)
    return 0 if server.started else 1
