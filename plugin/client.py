"""The Flarebox protocol v1 client: one synchronous httpx client used by the Hermes plugin, the `flarebox` CLI, the
tests and the benchmarks (docs/protocol.md has the shapes).

Rules it keeps, because they are the difference between a safe client and a confusing one:
- https only, except on loopback; an explicit User-Agent (Cloudflare's bot protection rejects library defaults);
- redirects are refused, never followed (a redirect would carry the bearer token elsewhere);
- nothing is retried: a mutating call that failed in transit may already have happened;
- error bodies are parsed, never echoed: only a well-formed `{"error":{"code","message"}}` reaches the caller;
- exec streams are checked event by event (known types, one terminal event, nothing after it, bounded frames), and
  output offsets are made exactly-once so a reattach neither loses nor repeats text.

This file is copied into Hermes with the plugin, so it imports only the stdlib, httpx and its own package; the few
protocol names it needs are repeated here on purpose (plugin/ must not import src/).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from typing import IO, Any
from urllib.parse import quote, urlsplit

import httpx

from ._version import __version__

# Repeated from src/protocol (events.py, limits.py); tests/client checks they stay equal.
EVENT_TYPES = ("status", "started", "output", "heartbeat", "exit", "error")
TERMINAL_TYPES = ("exit", "error")
STATUS_PHASES = ("starting", "restoring", "ready")
CONTAINER_STATES = ("continuing", "fresh", "restored", "restarted")
EXIT_REASONS = ("exited", "timeout", "cancelled", "signal")
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
REQUEST_ID_PATTERN = r"^[0-9a-f]{32}$"
MAX_BODY_BYTES = 1024 * 1024
# Scoped keys (src/protocol/keys.py): `fbk_<16 hex id>_<32-character secret>`, sent exactly like the token.
SCOPES = ("exec", "files", "snapshots", "manage", "proxy")
KEY_PREFIX = "fbk_"
KEY_ID_PATTERN = r"^[0-9a-f]{16}$"
KEY_PATTERN = r"fbk_[0-9a-f]{16}_[A-Za-z0-9_-]{32}"

USER_AGENT = f"flarebox-hermes/{__version__}"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
# One output frame is at most 16 Ki code points; JSON escaping can grow a code point to 12 bytes. 1 MiB is far
# above any honest frame and still bounds what a broken or hostile server can make us buffer.
MAX_FRAME_BYTES = 1024 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024
MAX_JSON_BYTES = 16 * 1024 * 1024  # status objects and snapshot lists are small; this is only a safety bound
MAX_MESSAGE_CHARS = 500
# Heartbeats come every 10 s; a read stalled for this long means the stream is dead, not slow.
STREAM_READ_TIMEOUT = 45.0
# Snapshot and stop save a whole workspace; give them the time a large one needs.
LIFECYCLE_TIMEOUT = 600.0
COPY_CHUNK = 256 * 1024

_NAME = re.compile(NAME_PATTERN)
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)
_KEY_ID = re.compile(KEY_ID_PATTERN)
_KEY = re.compile(KEY_PATTERN)
_CODE = re.compile(r"[a-z_]{1,64}")


class FlareboxError(Exception):
    """Base of every error this client raises (besides ValueError for bad arguments)."""


class ApiError(FlareboxError):
    """The server answered with an error status. `code` always matches [a-z_]{1,64}; `message` is safe to show."""

    def __init__(self, status: int, code: str, message: str):
        self.status = status
        self.code = code
        self.message = message
        super().__init__(f"HTTP {status} {code}: {message}")


class TransportError(FlareboxError):
    """The server could not be reached, or a response or stream broke off (the outcome of a call is unknown).
    `connected` is False when no connection was made at all: then the request certainly did not arrive.
    `reason` is a short description without the URL."""

    def __init__(self, message: str, *, connected: bool = True, reason: str = ""):
        super().__init__(message)
        self.connected = connected
        self.reason = reason or message


# Plain words instead of httpx class names: Hermes treats any error text containing "timeout" as a timed-out
# command (exit 124), which a dropped connection is not.
_TRANSPORT_REASONS = (
    (httpx.ConnectTimeout, "the server did not accept the connection in time"),
    (httpx.ConnectError, "the server is unreachable (connection refused or no route)"),
    (httpx.ReadTimeout, "the server stopped answering"),
    (httpx.WriteTimeout, "sending to the server stalled"),
    (httpx.PoolTimeout, "no free connection to the server"),
)


def _transport_error(what: str, exc: Exception) -> TransportError:
    reason = next((text for kind, text in _TRANSPORT_REASONS if isinstance(exc, kind)), "the connection broke")
    connected = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    return TransportError(f"{what}: {reason}", connected=connected, reason=reason)


class ProtocolViolation(FlareboxError):
    """The server sent something protocol v1 does not allow (a bad event, data after the end, an oversized frame)."""


def _sanitize(text: str) -> str:
    cleaned = "".join(ch if ch.isprintable() else " " for ch in text)
    return cleaned[:MAX_MESSAGE_CHARS]


def parse_error_body(status: int, body: bytes) -> ApiError:
    """Turn an error response into an ApiError without ever repeating unparsed text (it may be an HTML page that
    echoes headers, or anything else a proxy made up)."""
    try:
        error = json.loads(body.decode("utf-8"))["error"]
        code, message = error["code"], error["message"]
    except (ValueError, KeyError, TypeError):
        return ApiError(status, "unexpected_response", f"HTTP {status} without a Flarebox error body")
    if not isinstance(code, str) or not _CODE.fullmatch(code) or not isinstance(message, str):
        return ApiError(status, "unexpected_response", f"HTTP {status} with a malformed Flarebox error body")
    return ApiError(status, code, _sanitize(message))


def check_endpoint(endpoint: str) -> str:
    """Return the endpoint without a trailing slash, or raise ValueError saying what is wrong with it."""
    if not isinstance(endpoint, str) or not endpoint:
        raise ValueError("endpoint is empty: set it to the Flarebox server's https:// URL")
    parts = urlsplit(endpoint)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("endpoint must be an https:// URL such as https://flarebox.example.workers.dev")
    if parts.scheme == "http" and parts.hostname not in LOOPBACK_HOSTS:
        raise ValueError(
            "endpoint must use https:// (plain http:// is only allowed on loopback: 127.0.0.1, ::1, localhost)"
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError("endpoint must not contain credentials, a query or a fragment")
    return endpoint.rstrip("/")


def check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(f"{what} must match {NAME_PATTERN}")
    return value


def check_request_id(value: str) -> str:
    if not isinstance(value, str) or not _REQUEST_ID.fullmatch(value):
        raise ValueError("request_id must be 32 lowercase hex characters")
    return value


def check_key_id(value: str) -> str:
    if not isinstance(value, str) or not _KEY_ID.fullmatch(value):
        raise ValueError("a key id is 16 lowercase hex characters (the part after fbk_ in the key)")
    return value


def key_id_of(token: str) -> str | None:
    """The public id of a scoped key, or None when `token` does not have a key's shape (the deployment token)."""
    if isinstance(token, str) and _KEY.fullmatch(token):
        return token[len(KEY_PREFIX) : len(KEY_PREFIX) + 16]
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_event(event: Any) -> dict:
    """Check one decoded event against protocol v1; raise ProtocolViolation if it is not a well-formed event."""
    if not isinstance(event, dict):
        raise ProtocolViolation("stream line is not a JSON object")
    kind = event.get("type")
    if kind not in EVENT_TYPES:
        raise ProtocolViolation("stream event has an unknown type")
    ok = True
    if kind == "status":
        ok = event.get("phase") in STATUS_PHASES
    elif kind == "started":
        ok = isinstance(event.get("request_id"), str) and event.get("container") in CONTAINER_STATES
        ok = ok and (event.get("snapshot") is None or isinstance(event.get("snapshot"), dict))
    elif kind == "output":
        ok = isinstance(event.get("data"), str) and _is_int(event.get("offset")) and event["offset"] >= 0
    elif kind == "exit":
        ok = _is_int(event.get("exit_code")) and event.get("reason") in EXIT_REASONS
    elif kind == "error":
        code = event.get("code")
        ok = isinstance(code, str) and bool(_CODE.fullmatch(code)) and isinstance(event.get("message", ""), str)
        if ok:
            event = dict(event, message=_sanitize(event.get("message", "")))
    if not ok:
        raise ProtocolViolation(f"malformed {kind} event")
    return event


def iter_ndjson(chunks: Iterator[bytes], max_frame: int = MAX_FRAME_BYTES) -> Iterator[dict]:
    """Split a byte stream into lines and parse each as a JSON event. A line over `max_frame` is a violation (we
    never buffer without bound); a final line without a newline is parsed too (some proxies drop the last one)."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while True:
            cut = buffer.find(b"\n")
            if cut < 0:
                break
            line, buffer = buffer[:cut], buffer[cut + 1 :]
            if len(line) > max_frame:
                raise ProtocolViolation("stream frame over the size limit")
            yield _decode(line)
        if len(buffer) > max_frame:
            raise ProtocolViolation("stream frame over the size limit")
    if buffer.strip():
        yield _decode(buffer)


def _decode(line: bytes) -> dict:
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ProtocolViolation("stream line is not valid UTF-8 JSON") from None
    return validate_event(value)


def events_exactly_once(events: Iterator[dict], start_offset: int = 0) -> Iterator[dict]:
    """Enforce the stream's shape: exactly one terminal event and nothing after it; output offsets without gaps.
    Output already seen (offset below the expected one, as a replay may repeat) is trimmed, never shown twice.
    Ends with TransportError if the stream stops before its terminal event: the outcome was not seen, and the
    caller may reattach from the offset it has."""
    expected = start_offset
    finished = False
    for event in events:
        if finished:
            raise ProtocolViolation("data after the terminal event")
        kind = event["type"]
        if kind == "output":
            offset, data = event["offset"], event["data"]
            if offset > expected:
                raise ProtocolViolation(f"output gap: expected offset {expected}, got {offset}")
            if offset < expected:
                data = data[expected - offset :]
                if not data:
                    continue
                event = dict(event, data=data, offset=expected)
            expected += len(data)
        elif kind in TERMINAL_TYPES:
            finished = True
        yield event
    if not finished:
        raise TransportError(
            "the stream ended before its terminal event; reattach to learn the outcome",
            reason="the stream ended before the command's outcome",
        )


class Client:
    """A synchronous, thread-safe Flarebox client (httpx.Client is safe to share across threads)."""

    def __init__(
        self,
        endpoint: str,
        token: str,
        *,
        access_client_id: str | None = None,
        access_client_secret: str | None = None,
        user_agent: str = USER_AGENT,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
    ):
        self.endpoint = check_endpoint(endpoint)
        if not isinstance(token, str) or not token or any(c.isspace() for c in token):
            raise ValueError("token must be a non-empty string without whitespace")
        if bool(access_client_id) != bool(access_client_secret):
            raise ValueError("set both the Cloudflare Access client id and secret, or neither")
        headers = {"Authorization": f"Bearer {token}", "User-Agent": user_agent, "Accept-Encoding": "identity"}
        if access_client_id:
            headers["CF-Access-Client-Id"] = access_client_id
            headers["CF-Access-Client-Secret"] = access_client_secret
        self._connect_timeout = connect_timeout
        self._http = httpx.Client(
            headers=headers,
            follow_redirects=False,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            # No retries (httpx's default transport has none); no proxies from the environment for loopback.
            trust_env=urlsplit(self.endpoint).hostname not in LOOPBACK_HOSTS,
        )

    def __repr__(self) -> str:  # never show the token
        return f"Client({self.endpoint!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing -------------------------------------------------------------------------------------------

    def _url(self, *segments: str) -> str:
        return self.endpoint + "/v1/" + "/".join(quote(s, safe="") for s in segments)

    def _workspace(self, ns: str, ws: str, *rest: str) -> str:
        return self._url("workspaces", check_name(ns, "namespace"), check_name(ws, "workspace"), *rest)

    def _timeout(self, read: float | None) -> Any:
        # None means "the client's default" here; passing None on to httpx would disable every timeout.
        return httpx.USE_CLIENT_DEFAULT if read is None else httpx.Timeout(read, connect=self._connect_timeout)

    def _json(self, method: str, url: str, *, read_timeout: float | None = None, **kwargs: Any) -> Any:
        """One request with a JSON answer. Bodies are read with a cap: a broken or hostile server cannot make us
        buffer without bound."""
        try:
            with self._http.stream(method, url, timeout=self._timeout(read_timeout), **kwargs) as response:
                if not 200 <= response.status_code < 300:
                    _raise_for_status(response, _read_capped(response))
                body = _read_capped(response, MAX_JSON_BYTES + 1)
        except httpx.TransportError as exc:
            raise _transport_error(f"{method} {_path(url)} failed", exc) from None
        if len(body) > MAX_JSON_BYTES:
            raise ProtocolViolation(f"{method} {_path(url)} answered with an oversized body")
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ProtocolViolation(f"{method} {_path(url)} answered with a body that is not JSON") from None

    # --- workspaces -----------------------------------------------------------------------------------------

    def health(self) -> dict:
        return self._json("GET", self._url("health"))

    def put_workspace(self, ns: str, ws: str, config: dict) -> dict:
        """Create the workspace or confirm its config; returns the status object (ApiError config_conflict if it
        exists with another config)."""
        return self._json("PUT", self._workspace(ns, ws), json=config)

    def get_workspace(self, ns: str, ws: str) -> dict:
        return self._json("GET", self._workspace(ns, ws))

    # --- services and secrets -------------------------------------------------------------------------------

    def put_service(self, ns: str, ws: str, name: str, spec: dict) -> dict:
        """Define (or replace) a service; the service object. A running workspace starts it at once."""
        return self._json("PUT", self._workspace(ns, ws, "services", name), json=spec)

    def list_services(self, ns: str, ws: str) -> list[dict]:
        return self._json("GET", self._workspace(ns, ws, "services"))["services"]

    def delete_service(self, ns: str, ws: str, name: str) -> dict:
        return self._json("DELETE", self._workspace(ns, ws, "services", name))

    def put_secret(self, ns: str, ws: str, name: str, value: str) -> dict:
        """Store a secret (sealed at rest, never answered back); its name and update time."""
        return self._json("PUT", self._workspace(ns, ws, "secrets", name), json={"value": value})

    def list_secrets(self, ns: str, ws: str) -> list[dict]:
        return self._json("GET", self._workspace(ns, ws, "secrets"))["secrets"]

    def delete_secret(self, ns: str, ws: str, name: str) -> dict:
        return self._json("DELETE", self._workspace(ns, ws, "secrets", name))

    def delete_workspace(self, ns: str, ws: str) -> dict:
        return self._json("DELETE", self._workspace(ns, ws), params={"confirm": "true"}, read_timeout=LIFECYCLE_TIMEOUT)

    def snapshot(self, ns: str, ws: str, *, label: str | None = None, keep: bool = False) -> dict:
        body: dict[str, Any] = {}
        if label is not None:
            body["label"] = label
        if keep:
            body["keep"] = True
        url = self._workspace(ns, ws, "snapshot")
        return self._json("POST", url, json=body or None, read_timeout=LIFECYCLE_TIMEOUT)

    def snapshots(self, ns: str, ws: str) -> list[dict]:
        return self._json("GET", self._workspace(ns, ws, "snapshots"))["snapshots"]

    def patch_snapshot(self, ns: str, ws: str, snapshot_id: str, **fields: Any) -> dict:
        """Relabel (`label=`, None clears) or pin/unpin (`keep=`) a snapshot."""
        return self._json("PATCH", self._workspace(ns, ws, "snapshots", snapshot_id), json=fields)

    def restore(
        self,
        ns: str,
        ws: str,
        *,
        snapshot: str | None = None,
        backup: str | None = None,
        discard_changes: bool = False,
    ) -> dict:
        """Roll back to a snapshot (an id or "latest") or a backup at the next start."""
        body: dict[str, Any] = {"snapshot": snapshot} if backup is None else {"backup": backup}
        if discard_changes:
            body["discard_changes"] = True
        url = self._workspace(ns, ws, "restore")
        return self._json("POST", url, json=body, read_timeout=LIFECYCLE_TIMEOUT)

    def fork(self, ns: str, ws: str, source: tuple[str, str], snapshot: str | None = None, **config: Any) -> dict:
        """Create workspace `ws` whose first boot restores a snapshot of `source` (its files now when none named)."""
        origin: dict[str, Any] = {"namespace": check_name(source[0], "namespace"), "workspace": source[1]}
        if snapshot is not None:
            origin["snapshot"] = snapshot
        url = self._workspace(ns, ws)
        return self._json("PUT", url, json={**config, "from": origin}, read_timeout=LIFECYCLE_TIMEOUT)

    def backup(self, ns: str, ws: str) -> dict:
        return self._json("POST", self._workspace(ns, ws, "backup"), read_timeout=LIFECYCLE_TIMEOUT)

    def backups(self, ns: str, ws: str) -> list[dict]:
        return self._json("GET", self._workspace(ns, ws, "backups"))["backups"]

    def export(self, ns: str, ws: str, dest: IO[bytes], *, on_progress: Callable[[int], Any] | None = None) -> int:
        """Stream the workspace's export archive (tar.zst) into `dest`; returns its size. The archive's last
        member is its manifest, so a cut-off download never imports (TransportError here as well)."""
        url = self._workspace(ns, ws, "export")
        written = 0
        try:
            timeout = self._timeout(LIFECYCLE_TIMEOUT)
            with self._http.stream("GET", url, timeout=timeout) as response:
                if response.status_code != 200:
                    _raise_for_status(response, _read_capped(response))
                for chunk in response.iter_raw(COPY_CHUNK):
                    dest.write(chunk)
                    written += len(chunk)
                    if on_progress is not None:
                        on_progress(written)
        except httpx.TransportError as exc:
            raise _transport_error(f"GET {_path(url)} broke off", exc) from None
        return written

    def import_archive(
        self, ns: str, ws: str, source: IO[bytes], *, on_progress: Callable[[int], Any] | None = None
    ) -> dict:
        """Upload an export archive (a file or a pipe, streamed) into a stopped or never-booted workspace."""

        def chunks() -> Iterator[bytes]:
            sent = 0
            while chunk := source.read(COPY_CHUNK):
                sent += len(chunk)
                if on_progress is not None:
                    on_progress(sent)
                yield chunk

        headers = {"Content-Type": "application/zstd"}
        try:
            size = os.fstat(source.fileno()).st_size - source.tell()
            if size > 0 and stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                headers["Content-Length"] = str(size)
        except (OSError, AttributeError, ValueError):
            pass  # a pipe: sent chunked
        url = self._workspace(ns, ws, "import")
        return self._json("PUT", url, content=chunks(), headers=headers, read_timeout=LIFECYCLE_TIMEOUT)

    def stop(self, ns: str, ws: str, *, read_timeout: float = LIFECYCLE_TIMEOUT) -> dict:
        return self._json("POST", self._workspace(ns, ws, "stop"), read_timeout=read_timeout)

    def list_workspaces(
        self, namespace: str | None = None, *, limit: int | None = None, after: str | None = None
    ) -> dict:
        """One page of the workspaces the credential can see: {"workspaces": [...], "next": cursor or None}. An
        entry is a status object, or {"namespace", "workspace", "state": None, "error": code}."""
        params: dict[str, str] = {}
        if namespace is not None:
            params["namespace"] = check_name(namespace, "namespace")
        if limit is not None:
            params["limit"] = str(limit)
        if after is not None:
            params["after"] = after
        return self._json("GET", self._url("workspaces"), params=params)

    def iter_workspaces(self, namespace: str | None = None, *, page: int | None = None) -> Iterator[dict]:
        """Every workspace the credential can see, following `next` from page to page."""
        after = None
        while True:
            answer = self.list_workspaces(namespace, limit=page, after=after)
            yield from answer["workspaces"]
            after = answer.get("next")
            if not after:
                return

    # --- scoped keys and the audit log ----------------------------------------------------------------------

    def mint_key(
        self,
        namespace: str,
        scopes: list[str],
        *,
        workspace: str | None = None,
        expires_in: int | None = None,
        label: str | None = None,
        service: str | None = None,
    ) -> dict:
        """Mint a scoped key (deployment token only); the answer's `key` is the secret, shown this once. `service`
        binds a `proxy` key to one service of `workspace`: it then opens that service's /v1/proxy and nothing else."""
        body: dict[str, Any] = {"namespace": check_name(namespace, "namespace"), "scopes": list(scopes)}
        if workspace is not None:
            body["workspace"] = check_name(workspace, "workspace")
        if service is not None:
            body["service"] = service
        if expires_in is not None:
            body["expires_in"] = expires_in
        if label:
            body["label"] = label
        return self._json("POST", self._url("keys"), json=body)

    def list_keys(self, namespace: str | None = None) -> list[dict]:
        params = {} if namespace is None else {"namespace": check_name(namespace, "namespace")}
        return self._json("GET", self._url("keys"), params=params)["keys"]

    def revoke_key(self, key_id: str) -> dict:
        """Revoke a key by its id; returns the revoked key object (ApiError key_not_found if there is none)."""
        return self._json("DELETE", self._url("keys", check_key_id(key_id)))["key"]

    def list_audit(
        self,
        namespace: str | None = None,
        workspace: str | None = None,
        *,
        since: str | None = None,
        before: int | None = None,
        limit: int | None = None,
    ) -> dict:
        """One page of audit records, newest first: {"records": [...], "next": seq or None} (pass `before=next`
        for the following page)."""
        params: dict[str, str] = {}
        if namespace is not None:
            params["namespace"] = check_name(namespace, "namespace")
        if workspace is not None:
            params["workspace"] = check_name(workspace, "workspace")
        if since is not None:
            params["since"] = since
        if before is not None:
            params["before"] = str(before)
        if limit is not None:
            params["limit"] = str(limit)
        return self._json("GET", self._url("audit"), params=params)

    # --- commands -------------------------------------------------------------------------------------------

    def exec(self, ns: str, ws: str, request: dict, *, read_timeout: float = STREAM_READ_TIMEOUT) -> Iterator[dict]:
        """Run a command; yields its events in order, ending with the terminal `exit` or `error` event.
        HTTP errors before the stream (duplicate_request, workspace_not_found, …) raise ApiError on first next()."""
        check_request_id(request.get("request_id"))
        body = json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        if len(body) > MAX_BODY_BYTES:
            raise ValueError(f"exec request is {len(body)} bytes, over the {MAX_BODY_BYTES}-byte body limit")
        url = self._workspace(ns, ws, "exec")
        headers = {"Content-Type": "application/json"}
        return self._stream("POST", url, 0, read_timeout, content=body, headers=headers)

    def reattach(
        self, ns: str, ws: str, request_id: str, offset: int = 0, *, read_timeout: float = STREAM_READ_TIMEOUT
    ) -> Iterator[dict]:
        """Replay a command's output from `offset` (code points), follow it if still running, end with its
        terminal event."""
        if not _is_int(offset) or offset < 0:
            raise ValueError("offset must be a non-negative integer")
        url = self._workspace(ns, ws, "exec", check_request_id(request_id))
        return self._stream("GET", url, offset, read_timeout, params={"offset": str(offset)})

    def cancel(self, ns: str, ws: str, request_id: str) -> dict:
        return self._json("POST", self._workspace(ns, ws, "exec", check_request_id(request_id), "cancel"))

    def _stream(self, method: str, url: str, offset: int, read_timeout: float, **kwargs: Any) -> Iterator[dict]:
        try:
            with self._http.stream(method, url, timeout=self._timeout(read_timeout), **kwargs) as response:
                if response.status_code != 200:
                    _raise_for_status(response, _read_capped(response))
                if response.headers.get("content-type", "").split(";")[0].strip() != "application/x-ndjson":
                    raise ProtocolViolation(f"{method} {_path(url)} did not answer with an NDJSON stream")
                yield from events_exactly_once(iter_ndjson(response.iter_raw()), offset)
        except httpx.TransportError as exc:
            raise _transport_error(f"{method} {_path(url)} broke off", exc) from None

    # --- files ----------------------------------------------------------------------------------------------

    def read_file(
        self,
        ns: str,
        ws: str,
        path: str,
        dest: str | os.PathLike | IO[bytes],
        max_bytes: int | None = None,
        *,
        on_size: Callable[[int], Any] | None = None,
    ) -> int:
        """Stream a file from the workspace into `dest` (a path or a binary file object); returns its size.
        Over `max_bytes` → ApiError 413 file_too_large, before anything is written. A short body → TransportError
        (and a partial file at a path is removed). `on_size(size)` is called before the first byte is written."""
        url = self._workspace(ns, ws, "files")
        try:
            with self._http.stream("GET", url, params={"path": path}) as response:
                if response.status_code != 200:
                    _raise_for_status(response, _read_capped(response))
                length = response.headers.get("content-length")
                size = int(length) if length is not None and length.isdigit() else None
                if size is None:
                    raise ProtocolViolation("file download without a Content-Length")
                if max_bytes is not None and size > max_bytes:
                    raise ApiError(413, "file_too_large", f"the file is {size} bytes, over the {max_bytes}-byte limit")
                if on_size is not None:
                    on_size(size)
                return _copy_to(response.iter_raw(COPY_CHUNK), dest, size)
        except httpx.TransportError as exc:
            raise _transport_error(f"GET {_path(url)} broke off", exc) from None

    def write_file(self, ns: str, ws: str, path: str, data: bytes | IO[bytes], mode: int | str | None = None) -> dict:
        """Write bytes (or a binary file object, streamed from its current position) to `path` atomically."""
        params = {"path": path}
        if mode is not None:
            params["mode"] = mode if isinstance(mode, str) else format(mode, "04o")
        if isinstance(data, (bytes, bytearray, memoryview)):
            content: Any = bytes(data)
            size = len(content)
        else:
            size = os.fstat(data.fileno()).st_size - data.tell()
            content = _chunks(data, size)
        headers = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
        return self._json(
            "PUT",
            self._workspace(ns, ws, "files"),
            params=params,
            content=content,
            headers=headers,
            read_timeout=LIFECYCLE_TIMEOUT,
        )


def _path(url: str) -> str:
    return urlsplit(url).path


def _read_capped(response: httpx.Response, cap: int = MAX_ERROR_BODY_BYTES) -> bytes:
    body = bytearray()
    for chunk in response.iter_raw():
        body += chunk
        if len(body) >= cap:
            break
    return bytes(body[:cap])


def _raise_for_status(response: httpx.Response, body: bytes) -> None:
    status = response.status_code
    if 300 <= status < 400:
        raise ApiError(status, "redirect_refused", f"the server answered with a redirect (HTTP {status}); not followed")
    if status >= 400 or status < 200:
        raise parse_error_body(status, body)


def _chunks(source: IO[bytes], size: int) -> Iterator[bytes]:
    remaining = size
    while remaining > 0:
        chunk = source.read(min(COPY_CHUNK, remaining))
        if not chunk:
            raise TransportError("the upload source ended before its announced size")
        remaining -= len(chunk)
        yield chunk


def _copy_to(chunks: Iterator[bytes], dest: str | os.PathLike | IO[bytes], size: int) -> int:
    if hasattr(dest, "write"):
        written = _drain(chunks, dest)
    else:
        try:
            with open(dest, "wb") as handle:
                written = _drain(chunks, handle)
            if written != size:
                raise TransportError(f"the download stopped at {written} of {size} bytes")
        except BaseException:
            try:
                os.unlink(dest)
            except OSError:
                pass
            raise
    if written != size:
        raise TransportError(f"the download stopped at {written} of {size} bytes")
    return written


def _drain(chunks: Iterator[bytes], handle: IO[bytes]) -> int:
    written = 0
    for chunk in chunks:
        handle.write(chunk)
        written += len(chunk)
    return written
