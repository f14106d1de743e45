"""Error codes of protocol v1 with their HTTP statuses.

An error outside a stream is `{"error": {"code": ..., "message": ...}}` with the status below. Inside an exec stream
the same codes appear as the terminal `{"type": "error", ...}` event (the HTTP status is then 200).
"""

ERRORS: dict[str, tuple[int, str]] = {
    # auth and routing
    "unauthorized": (401, "missing or wrong bearer token"),
    "access_denied": (
        401,
        "Cloudflare Access did not let this request through: sign in through Access, or send a service token's"
        " CF-Access-Client-Id and CF-Access-Client-Secret headers",
    ),
    "forbidden": (403, "the key does not open this workspace or operation; ask the operator for one that does"),
    "directory_unavailable": (
        503,
        "the deployment's directory (keys, workspace index, audit log) did not answer; nothing ran — retry shortly",
    ),
    "not_configured": (503, "the server has no SANDBOX_API_TOKEN of at least 32 characters"),
    "not_found": (404, "no such route"),
    "method_not_allowed": (405, "the route does not accept this method"),
    "unsupported_media_type": (415, "JSON bodies need Content-Type: application/json"),
    "payload_too_large": (413, "the request body is over its limit"),
    "length_required": (411, "file uploads need a Content-Length header"),
    "headers_too_large": (431, "the request headers are too large"),
    "malformed_request": (400, "the request is not valid HTTP/1.1 (a malformed request line or header)"),
    "request_timeout": (408, "the request head or body arrived too slowly; send it again without pausing"),
    # request validation
    "invalid_json": (400, "the body is not a JSON object"),
    "unknown_field": (400, "the body has a field the route does not accept"),
    "invalid_field": (400, "a field has the wrong type or value"),
    "invalid_query": (400, "a query parameter is missing, unknown or malformed"),
    "invalid_name": (400, "namespace and workspace must match ^[a-z0-9][a-z0-9_.-]{0,62}$"),
    "invalid_request_id": (400, "request ids are 32 lowercase hex characters"),
    "invalid_path": (400, "paths are absolute, at most 4096 bytes, without NUL"),
    "invalid_cwd": (400, "cwd is absolute, at most 4096 bytes, without NUL, and must be a directory"),
    "invalid_timeout": (400, "timeout is a number of seconds, > 0 and <= 900"),
    "command_too_large": (413, "command is over 64 KiB of UTF-8"),
    "confirm_required": (400, "DELETE needs ?confirm=true"),
    "image_not_found": (400, "the image is not one this deployment defines"),
    "instance_not_allowed": (400, "the instance type is not in ALLOWED_INSTANCE_TYPES"),
    "key_not_found": (404, "no key with this id (never minted, or already revoked)"),
    "quota_exceeded": (403, "the namespace already holds MAX_WORKSPACES_PER_NAMESPACE workspaces; delete one first"),
    # workspace state
    "workspace_not_found": (404, "the workspace has no configuration; PUT it first"),
    "config_conflict": (409, "the workspace exists with a different configuration"),
    "workspace_lost": (409, "the workspace booted before and has no snapshot to come back from"),
    "workspace_busy": (409, "the workspace is saving or stopping; retry shortly"),
    "not_persistent": (409, "snapshots need a persistent workspace"),
    "nothing_to_snapshot": (409, "nothing to snapshot yet: the workspace has never run, so it holds only its image"),
    "snapshot_damaged": (
        409,
        "the snapshot failed its integrity check: nothing was restored or run, and the workspace does not start"
        " from an older snapshot on its own; GET …/snapshots and POST …/restore an older one (or a backup), or"
        " DELETE the workspace to start over empty",
    ),
    "snapshot_failed": (503, "the snapshot could not be written; the workspace keeps running"),
    "snapshot_not_found": (404, "the workspace has no snapshot with this id (GET …/snapshots lists them)"),
    "too_many_kept": (
        409,
        'the workspace already keeps MAX_KEPT_SNAPSHOTS snapshots: unpin one (PATCH …/snapshots/{id} {"keep":'
        " false}) first",
    ),
    "workspace_running": (
        409,
        "an import replaces every file, so it needs a workspace that is stopped or has never booted: POST …/stop"
        " first (its files are snapshotted), then import again",
    ),
    "invalid_archive": (
        400,
        "the archive is not a Flarebox export (a tar.zst whose manifest lists every file with its sha256) or does"
        " not match its manifest: nothing was changed",
    ),
    "backup_not_found": (404, "the workspace has no backup with this id (GET …/backups lists them)"),
    "backups_unavailable": (
        409,
        "this deployment has no backup store: the operator binds an R2 bucket as BACKUPS (Cloudflare) or sets"
        " BACKUP_DIR (standalone)",
    ),
    "backup_failed": (503, "the backup could not be written or did not read back intact; the workspace keeps running"),
    # requests and commands
    "duplicate_request": (409, "this request id was used before; reattach with GET .../exec/{request_id}"),
    "request_not_found": (404, "no command with this request id is known (never run, or its journal expired)"),
    "command_cancelled": (409, "the command was cancelled before it started"),
    "output_limit": (413, "the command printed more than 2,000,000 characters; its process group was killed"),
    "exec_failed": (500, "the command could not be started"),
    "process_limit": (
        429,
        "the workspace already runs as many processes as its instance type allows, so the command could not"
        " start: wait for background processes to end, cancel the command that started them, or POST .../stop"
        " to end them all",
    ),
    # files
    "file_not_found": (404, "no file at that path"),
    "not_a_file": (400, "the path is not a regular file"),
    "file_too_large": (413, "the file is over the transfer limit"),
    "not_a_directory": (400, "the path is not a directory"),
    "file_exists": (409, "something already exists at the target path; send overwrite (move) or parents (mkdir)"),
    "directory_not_empty": (409, "the directory is not empty; send recursive=true to delete it with its contents"),
    "invalid_move": (400, "a directory cannot be moved into itself or one of its own subdirectories"),
    "path_protected": (
        400,
        "that path is the workspace itself or a directory the sandbox needs (/, /workspace, the home directory);"
        " delete or move what is inside it instead",
    ),
    "session_not_found": (
        404,
        "no terminal session with that id (its shell exited, or it had no client for PTY_LINGER_SECONDS): open a"
        " new one without `session`",
    ),
    "too_many_sessions": (409, "the workspace already holds MAX_PTY_SESSIONS terminal sessions; exit one first"),
    "websocket_required": (426, "this route is a WebSocket: connect with an Upgrade: websocket request"),
    "process_not_found": (404, "no process of the sandbox user has that pid (GET …/processes lists them)"),
    "invalid_pid": (400, "a process id is a whole number from 1 to 4194304"),
    "invalid_signal": (400, "signal is one of TERM, KILL, INT, HUP, STOP, CONT"),
    "permission_denied": (403, "the sandbox user may not access that path"),
    "path_not_allowed": (403, "the proxied path is outside what the service allows, or is malformed"),
    "service_not_found": (404, "the workspace defines no service of that name"),
    "secret_not_found": (404, "the workspace holds no secret of that name"),
    "invalid_port": (400, "port is a whole number from 1 to 65535, and not the supervisor's own 8080"),
    "upstream_unavailable": (
        502,
        "nothing answered on that port inside the workspace: start the service (GET …/services shows its state"
        " and …/services/{name}/logs its output) or check the port",
    ),
    "upstream_timeout": (504, "the service inside the workspace did not start answering in time"),
    "secrets_unavailable": (
        503,
        "this deployment has no key to encrypt secrets with: the operator sets SECRETS_KEY (Cloudflare) or the"
        " server's data directory is not writable",
    ),
    # infrastructure
    "container_exited": (503, "the container stopped while the request ran"),
    "startup_timeout": (503, "the container did not become ready in time"),
    "container_unavailable": (503, "the container could not be started or reached"),
    "storage_full": (507, "the server's disk is full; nothing was recorded or run — free space and retry"),
    "internal_error": (500, "unexpected server error"),
}


class ProtocolError(Exception):
    """A failure with a protocol error code; `message` is safe to show a client (never holds a secret)."""

    def __init__(self, code: str, message: str | None = None):
        if code not in ERRORS:
            raise ValueError(f"unknown error code {code!r}")
        self.code = code
        self.message = message or ERRORS[code][1]
        super().__init__(f"{code}: {self.message}")

    @property
    def status(self) -> int:
        return ERRORS[self.code][0]

    def body(self) -> dict:
        return error_body(self.code, self.message)


def http_status(code: str) -> int:
    return ERRORS[code][0]


def error_body(code: str, message: str | None = None) -> dict:
    return {"error": {"code": code, "message": message or ERRORS[code][1]}}
