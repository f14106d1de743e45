"""The edge (the Worker's logic): Access, credentials, routing, authorization, validation, then one call to the
workspace or the directory, and an audit record of what changed.

Order per request: Cloudflare Access (when configured) → credential → route → authorization → query → body limits
→ body parse → call → audit. Nothing before authorization reads the body or touches a workspace, and every
validation error is answered before the workspace is called. The workspace's Response (often a stream) is
returned untouched.
"""

import asyncio
import dataclasses
import json
import logging
import time
import traceback
from typing import Any, Protocol

from directory.audit import AuditRecord, redact
from durable import operations as ops
from durable.ports import DirectoryStub, Response, Workspaces
from durable.settings import Settings
from durable.timefmt import parse_iso_ms
from protocol import PROTOCOL_VERSION, limits
from protocol.errors import ProtocolError
from protocol.files import MkdirRequest, MoveRequest
from protocol.keys import parse_key_request, split_key, validate_key_id
from protocol.pty import PtyRequest
from protocol.validate import validate_name
from worker import prepare
from worker.auth import TokenCheck, credential
from worker.authorize import ADMIN, ADMIN_ONLY, Principal, allows, may_list, proxy_target
from worker.prepare import NO_PARAMS, read_json
from worker.query import parse_query
from worker.request import EdgeRequest
from worker.routes import DeploymentEndpoint, Endpoint, MethodNotAllowed, Route, is_proxied, match

log = logging.getLogger("flarebox.edge")

DEFAULT_PAGE = 100  # records or workspaces one listing answers unless `limit` says otherwise


class AccessGate(Protocol):
    """Cloudflare Access in front of every route (worker/access.py); absent when not configured."""

    async def check(self, headers: dict[str, str]) -> None:
        """Raise ProtocolError('access_denied') unless the request carries a valid Access JWT."""


class Edge:
    def __init__(
        self,
        *,
        token: str | None,
        settings: Settings,
        workspaces: Workspaces,
        directory: DirectoryStub,
        version: str,
        access: AccessGate | None = None,
    ):
        self._auth = TokenCheck(token)
        self._token = token
        self._settings = settings
        self._workspaces = workspaces
        self._directory = directory
        self._version = version
        self._access = access

    async def handle(self, req: EdgeRequest) -> Response:
        started = time.monotonic()
        principal: Principal | None = None
        route: Route | None = None
        detail: dict[str, Any] = {}
        try:
            if self._access is not None:
                await self._access.check(req.headers)
            principal = await self._principal(credential(req.headers, websocket=req.socket is not None))
            route = match(req.method, req.path, req.query)
            endpoint = route.endpoint
            if isinstance(endpoint, DeploymentEndpoint):
                if endpoint.need is ADMIN_ONLY and not principal.admin:
                    raise ProtocolError("forbidden", "only the deployment token manages keys")
                response = await getattr(self, f"_{endpoint.name}")(req, route, principal, detail)
            else:
                response = await self._workspace_call(req, route, endpoint, principal, detail)
        except MethodNotAllowed as err:
            response = Response.error(err)
            response.headers["allow"] = err.allow
        except ProtocolError as err:
            response = Response.error(self._redacted(err))
        except Exception as exc:  # never leak exception text to the client
            self._log_unexpected(req, exc)
            response = Response.error(ProtocolError("internal_error"))
        if principal is not None and route is not None and route.endpoint.audited:
            await self._audit(principal, route, response, detail, started)
        if is_proxied(req.path) and _code_of(_json_of(response)) is not None:
            # on a proxied route a client must tell Flarebox's own refusal from the service's answer (which can
            # never carry this header: x-flarebox-* is dropped from every proxied answer)
            response.headers["x-flarebox-error"] = _code_of(_json_of(response))
        return response

    # --- credentials --------------------------------------------------------------------------------------------

    async def _principal(self, presented: str) -> Principal:
        self._auth.require_configured()
        if self._auth.is_token(presented):
            return ADMIN
        if split_key(presented) is None:  # refused here: garbage never loads the directory
            raise ProtocolError("unauthorized")
        record = await self._ask("verify_key", {"key": presented})
        return Principal(
            key_id=record["id"],
            label=record["label"],
            namespace=record["namespace"],
            workspace=record["workspace"],
            scopes=frozenset(record["scopes"]),
            service=record.get("service"),
        )

    async def _ask(self, op: str, args: dict[str, Any]) -> Any:
        """One call to the directory object. A refusal passes through; a directory that cannot answer is 503 —
        never a request let through unchecked."""
        try:
            return await self._directory.call(op, args)
        except ProtocolError:
            raise
        except Exception:
            log.exception("the directory failed on %s", op)
            raise ProtocolError("directory_unavailable") from None

    # --- workspace routes ---------------------------------------------------------------------------------------

    async def _workspace_call(
        self, req: EdgeRequest, route: Route, endpoint: Endpoint, principal: Principal, detail: dict[str, Any]
    ) -> Response:
        if not allows(principal, endpoint.need, route.namespace, route.workspace):
            raise ProtocolError("forbidden")
        args = await endpoint.prepare(req, route.params, self._settings)
        detail.update(_detail_of(args, self._token))
        body = _body_of(req, endpoint.operation)
        stub = self._workspaces.get(route.namespace, route.workspace)
        if endpoint.operation is ops.PUT_CONFIG:
            return await self._create(route, stub, args, principal)
        response = await stub.call(endpoint.operation.name, args, body)
        if _forgotten(endpoint.operation, response):
            await self._unindex(route.namespace, route.workspace)
        return response

    async def _create(self, route: Route, stub: Any, args: Any, principal: Principal) -> Response:
        """PUT of a workspace: a slot in the index first (the namespace cap), given back when the workspace turns
        out not to exist after a failed create (it may exist all the same: a concurrent PUT made it). A fork
        first has its source share a snapshot."""
        if args.source is not None:
            shared = await self._share_source(route, stub, args, principal)
            if isinstance(shared, Response):
                return shared
            args = shared
        reserved = await self._reserve(route.namespace, route.workspace)
        failed = True  # until the workspace answered 2xx: an exception (or cancellation) counts as a failure
        try:
            response = await stub.call(ops.PUT_CONFIG.name, args)
            failed = response.status >= 300
            return response
        finally:
            if failed and reserved["created"]:
                await self._unindex_if_gone(route.namespace, route.workspace)

    async def _share_source(
        self, route: Route, stub: Any, args: ops.PutConfigArgs, principal: Principal
    ) -> ops.PutConfigArgs | Response:
        """A fork's source: the caller needs `snapshots` on it too (403 whether it exists or not). A workspace that
        exists already answers its PUT as always (200, or config_conflict) without a new snapshot of the source.
        The fork gets the source's image: a snapshot holds that image's files."""
        source = args.source
        if not allows(principal, "snapshots", source.namespace, source.workspace):
            raise ProtocolError("forbidden", "the key does not open the workspace to fork from")
        if (source.namespace, source.workspace) == (route.namespace, route.workspace):
            raise ProtocolError("invalid_field", "a workspace cannot be forked from itself")
        existing = await stub.call(ops.GET.name, ops.NoArgs())
        if existing.status == 200:
            # answered as any PUT (200, or config_conflict), the fork's inherited image included
            status = _json_of(existing)
            config = args.config
            if not source.image_given and isinstance(status, dict) and isinstance(status.get("config"), dict):
                config = dataclasses.replace(config, image=status["config"].get("image", config.image))
            return dataclasses.replace(args, source=None, config=config)
        answer = await self._workspaces.get(source.namespace, source.workspace).call(
            ops.SHARE_SNAPSHOT.name, ops.ShareArgs(source.snapshot)
        )
        shared = _json_of(answer)
        if answer.status != 200 or not isinstance(shared, dict):
            if _code_of(shared) == "workspace_not_found":  # not this PUT's workspace: say which is missing
                raise ProtocolError(
                    "workspace_not_found",
                    f"the workspace to fork from, {source.namespace}/{source.workspace}, does not exist",
                )
            return answer  # the source's refusal: snapshot_not_found, not_persistent, nothing_to_snapshot, …
        config = args.config
        if config.image != shared["image"]:
            if source.image_given:
                raise ProtocolError(
                    "invalid_field", f"a fork runs its source's image ({shared['image']}): omit image or send that"
                )
            config = dataclasses.replace(config, image=shared["image"])
        return dataclasses.replace(args, config=config, fork=shared["ref"])

    async def _reserve(self, namespace: str, workspace: str) -> dict[str, bool]:
        """A slot for the workspace. At the cap, the index may still count ephemeral workspaces that forgot
        themselves when they went idle: those are dropped and the slot asked for once more."""
        args = {"namespace": namespace, "workspace": workspace}
        try:
            return await self._ask("reserve_workspace", args)
        except ProtocolError as err:
            if err.code != "quota_exceeded":
                raise
        after = None
        while True:
            page = await self._ask(
                "list_workspaces",
                {"namespace": namespace, "workspace": None, "after": after, "limit": limits.MAX_PAGE_RECORDS},
            )
            await asyncio.gather(*(self._unindex_if_gone(ns, ws) for ns, ws in page["workspaces"]))
            after = page["next"]
            if after is None:
                return await self._ask("reserve_workspace", args)

    async def _unindex_if_gone(self, namespace: str, workspace: str) -> None:
        try:
            response = await self._workspaces.get(namespace, workspace).call(ops.GET.name, ops.NoArgs())
        except Exception:
            log.exception("could not check whether %s/%s exists", namespace, workspace)
            return  # kept: a slot too many beats a workspace missing from the index
        if _code_of(_json_of(response)) == "workspace_not_found":
            await self._unindex(namespace, workspace)

    async def _unindex(self, namespace: str, workspace: str) -> None:
        """Drop a workspace that is gone from the index. Best effort: the workspace's own answer stands whatever
        happens here (an entry left behind is dropped by the next listing, or when the namespace is at its cap)."""
        try:
            await self._ask("unindex_workspace", {"namespace": namespace, "workspace": workspace})
        except ProtocolError as err:
            log.error("could not drop %s/%s from the index (%s)", namespace, workspace, err.code)

    # --- deployment routes --------------------------------------------------------------------------------------

    async def _proxy(self, req: EdgeRequest, route: Route, principal: Principal, detail: dict) -> Response:
        """/v1/proxy/{path…}: the workspace and service come from the key, server-side; the path cannot name them."""
        target = proxy_target(principal)
        if target is None:
            raise ProtocolError("forbidden", "/v1/proxy needs a proxy key bound to a service (POST /v1/keys)")
        namespace, workspace, service = target
        args = dataclasses.replace(await prepare.proxy(req, route.params, self._settings), service=service)
        stub = self._workspaces.get(namespace, workspace)
        return await stub.call(ops.PROXY.name, args, _body_of(req, ops.PROXY))

    async def _health(self, req: EdgeRequest, route: Route, principal: Principal, detail: dict) -> Response:
        parse_query(req.query, NO_PARAMS)
        return Response.json(200, {"ok": True, "protocol": PROTOCOL_VERSION, "version": self._version})

    async def _mint_key(self, req: EdgeRequest, route: Route, principal: Principal, detail: dict) -> Response:
        parse_query(req.query, NO_PARAMS)
        request = parse_key_request(await read_json(req, empty_ok=False))
        detail.update(target=(request.namespace, request.workspace))
        minted = await self._ask("mint_key", {"request": dataclasses.asdict(request)})
        detail.update(target_key_id=minted["id"], scopes=minted["scopes"])
        if minted.get("service") is not None:
            detail.update(service=minted["service"])
        return Response.json(201, minted, {"cache-control": "no-store"})

    async def _list_keys(self, req: EdgeRequest, route: Route, principal: Principal, detail: dict) -> Response:
        query = parse_query(req.query, frozenset(("namespace",)))
        namespace = _name_param(query, "namespace")
        return Response.json(200, {"keys": await self._ask("list_keys", {"namespace": namespace})})

    async def _revoke_key(self, req: EdgeRequest, route: Route, principal: Principal, detail: dict) -> Response:
        parse_query(req.query, NO_PARAMS)
        key_id = validate_key_id(route.key_id)
        detail.update(target_key_id=key_id)
        revoked = await self._ask("revoke_key", {"key_id": key_id})
        detail.update(target=(revoked["namespace"], revoked["workspace"]))
        return Response.json(200, {"revoked": True, "key": revoked})

    async def _list_workspaces(self, req: EdgeRequest, route: Route, principal: Principal, detail: dict) -> Response:
        query = parse_query(req.query, frozenset(("namespace", "limit", "after")))
        namespace = _name_param(query, "namespace")
        if not may_list(principal, namespace):
            raise ProtocolError("forbidden")
        if not principal.admin:
            namespace = principal.namespace
        page = await self._ask(
            "list_workspaces",
            {
                "namespace": namespace,
                "workspace": principal.workspace,
                "after": _cursor_param(query),
                "limit": _limit_param(query),
            },
        )
        entries = await asyncio.gather(*(self._status(ns, ws) for ns, ws in page["workspaces"]))
        return Response.json(200, {"workspaces": [e for e in entries if e is not None], "next": page["next"]})

    async def _status(self, namespace: str, workspace: str) -> dict[str, Any] | None:
        """A listed workspace's status object; None (and out of the index) when it no longer exists — an
        ephemeral workspace forgets itself when it goes idle."""
        try:
            answer = _json_of(await self._workspaces.get(namespace, workspace).call(ops.GET.name, ops.NoArgs()))
        except Exception:
            log.exception("listing: the status of %s/%s failed", namespace, workspace)
            answer = None
        code = _code_of(answer)
        if code is None and isinstance(answer, dict):
            return answer  # a JSON answer that is not an error is the status object
        if code == "workspace_not_found":
            await self._unindex(namespace, workspace)
            return None
        return {"namespace": namespace, "workspace": workspace, "state": None, "error": code or "internal_error"}

    async def _list_audit(self, req: EdgeRequest, route: Route, principal: Principal, detail: dict) -> Response:
        query = parse_query(req.query, frozenset(("namespace", "workspace", "since", "before", "limit")))
        namespace = _name_param(query, "namespace")
        workspace = _name_param(query, "workspace")
        if workspace is not None and namespace is None:
            raise ProtocolError("invalid_query", "workspace needs namespace")
        if not principal.admin and ("manage" not in principal.scopes or not may_list(principal, namespace, workspace)):
            raise ProtocolError("forbidden")
        if not principal.admin:
            namespace, workspace = principal.namespace, workspace or principal.workspace
        since_ms = None
        if "since" in query:
            since_ms = parse_iso_ms(query["since"])
            if since_ms is None:
                raise ProtocolError("invalid_query", "since is a timestamp such as 2026-12-01T09:00:00Z")
        before = None
        if "before" in query:
            if not (query["before"].isascii() and query["before"].isdigit() and len(query["before"]) <= 18):
                raise ProtocolError("invalid_query", "before is the `next` of the previous page")
            before = int(query["before"])
        page = await self._ask(
            "list_audit",
            {
                "namespace": namespace,
                "workspace": workspace,
                "since_ms": since_ms,
                "before": before,
                "limit": _limit_param(query),
            },
        )
        return Response.json(200, page)

    # --- audit --------------------------------------------------------------------------------------------------

    async def _audit(
        self, principal: Principal, route: Route, response: Response, detail: dict[str, Any], started: float
    ) -> None:
        endpoint = route.endpoint
        namespace, workspace = detail.pop("target", (route.namespace, route.workspace))
        operation = endpoint.name if isinstance(endpoint, DeploymentEndpoint) else endpoint.operation.name
        record = AuditRecord(
            key_id=principal.key_id,
            key_label=None if principal.admin else principal.label,
            namespace=namespace,
            workspace=workspace,
            operation=operation,
            request_id=detail.pop("request_id", None),
            status=response.status,
            code=_code_of(_json_of(response)),  # only an error answer has one
            duration_ms=int((time.monotonic() - started) * 1000),
            detail=detail,
        )
        try:
            await self._ask("append_audit", {"record": record.to_json()})
        except ProtocolError:
            # the request already happened; its answer stands, and the gap is in the log for the operator
            log.error("audit record lost for %s on %s/%s (%s)", operation, namespace, workspace, response.status)

    # --- errors -------------------------------------------------------------------------------------------------

    def _redacted(self, err: ProtocolError) -> ProtocolError:
        """Messages may quote what the client sent (an unknown field or query key): never quote a secret back."""
        message = redact(err.message, self._token)
        return err if message == err.message else ProtocolError(err.code, message)

    def _log_unexpected(self, req: EdgeRequest, exc: Exception) -> None:
        text = redact("".join(traceback.format_exception(exc)), self._token)  # a secret never reaches a log
        log.error("internal error on %s %s\n%s", req.method, req.path[:200], text)


def _detail_of(args: Any, token: str | None) -> dict[str, Any]:
    """What the audit log keeps of an operation's arguments: a command's text, a file's path and size (text the
    caller chose, so redacted: a caller may quote a secret in it)."""
    if isinstance(args, ops.ExecArgs):
        return {"request_id": args.request.request_id, "command": redact(args.request.command, token)}
    if isinstance(args, ops.CancelArgs):
        return {"request_id": args.request_id}
    if isinstance(args, ops.WriteFileArgs):
        return {"path": redact(args.path, token), "size": args.length}
    if isinstance(args, ops.PutServiceArgs):
        return {"service": args.name, "command": redact(args.spec["command"], token), "port": args.spec["port"]}
    if isinstance(args, ops.ServiceArgs):
        return {"service": args.name}
    if isinstance(args, ops.PutConfigArgs) and args.source is not None:
        source = args.source
        return {"from": f"{source.namespace}/{source.workspace}", "snapshot": source.snapshot}
    if isinstance(args, ops.SnapshotArgs) and (args.label is not None or args.keep):
        return {"label": redact(args.label or "", token), "keep": args.keep}
    if isinstance(args, ops.PatchSnapshotArgs):
        detail: dict[str, Any] = {"snapshot": args.snapshot_id, "keep": args.keep}
        if args.set_label:
            detail["label"] = None if args.label is None else redact(args.label, token)
        return detail
    if isinstance(args, ops.RestoreArgs):
        return {"snapshot": args.snapshot, "backup": args.backup, "discard_changes": args.discard_changes}
    if isinstance(args, ops.PutSecretArgs | ops.SecretArgs):
        return {"secret": args.name}  # the name only: a value is never recorded
    if isinstance(args, ops.DeleteFileArgs):
        return {"path": redact(args.path, token), "recursive": args.recursive}
    if isinstance(args, MoveRequest):
        return {"path": redact(args.source, token), "to": redact(args.target, token)}
    if isinstance(args, MkdirRequest | ops.ArchiveArgs):
        return {"path": redact(args.path, token)}
    if isinstance(args, ops.SignalArgs):
        return {"pid": args.pid, "signal": args.request.signal, "group": args.request.group}
    if isinstance(args, PtyRequest):
        return {"session": args.session}  # what is typed in a terminal is never recorded
    return {}


def _body_of(req: EdgeRequest, operation: ops.Operation) -> Any:
    """The request body a streaming operation is handed: a proxied one bounded as it passes (it may come without
    a length), a file upload as is (its Content-Length was checked). A proxied request without a body (a plain
    GET: neither Content-Length nor Transfer-Encoding, RFC 9112 6.3; on Cloudflare a null body) gets None from the
    runtime's `stream_at_most`: it is forwarded with no body at all, never an empty chunked one."""
    if operation.socket:
        return req.socket
    if not operation.streams_body or req.body is None:
        return None
    if operation is ops.PROXY:
        return req.body.stream_at_most(limits.MAX_PROXY_BODY_BYTES)
    if operation is ops.IMPORT:  # an archive piped from zstd may come without a length
        return req.body.stream_at_most(limits.MAX_IMPORT_BYTES)
    return req.body.stream


def _forgotten(operation: ops.Operation, response: Response) -> bool:
    """The call ended the workspace: a DELETE (or one already gone), or the stop of an ephemeral workspace."""
    if operation is ops.DELETE:
        return response.status == 200 or _code_of(_json_of(response)) == "workspace_not_found"
    answer = _json_of(response) if operation is ops.STOP and response.status == 200 else None
    return isinstance(answer, dict) and answer.get("deleted") is True


def _json_of(response: Response) -> Any:
    """A buffered JSON answer's value (None for a stream or anything else)."""
    if isinstance(response.body, bytes | bytearray) and response.body:
        try:
            return json.loads(response.body)
        except ValueError:
            pass
    return None


def _code_of(answer: Any) -> str | None:
    error = answer.get("error") if isinstance(answer, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _name_param(query: dict[str, str], name: str) -> str | None:
    if name not in query:
        return None
    try:
        return validate_name(query[name], name)
    except ProtocolError as err:
        raise ProtocolError("invalid_query", err.message) from None


def _limit_param(query: dict[str, str]) -> int:
    raw = query.get("limit")
    if raw is None:
        return DEFAULT_PAGE
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= limits.MAX_PAGE_RECORDS):
        raise ProtocolError("invalid_query", f"limit is a whole number from 1 to {limits.MAX_PAGE_RECORDS}")
    return int(raw)


def _cursor_param(query: dict[str, str]) -> str | None:
    raw = query.get("after")
    if raw is None:
        return None
    ns, _, ws = raw.partition("/")
    try:
        validate_name(ns)
        validate_name(ws)
    except ProtocolError:
        raise ProtocolError("invalid_query", "after is the `next` of the previous page") from None
    return raw
