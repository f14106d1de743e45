"""Run file operations with the sandbox user's rights.

When the supervisor is root, a file agent is forked at startup (before the event loop and any thread exist): it
switches to the sandbox user for good and serves operations over a SOCK_SEQPACKET socketpair, passing opened file
descriptors back with SCM_RIGHTS. The supervisor then streams bytes through those descriptors, so a symlink or a
path can never make it read or write anything the sandbox user could not. One long-lived agent costs one round trip
per operation instead of a fork per file. When the supervisor is unprivileged, the same operations run in-process.
"""

import array
import asyncio
import gc
import json
import os
import socket
import threading

from flarebox_supervisor import fileops, processes, treeops
from flarebox_supervisor.identity import Identity
from protocol.errors import ProtocolError

_MAX_MESSAGE = 64 * 1024
# every operation the agent runs for the supervisor, by name
OPERATIONS = {**fileops.OPERATIONS, **treeops.OPERATIONS, **processes.AGENT_OPERATIONS}


class LocalFiles:
    """File operations with the supervisor's own rights (it is not root, so there is nothing to drop)."""

    async def call(self, op: str, **args) -> tuple[dict, int | None]:
        return await asyncio.to_thread(OPERATIONS[op], **args)

    def close(self) -> None:
        pass


class FileAgent:
    def __init__(self, identity: Identity):
        self._identity = identity
        self._lock = threading.Lock()  # one operation in flight on the socket at a time
        self._spawn()

    def _spawn(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gc.freeze()  # the agent shares the supervisor's pages: no collection may touch (and so copy) them
        pid = os.fork()
        if pid == 0:  # the agent
            status = 1
            try:
                parent.close()
                os.closerange(3, child.fileno())
                os.closerange(child.fileno() + 1, 65536)
                self._identity.become()
                os.umask(0o022)
                _serve(child)
                status = 0
            finally:
                os._exit(status)
        child.close()
        self._pid, self._sock = pid, parent

    async def call(self, op: str, **args) -> tuple[dict, int | None]:
        return await asyncio.to_thread(self._call, op, args)

    def _call(self, op: str, args: dict) -> tuple[dict, int | None]:
        request = json.dumps({"op": op, "args": args}).encode()
        with self._lock:
            try:
                message, fds = self._exchange(request)
            except OSError:
                # The agent died (the sandbox user may kill it: it runs as that user). Every operation is safe to
                # repeat, so start a fresh agent and try once more.
                self._respawn()
                try:
                    message, fds = self._exchange(request)
                except OSError:
                    raise ProtocolError("internal_error", "the file agent failed") from None
        reply = json.loads(message)
        if "error" in reply:
            for fd in fds:
                os.close(fd)
            raise ProtocolError(reply["error"], reply["message"])
        return reply["result"], (fds[0] if fds else None)

    def _exchange(self, request: bytes) -> tuple[bytes, list[int]]:
        self._sock.send(request)
        message, fds, _flags, _addr = socket.recv_fds(self._sock, _MAX_MESSAGE, 1)
        if not message:
            raise ConnectionError("file agent closed its socket")
        return message, fds

    def _respawn(self) -> None:
        self.close()
        self._spawn()

    def close(self) -> None:
        self._sock.close()
        try:
            os.waitpid(self._pid, 0)
        except ChildProcessError:
            pass


def _serve(sock: socket.socket) -> None:
    while True:
        message = sock.recv(_MAX_MESSAGE)
        if not message:
            return
        fd = None
        try:
            request = json.loads(message)
            result, fd = OPERATIONS[request["op"]](**request["args"])
            reply = {"result": result}
        except ProtocolError as exc:
            reply = {"error": exc.code, "message": exc.message}
        except Exception as exc:  # report, keep serving
            reply = {"error": "internal_error", "message": f"file agent: {type(exc).__name__}"}
        payload = json.dumps(reply).encode()
        if fd is None:
            sock.send(payload)
        else:
            sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
            os.close(fd)


def make_file_access(identity: Identity) -> "FileAgent | LocalFiles":
    return FileAgent(identity) if identity.drop else LocalFiles()
