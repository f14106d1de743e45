"""GET and PUT /files: stream a file out of, or into, the workspace without holding it in memory.

Descriptors come from the file agent (the sandbox user's rights); bytes are moved here: with sendfile(2) for GET
(small files, and files whose size is unknown like /proc's, are read whole), in the chunks the connection delivers
for PUT.
"""

import asyncio
import errno
import os
import socket

from flarebox_supervisor.httpserver import Request, Response, StreamResponse, json_response
from protocol.errors import ProtocolError
from protocol.validate import parse_file_mode, validate_abs_path, validate_offset

_UNIX_SEND_BUFFER = 4 * 1024 * 1024
# Files reporting at most this size are read whole instead of sent with sendfile, up to _READ_WHOLE_MAX bytes: a
# procfs file (size 0) can hold far more than it reports (/proc/self/pagemap), and this one is held in memory.
_READ_WHOLE_BYTES = 64 * 1024
_READ_WHOLE_MAX = 16 * 1024 * 1024


def _widen_unix_send_buffer(transport) -> None:
    """A unix socket's default send buffer (~200 KiB) makes sendfile wake up thousands of times per 100 MiB; ask
    for more (the kernel caps it at net.core.wmem_max). TCP sockets are left alone: fixing their buffer size would
    switch off the kernel's autotuning."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _UNIX_SEND_BUFFER)
        except OSError:
            pass


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while chunk := os.read(fd, 1024 * 1024):
        size += len(chunk)
        if size > limit:
            raise ProtocolError("file_too_large", f"the file has more than {limit} bytes, the limit for this read")
        chunks.append(chunk)
    return b"".join(chunks)


def _query(request: Request, allowed: set[str]) -> dict[str, str]:
    query = request.query
    for key in query:
        if key not in allowed:
            raise ProtocolError("invalid_query", f"unknown query parameter {key!r}")
        if key in query.repeated:
            raise ProtocolError("invalid_query", f"{key} is given more than once")
    return dict(query)


def _limit(query: dict, default: int) -> int:
    if "max_bytes" not in query:
        return default
    return min(validate_offset(query["max_bytes"]), default)


def _path(query: dict) -> str:
    if "path" not in query:
        raise ProtocolError("invalid_query", "path is required")
    return validate_abs_path(query["path"])


async def get_file(request: Request) -> StreamResponse:
    query = _query(request, {"path", "max_bytes"})
    path = _path(query)
    limit = _limit(query, request.app["settings"].max_file_read_bytes)
    result, fd = await request.app["files"].call("open_read", path=path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ProtocolError("file_too_large", f"the file has {size} bytes; the limit is {limit}")
        if size <= _READ_WHOLE_BYTES:
            # Small files are read whole and sent with their real length: procfs reports 0 bytes and sysfs 4096
            # for files that hold something else, and sendfile refuses a count of 0.
            body = await asyncio.to_thread(_read_at_most, fd, min(limit, _READ_WHOLE_MAX))
            return Response(body=body, headers={"Content-Type": "application/octet-stream"})
        response = StreamResponse(headers={"Content-Type": "application/octet-stream"}, content_length=size)
        await response.prepare(request)
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("the client went away")
        _widen_unix_send_buffer(transport)
        # zero-copy from the file to the socket where the kernel can (asyncio falls back to read/write otherwise)
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as source:
            sent = await asyncio.get_running_loop().sendfile(transport, source, 0, size)
        if sent < size:  # the file shrank: the promised length cannot be met, so the connection must break
            transport.close()
            return response
        await response.write_eof()
        return response
    finally:
        os.close(fd)


DISK_FULL = (
    "the workspace's disk is full: the file was not written and the previous one at that path is untouched; free"
    " space in the workspace (or ask the operator) and retry"
)


async def put_file(request: Request) -> Response:
    query = _query(request, {"path", "mode", "max_bytes"})
    path = _path(query)
    mode = parse_file_mode(query.get("mode"))
    limit = _limit(query, request.app["settings"].max_file_write_bytes)
    length = request.content_length
    if length is None:
        raise ProtocolError("length_required")
    if length > limit:
        raise ProtocolError("file_too_large", f"the body has {length} bytes; the limit is {limit}")
    files = request.app["files"]
    result, fd = await files.call("create_temp", path=path)
    temp, committed = result["temp"], False
    try:
        written = 0
        while True:
            chunk = await request.readany()
            if not chunk:
                break
            written += len(chunk)
            if written > length:
                raise ProtocolError("file_too_large", "the body is longer than its Content-Length")
            view = memoryview(chunk)
            try:
                while view:
                    view = view[os.write(fd, view) :]
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise ProtocolError("storage_full", DISK_FULL) from None
                raise
        if written != length:
            raise ProtocolError("invalid_field", "the body ended before its Content-Length")
        os.close(fd)
        fd = -1
        await files.call("commit", temp=temp, path=path, mode=mode)
        committed = True
    finally:
        if fd >= 0:
            os.close(fd)
        if not committed:
            await files.call("abort", temp=temp)
    return json_response({"path": path, "size": written})
