"""The workspace's client of the supervisor inside its container (docs/protocol.md, "Supervisor API").

Every answer read here is a control answer: `read()`/`json()` refuse one past CONTROL_BODY_BYTES with ContainerGone
(ports.ContainerResponse), and each call treats that like a supervisor that does not answer.
"""

import json
import logging
import secrets
import shlex
from typing import Any
from urllib.parse import quote

from durable.operations import DeleteFileArgs, SignalArgs, StatArgs
from durable.ports import JSON_TYPE, Clock, Container, ContainerGone, ContainerResponse
from protocol.errors import ERRORS, ProtocolError
from protocol.files import ListRequest, MkdirRequest, MoveRequest

log = logging.getLogger("flarebox.supervisor")

STARTUP_BUDGET_SECONDS = 60
HEALTH_TIMEOUT_SECONDS = 5
SYNC_TIMEOUT_SECONDS = 30
_POLL_FIRST_SECONDS = 0.05
_POLL_MAX_SECONDS = 0.5


def query(**params: Any) -> str:
    """A query string that every parser reads the same way (`%20` for space, `%2B` for plus)."""
    return "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in params.items() if v is not None)


async def error_of(resp: ContainerResponse, fallback: str = "exec_failed") -> ProtocolError:
    """The supervisor's `{"error": {...}}` as a ProtocolError; an unknown code or body becomes `fallback`."""
    try:
        err = (await resp.json())["error"]
        code, message = err["code"], err.get("message")
        if code in ERRORS and (message is None or isinstance(message, str)):
            return ProtocolError(code, message)
    except Exception:
        pass
    return ProtocolError(fallback, f"the sandbox answered HTTP {resp.status}")


async def health(container: Container) -> dict | None:
    """The supervisor's /health body, or None when it is not (yet) answering."""
    try:
        resp = await container.fetch("GET", "/health", timeout=HEALTH_TIMEOUT_SECONDS)
        if resp.status != 200:
            await resp.read()
            return None
        body = await resp.json()
        return body if isinstance(body, dict) else None
    except (ContainerGone, ValueError):  # unreachable, or answering with more or other than a health body
        return None


async def running_commands(container: Container) -> int:
    body = await health(container)
    if body is None:
        return 0
    value = body.get("running", 0)
    return value if isinstance(value, int) else 0


async def wait_ready(container: Container, clock: Clock, budget_seconds: float = STARTUP_BUDGET_SECONDS) -> None:
    """Poll /health until it answers 200. Raises startup_timeout after the budget, container_unavailable when
    the container stops while starting."""
    deadline = clock.now_ms() + int(budget_seconds * 1000)
    delay = _POLL_FIRST_SECONDS
    while True:
        if not container.running():
            raise ProtocolError("container_unavailable", "the container stopped while starting")
        if await health(container) is not None:
            return
        if clock.now_ms() >= deadline:
            raise ProtocolError("startup_timeout")
        await clock.sleep(delay)
        delay = min(delay * 2, _POLL_MAX_SECONDS)


async def make_dir(container: Container, path: str) -> bool:
    """Create `path` (and parents) as the sandbox user through an internal exec; True when it exists after.
    A failure is not fatal here: the user's command then fails with invalid_cwd, which says what is wrong."""
    request = {
        "request_id": secrets.token_hex(16),
        "command": f"mkdir -p -- {shlex.quote(path)}",
        "timeout": 30,
        "stdin": None,
        "login": False,
        "cwd": "/",
        "env": {},
    }
    try:
        resp = await container.fetch(
            "POST", "/exec", body=json.dumps(request).encode(), headers={"content-type": JSON_TYPE}, timeout=60
        )
        data = await resp.read()
    except ContainerGone:
        return False
    if resp.status != 200:
        log.warning("creating the workspace cwd failed: HTTP %s", resp.status)
        return False
    lines = [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    try:
        last = json.loads(lines[-1]) if lines else {}
    except ValueError:
        last = {}
    ok = last.get("type") == "exit" and last.get("exit_code") == 0
    if not ok:
        log.warning("creating the workspace cwd failed: %s", last.get("code") or last.get("exit_code"))
    return ok


async def sync(container: Container) -> None:
    """Flush filesystem buffers before a snapshot. Best effort: a snapshot without it is still consistent for
    every file that was closed. Raises ContainerGone only when the container is really gone: a running one whose
    supervisor does not answer (frozen, wedged) is still saved, so an idle save can stop it and the next request
    restores a working one."""
    try:
        resp = await container.fetch("POST", "/sync", timeout=SYNC_TIMEOUT_SECONDS)
        await resp.read()
    except ContainerGone:
        if not container.running():
            raise
        log.warning("the supervisor did not answer the sync before a snapshot; snapshotting without it")
    except Exception:
        log.warning("sync before snapshot failed", exc_info=True)


# --- export / import archives ----------------------------------------------------------------------------------

# Silence limits, not totals: an export streams for as long as the tree takes, and an import answers only once the
# whole archive is extracted, verified and swapped in (minutes for a large one).
EXPORT_SILENCE_SECONDS = 300
IMPORT_SILENCE_SECONDS = 3600
ARCHIVE_TYPE = "application/zstd"


async def export_archive(container: Container) -> ContainerResponse:
    """GET /export: the workspace's files as a "flarebox-export" tar.zst, streamed in `body` (never read here).
    Raises the supervisor's error as a ProtocolError on a non-200, ContainerGone when it cannot be reached. A
    transfer that breaks before its end is a failed export (the supervisor never ends a failed one cleanly)."""
    resp = await container.fetch("GET", "/export", timeout=EXPORT_SILENCE_SECONDS)
    if resp.status != 200:
        raise await error_of(resp, "internal_error")
    return resp


async def dir_archive(container: Container, path: str) -> ContainerResponse:
    """GET /files/archive: one directory as a plain tar.zst, streamed in `body`; errors as for export_archive."""
    resp = await container.fetch("GET", f"/files/archive?{query(path=path)}", timeout=EXPORT_SILENCE_SECONDS)
    if resp.status != 200:
        raise await error_of(resp, "internal_error")
    return resp


async def import_archive(container: Container, body: Any, length: int | None = None) -> dict:
    """PUT /import: `body` (bytes or a stream, passed through unbuffered) replaces the workspace's and home's
    files once the archive verified against its manifest. Returns {"files": N, "bytes": N}; raises the
    supervisor's error (invalid_archive, payload_too_large, storage_full, …) as a ProtocolError — nothing was
    changed then — and ContainerGone when it cannot be reached."""
    headers = {"content-type": ARCHIVE_TYPE}
    if length is not None:
        headers["content-length"] = str(length)
    resp = await container.fetch("PUT", "/import", body=body, headers=headers, timeout=IMPORT_SILENCE_SECONDS)
    if resp.status != 200:
        raise await error_of(resp, "internal_error")
    try:
        data = await resp.json()
        result = {"files": data["files"], "bytes": data["bytes"]}
    except (ValueError, TypeError, KeyError):
        raise ProtocolError("internal_error", "the sandbox answered the import with something else") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in result.values()):
        raise ProtocolError("internal_error", "the sandbox answered the import with something else")
    return result


# --- the file tree and processes: one request each, whose answer the workspace passes through ------------------

TREE_SILENCE_SECONDS = 300  # a recursive delete or a move of a large tree answers only when done


def tree_request(args: Any) -> tuple[str, str, bytes | None]:
    """(method, path with query, JSON body) of the supervisor request an operation's arguments stand for."""
    if isinstance(args, ListRequest):
        q = query(path=args.path, depth=args.depth, limit=args.limit, cursor=args.cursor)
        return "GET", f"/files/list?{q}", None
    if isinstance(args, StatArgs):
        return "GET", f"/files/stat?{query(path=args.path)}", None
    if isinstance(args, DeleteFileArgs):
        return "DELETE", f"/files?{query(path=args.path, recursive='true' if args.recursive else None)}", None
    if isinstance(args, MoveRequest):
        body = {"from": args.source, "to": args.target, "overwrite": args.overwrite}
        return "POST", "/files/move", json.dumps(body).encode()
    if isinstance(args, MkdirRequest):
        body = {"path": args.path, "parents": args.parents, "mode": f"{args.mode:04o}"}
        return "POST", "/files/mkdir", json.dumps(body).encode()
    if isinstance(args, SignalArgs):
        body = {"signal": args.request.signal, "group": args.request.group}
        return "POST", f"/processes/{args.pid}/signal", json.dumps(body).encode()
    raise TypeError(f"no supervisor request for {type(args).__name__}")
