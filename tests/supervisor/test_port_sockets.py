"""POST /port-sockets/{port}: the real supervisor connects to 127.0.0.1:{port} and hands the connected socket over
its unix connection (SCM_RIGHTS); the standalone server's port proxy then speaks HTTP/1.1 on it itself."""

import array
import os
import socket
import threading

import pytest

from flarebox_supervisor import port_sockets
from protocol.errors import ProtocolError
from standalone import upstream
from standalone.upstream import PortConnections, open_port_socket

from .harness import start_supervisor

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def sup(tmp_path_factory):
    yield from start_supervisor(tmp_path_factory.mktemp("sockets"))


@pytest.fixture
def listener():
    """A one-answer-per-request HTTP/1.1 service on loopback."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while True:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                    while b"\r\n\r\n" in data:
                        _, _, data = data.partition(b"\r\n\r\n")
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")

    threading.Thread(target=serve, daemon=True).start()
    yield sock.getsockname()[1]
    sock.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ask(sup, port) -> tuple[bytes, list[int]]:
    """The raw answer to a socket request and the descriptors that came with it."""
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.connect(str(sup.socket))
    control.sendall(
        f"POST /port-sockets/{port} HTTP/1.1\r\nHost: sv\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
    )
    answer, fds = b"", []
    with control:
        while True:
            data, ancdata, _, _ = control.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
            for level, kind, payload in ancdata:
                if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
                    got = array.array("i")
                    got.frombytes(payload[: len(payload) - len(payload) % 4])
                    fds += got
            if not data:
                return answer, fds
            answer += data


def test_the_connected_socket_is_handed_over_and_the_connection_ends(sup, listener):
    answer, fds = ask(sup, listener)
    assert answer == b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n" and len(fds) == 1
    with socket.socket(fileno=fds[0]) as handed:
        assert (handed.family, handed.type) == (socket.AF_INET, socket.SOCK_STREAM)
        assert handed.getpeername() == ("127.0.0.1", listener)
        assert handed.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        handed.setblocking(True)  # (the supervisor's own copy was non-blocking: the file description is shared)
        handed.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert handed.recv(100).endswith(b"\r\n\r\nhi")
    assert sup.client.get("/health").status_code == 200  # the supervisor serves on
    assert answer == upstream.HANDED_OVER == port_sockets.HANDED_OVER  # the server's fast path knows it by heart


def test_nothing_listening_is_the_relays_502_without_a_descriptor(sup):
    answer, fds = ask(sup, free_port())
    assert fds == []
    head = answer.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 502") and b"x-flarebox-proxy-error: upstream_unavailable" in head


@pytest.mark.parametrize("port", ["0", "65536", "8080", "x", "-1"])
def test_invalid_ports_are_refused(sup, port):
    response = sup.client.post(f"/port-sockets/{port}")
    assert response.status_code in (400, 404)
    if response.status_code == 400:
        assert response.json()["error"]["code"] == "invalid_port"


async def test_the_servers_client_over_the_real_supervisor(sup, listener):
    expected = (os.getuid(), sup.process.pid)
    pool = PortConnections(lambda port, closer: open_port_socket(str(sup.socket), lambda: expected, port, 5, closer))
    for _ in range(3):
        response = await pool.request(listener, "GET", "/", {}, None, 5)
        assert (response.status, await response.read()) == (200, b"hi")
    pool.close()
    with pytest.raises(ProtocolError) as err:
        await open_port_socket(str(sup.socket), lambda: expected, free_port(), 5)
    assert err.value.code == "upstream_unavailable"
