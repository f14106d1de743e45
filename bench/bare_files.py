"""The floor of a file transfer over HTTP on this machine: a server that does nothing but move the bytes (GET: one
`sendfile(2)` of the file after the head; PUT: `recv_into` one buffer, write it to the file), on loopback TCP, for
curl to download from and upload to exactly as the full-stack figures do. One connection at a time, closed after each
answer; it serves one file name (`/<name>`) under its directory and nothing else.

What curl reaches here is what any server could reach with the same client, so the full stack's file figures read
against it (bench/README.md)."""

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_BUFFER = 1024 * 1024
_MAX_HEAD = 64 * 1024


def _head_and_rest(conn: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > _MAX_HEAD:
            raise ValueError("request head too large")
        piece = conn.recv(65536)
        if not piece:
            raise ConnectionError("the client closed before its head was complete")
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise ValueError("a PUT needs a content-length")


def _answer(conn: socket.socket, path: Path) -> None:
    head, rest = _head_and_rest(conn)
    method, target = head.split(b" ", 2)[:2]
    if target.decode() != f"/{path.name}":
        conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    elif method == b"GET":
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % size)
            conn.sendfile(f)
    elif method == b"PUT":
        size = _content_length(head)
        if b"100-continue" in head.lower():
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        buffer = bytearray(_BUFFER)
        view = memoryview(buffer)
        with open(path, "wb") as f:
            f.write(rest)
            got = len(rest)
            while got < size:
                n = conn.recv_into(buffer, min(_BUFFER, size - got))
                if not n:
                    raise ConnectionError("the client closed before its body was complete")
                f.write(view[:n])
                got += n
        conn.sendall(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
    else:
        conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")


@contextmanager
def serving(path: Path) -> Iterator[str]:
    """Serve `path` (GET reads it, PUT replaces it) on 127.0.0.1; yields its URL. The thread and socket end on exit."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # shut down
            with conn:
                try:
                    _answer(conn, path)
                except (OSError, ValueError):
                    pass  # that one transfer failed; curl reports it to the benchmark

    thread = threading.Thread(target=loop, name="bare-files", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/{path.name}"
    finally:
        stop.set()
        listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        thread.join(timeout=10)
        listener.close()
