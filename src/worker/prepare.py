"""How each route's request becomes its operation's typed arguments: one function per route (worker/routes.py).

Every function validates its query, headers and body in the protocol's order and raises ProtocolError before the
workspace is called; none reads a body its route does not take.
"""

from durable.operations import (
    ArchiveArgs,
    CancelArgs,
    DeleteFileArgs,
    ExecArgs,
    ForkSource,
    ImportArgs,
    NoArgs,
    PatchSnapshotArgs,
    ProxyArgs,
    PutConfigArgs,
    PutSecretArgs,
    PutServiceArgs,
    ReadFileArgs,
    ReattachArgs,
    RestoreArgs,
    SecretArgs,
    ServiceArgs,
    ServiceLogsArgs,
    SignalArgs,
    SnapshotArgs,
    StatArgs,
    WriteFileArgs,
)
from durable.settings import Settings
from protocol import limits
from protocol import proxy as proxy_policy
from protocol.errors import ProtocolError
from protocol.files import (
    ListRequest,
    MkdirRequest,
    MoveRequest,
    parse_list_query,
    parse_mkdir_request,
    parse_move_request,
    parse_recursive,
    parse_signal_request,
)
from protocol.pty import PtyRequest, parse_pty_query
from protocol.services import parse_secret_value, parse_service
from protocol.snapshots import parse_fork_source, parse_restore_request, parse_snapshot_patch, parse_snapshot_request
from protocol.validate import (
    WorkspaceConfig,
    parse_exec_request,
    parse_file_mode,
    parse_json_object,
    parse_workspace_config,
    validate_abs_path,
    validate_offset,
)
from worker.query import parse_query
from worker.request import EdgeRequest, PathParams

NO_PARAMS: frozenset[str] = frozenset()


def content_length(req: EdgeRequest) -> int | None:
    """The declared body length; None when absent. Raises ValueError when malformed."""
    raw = req.headers.get("content-length")
    if raw is None:
        return None
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise ValueError("malformed Content-Length")
    return int(raw)


def _is_json(content_type: str | None) -> bool:
    return content_type is not None and content_type.partition(";")[0].strip().lower() == "application/json"


async def read_json(req: EdgeRequest, *, empty_ok: bool) -> dict:
    is_json = _is_json(req.headers.get("content-type"))
    if not is_json and not empty_ok:
        raise ProtocolError("unsupported_media_type")
    try:
        length = content_length(req)
    except ValueError:
        raise ProtocolError("invalid_json", "malformed Content-Length") from None
    if length is not None and length > limits.MAX_BODY_BYTES:
        raise ProtocolError("payload_too_large", f"JSON bodies are limited to {limits.MAX_BODY_BYTES} bytes")
    data = await req.body.read(limits.MAX_BODY_BYTES) if req.body is not None else b""
    if not is_json:
        # `curl -X PUT` without a body means "all defaults"; a body of another type is refused.
        if data.strip():
            raise ProtocolError("unsupported_media_type")
        return {}
    return parse_json_object(data)


def _path_param(params: dict[str, str]) -> str:
    if "path" not in params:
        raise ProtocolError("invalid_query", "the path parameter is required")
    return validate_abs_path(params["path"])


def _upload_length(req: EdgeRequest, settings: Settings) -> int:
    try:
        length = content_length(req)
    except ValueError:
        length = None
    if length is None:
        raise ProtocolError("length_required")
    if length > settings.max_file_write_bytes:
        raise ProtocolError("file_too_large", f"uploads are limited to {settings.max_file_write_bytes} bytes")
    return length


def _deployment_config(config: WorkspaceConfig, settings: Settings) -> WorkspaceConfig:
    """The config checked against what this deployment offers, with its default instance type filled in."""
    if config.image not in settings.images:
        raise ProtocolError("image_not_found", f"images defined here: {', '.join(settings.images)}")
    instance = config.instance or settings.default_instance_type
    if instance not in settings.allowed_instance_types:
        raise ProtocolError(
            "instance_not_allowed", f"allowed instance types: {', '.join(settings.allowed_instance_types)}"
        )
    return WorkspaceConfig(config.image, instance, config.persistent, config.cwd)


# --- one function per route: (request, the path's parameters, settings) -> the operation's arguments ---------


async def no_args(req: EdgeRequest, params: PathParams, settings: Settings) -> NoArgs:
    parse_query(req.query, NO_PARAMS)
    return NoArgs()


async def delete(req: EdgeRequest, params: PathParams, settings: Settings) -> NoArgs:
    params = parse_query(req.query, frozenset({"confirm"}))
    if params.get("confirm") != "true":
        raise ProtocolError("confirm_required")
    return NoArgs()


async def put_config(req: EdgeRequest, params: PathParams, settings: Settings) -> PutConfigArgs:
    parse_query(req.query, NO_PARAMS)
    obj = await read_json(req, empty_ok=True)
    source = None
    if "from" in obj:  # a fork: the edge shares the source's snapshot before the PUT reaches the workspace
        source = ForkSource(*parse_fork_source(obj.pop("from")), image_given="image" in obj)
    return PutConfigArgs(_deployment_config(parse_workspace_config(obj), settings), source)


async def snapshot(req: EdgeRequest, params: PathParams, settings: Settings) -> SnapshotArgs:
    parse_query(req.query, NO_PARAMS)
    return SnapshotArgs(*parse_snapshot_request(await read_json(req, empty_ok=True)))


async def patch_snapshot(req: EdgeRequest, params: PathParams, settings: Settings) -> PatchSnapshotArgs:
    parse_query(req.query, NO_PARAMS)
    set_label, label, keep = parse_snapshot_patch(await read_json(req, empty_ok=False))
    return PatchSnapshotArgs(_required(params.name), label=label, set_label=set_label, keep=keep)


async def restore(req: EdgeRequest, params: PathParams, settings: Settings) -> RestoreArgs:
    parse_query(req.query, NO_PARAMS)
    return RestoreArgs(*parse_restore_request(await read_json(req, empty_ok=False)))


async def import_(req: EdgeRequest, params: PathParams, settings: Settings) -> ImportArgs:
    """An archive upload: streamed to the supervisor, which verifies it as it extracts; its length is optional
    (a CLI pipes `zstd` output of unknown size) and bounded by the supervisor's MAX_IMPORT_BYTES."""
    parse_query(req.query, NO_PARAMS)
    return ImportArgs(_archive_length(req))


def _archive_length(req: EdgeRequest) -> int | None:
    try:
        length = content_length(req)
    except ValueError:
        raise ProtocolError("invalid_field", "malformed Content-Length") from None
    if length is not None and length > limits.MAX_IMPORT_BYTES:
        raise ProtocolError("payload_too_large", f"archives are limited to {limits.MAX_IMPORT_BYTES} bytes")
    return length


async def exec_(req: EdgeRequest, params: PathParams, settings: Settings) -> ExecArgs:
    parse_query(req.query, NO_PARAMS)
    obj = await read_json(req, empty_ok=False)
    return ExecArgs(parse_exec_request(obj))  # the workspace trusts this; the supervisor checks it again


async def reattach(req: EdgeRequest, params: PathParams, settings: Settings) -> ReattachArgs:
    query = parse_query(req.query, frozenset({"offset"}))
    offset = validate_offset(query["offset"]) if "offset" in query else 0
    return ReattachArgs(_required(params.request_id), offset)


async def cancel(req: EdgeRequest, params: PathParams, settings: Settings) -> CancelArgs:
    parse_query(req.query, NO_PARAMS)
    return CancelArgs(_required(params.request_id))


async def read_file(req: EdgeRequest, params: PathParams, settings: Settings) -> ReadFileArgs:
    params = parse_query(req.query, frozenset({"path"}))
    return ReadFileArgs(_path_param(params))


async def list_files(req: EdgeRequest, params: PathParams, settings: Settings) -> ListRequest:
    query = parse_query(req.query, frozenset({"path", "list", "depth", "limit", "cursor"}))
    if query.pop("list") not in ("1", "true"):
        raise ProtocolError("invalid_query", "list is 1 (or true) to list a directory")
    return parse_list_query(query)


async def stat_file(req: EdgeRequest, params: PathParams, settings: Settings) -> StatArgs:
    return StatArgs(_path_param(parse_query(req.query, frozenset({"path"}))))


async def delete_file(req: EdgeRequest, params: PathParams, settings: Settings) -> DeleteFileArgs:
    query = parse_query(req.query, frozenset({"path", "recursive"}))
    return DeleteFileArgs(_path_param(query), parse_recursive(query.get("recursive")))


async def move_file(req: EdgeRequest, params: PathParams, settings: Settings) -> MoveRequest:
    parse_query(req.query, NO_PARAMS)
    return parse_move_request(await read_json(req, empty_ok=False))


async def make_dir(req: EdgeRequest, params: PathParams, settings: Settings) -> MkdirRequest:
    parse_query(req.query, NO_PARAMS)
    return parse_mkdir_request(await read_json(req, empty_ok=False))


async def get_archive(req: EdgeRequest, params: PathParams, settings: Settings) -> ArchiveArgs:
    return ArchiveArgs(_path_param(parse_query(req.query, frozenset({"path"}))))


async def put_archive(req: EdgeRequest, params: PathParams, settings: Settings) -> ArchiveArgs:
    """A directory's archive: streamed to the supervisor, which checks every member as it extracts; its length
    is optional (`tar | zstd` has none) and bounded like an import's."""
    path = _path_param(parse_query(req.query, frozenset({"path"})))
    return ArchiveArgs(path, _archive_length(req))


async def pty(req: EdgeRequest, params: PathParams, settings: Settings) -> PtyRequest:
    request = parse_pty_query(parse_query(req.query, frozenset({"session", "cols", "rows", "offset"})))
    if req.socket is None:
        raise ProtocolError("websocket_required")
    return request


async def signal_process(req: EdgeRequest, params: PathParams, settings: Settings) -> SignalArgs:
    parse_query(req.query, NO_PARAMS)
    request = parse_signal_request(await read_json(req, empty_ok=False))
    if params.pid is None:
        raise ProtocolError("invalid_pid")
    return SignalArgs(params.pid, request)


async def write_file(req: EdgeRequest, params: PathParams, settings: Settings) -> WriteFileArgs:
    params = parse_query(req.query, frozenset({"path", "mode"}))
    path = _path_param(params)
    mode = parse_file_mode(params.get("mode"))
    return WriteFileArgs(path, mode, _upload_length(req, settings))


async def put_service(req: EdgeRequest, params: PathParams, settings: Settings) -> PutServiceArgs:
    parse_query(req.query, NO_PARAMS)
    spec = parse_service(await read_json(req, empty_ok=False))
    return PutServiceArgs(_required(params.name), spec.to_json())


async def service(req: EdgeRequest, params: PathParams, settings: Settings) -> ServiceArgs:
    parse_query(req.query, NO_PARAMS)
    return ServiceArgs(_required(params.name))


async def service_logs(req: EdgeRequest, params: PathParams, settings: Settings) -> ServiceLogsArgs:
    query = parse_query(req.query, frozenset({"offset"}))
    offset = validate_offset(query["offset"]) if "offset" in query else 0
    return ServiceLogsArgs(_required(params.name), offset)


async def put_secret(req: EdgeRequest, params: PathParams, settings: Settings) -> PutSecretArgs:
    parse_query(req.query, NO_PARAMS)
    return PutSecretArgs(_required(params.name), parse_secret_value(await read_json(req, empty_ok=False)))


async def secret(req: EdgeRequest, params: PathParams, settings: Settings) -> SecretArgs:
    parse_query(req.query, NO_PARAMS)
    return SecretArgs(_required(params.name))


async def proxy(req: EdgeRequest, params: PathParams, settings: Settings) -> ProxyArgs:
    """A proxied request: its path normalized before any allow-list sees it, its headers stripped of the caller's
    credentials (the token, a key, Access' JWT and cookie never enter a container), its body bounded."""
    try:
        length = content_length(req)
    except ValueError:
        raise ProtocolError("invalid_field", "malformed Content-Length") from None
    if length is not None and length > limits.MAX_PROXY_BODY_BYTES:
        raise ProtocolError("payload_too_large", f"proxied bodies are limited to {limits.MAX_PROXY_BODY_BYTES} bytes")
    headers = proxy_policy.request_headers(
        req.headers,
        client_ip=req.client_ip,
        scheme=req.scheme,
        host=req.headers.get("host", ""),
        prefix=_required(params.prefix),
    )
    return ProxyArgs(
        method=req.method,
        path=proxy_policy.normalize_path(_required(params.tail)),
        query=req.query,
        headers=headers,
        port=params.port,
    )


def _required(value: str | None) -> str:
    if value is None:  # a route table bug: only routes with that placeholder use these
        raise ProtocolError("not_found")
    return value
