"""POST /port-sockets/{port}: connect to 127.0.0.1:{port} inside the workspace and hand the connected socket over.

The standalone server's port proxy asks for one when it has no kept-alive connection to that port: the sandbox's
loopback lives in its own network namespace, which only the sandbox's processes reach, so the supervisor makes the
connection there and passes the descriptor back over the very unix connection the request came on (SCM_RIGHTS).
From then on the server speaks HTTP/1.1 to the service itself; no Python hop in the sandbox copies the bytes.

The answer is written here, not by httpserver.py: `HTTP/1.1 200 OK`, `Content-Length: 0`, `Connection: close`, with the
descriptor attached to those bytes, and the connection is closed right after. Nothing listening is a 502
answer with the X-Flarebox-Proxy-Error header (and a connect that hangs, 504), as any other answer.

The server trusts none of it: it checks the peer of this connection as for every supervisor connection, accepts
exactly one descriptor, and uses it only if it is a connected TCP socket to 127.0.0.1:{port} (standalone/upstream.py).
"""

import array
import asyncio
import os
import socket

from flarebox_supervisor.httpserver import Request, Response, StreamResponse, error_response
from protocol.services import parse_port_segment

HANDED_OVER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
# marks the supervisor's own refusal (nothing listens, no connection in time), which the server turns into its code
PROXY_ERROR_HEADER = "x-flarebox-proxy-error"


def proxy_error(code: str, message: str | None = None) -> Response:
    return error_response(code, message, headers={PROXY_ERROR_HEADER: code})


async def hand_over(request: Request) -> StreamResponse:
    port = parse_port_segment(request.match_info["port"])
    head_seconds = request.app["settings"].proxy_head_seconds
    upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        upstream.setblocking(False)
        try:
            async with asyncio.timeout(head_seconds):
                await asyncio.get_running_loop().sock_connect(upstream, ("127.0.0.1", port))
        except TimeoutError:  # (before OSError, whose subclass it is) a full backlog: SYNs dropped
            return proxy_error("upstream_timeout", f"port {port} did not accept a connection in {head_seconds:g} s")
        except OSError as exc:
            return proxy_error("upstream_unavailable", f"nothing answered on port {port}: {type(exc).__name__}")
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = request.transport
        if transport is None or transport.is_closing() or transport.get_write_buffer_size():
            raise ConnectionResetError("the server left before its socket was handed over")
        # a duplicate of the request's own socket (same connection, same non-blocking mode): asyncio's transport
        # socket offers no sendmsg. The answer is a few dozen bytes on a connection that carried nothing else, so
        # it goes out whole or not at all.
        carrier = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
        try:
            fds = array.array("i", [upstream.fileno()])
            carrier.sendmsg([HANDED_OVER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        finally:
            carrier.close()
    finally:
        upstream.close()  # the server holds its own descriptor now (or none: then the connection ends here)
    # the answer is whole (or cut: the server then sees a short answer, never a wrong one); the handler's own, below,
    # meets a closed connection and is dropped
    transport.close()
    return Response(status=204)
