"""What a command in one workspace can reach through a real `flarebox serve`: not the server's data dir, not another
workspace's files or supervisor socket, not the server's TCP port (with ENABLE_INTERNET=false).

tests/standalone/test_sandbox.py checks the sandbox driver alone; these run through the server, with its real data
dir layout, and try the host paths a hostile command would guess.
"""

import pytest
from e2e import run_ok, ws_url

from standalone.network import describe, private_network_available

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def two_workspaces(secure_server):
    """`reach/attacker` and `reach/target` (with a secret file), both booted."""
    with secure_server.client() as client:
        for name in ("attacker", "target"):
            assert client.put(ws_url("reach", name), json={}).status_code in (200, 201)
        run_ok(client, "reach", "target", "echo target-secret > /workspace/secret; echo home > ~/h")
        run_ok(client, "reach", "attacker", "true")
    return secure_server


def test_sandbox_cannot_see_the_data_dir_or_another_workspace(two_workspaces):
    srv = two_workspaces
    data = srv.data_dir
    target_root = data / "workspaces" / "reach" / "target"
    guesses = [
        data,
        data / "token",
        data / "workspaces",
        target_root,
        target_root / "state.sqlite3",
        target_root / "root" / "workspace" / "secret",
        data / "snapshots",
        data / "run",
    ]
    probe = "; ".join(f"ls -d {g} 2>/dev/null; cat {g} 2>/dev/null" for g in guesses)
    # also what a process could reach through /proc: other PIDs' roots and cwds, and mounts naming host paths
    probe += "; ls /proc/*/root/workspace 2>/dev/null | sort -u; grep -c reach/target /proc/self/mountinfo; echo end"
    with srv.client() as client:
        out, _ = run_ok(client, "reach", "attacker", probe)
        assert "target-secret" not in out
        assert str(data) not in out
        assert out.rstrip().endswith("0\nend"), out  # no mount of the target's directories
        # the file API of the attacker cannot name them either
        for guess in guesses[1:]:
            response = client.get(ws_url("reach", "attacker", "files"), params={"path": str(guess)})
            assert response.status_code in (404, 400), (guess, response.status_code)
        # the target's file is still there for its owner
        assert run_ok(client, "reach", "target", "cat /workspace/secret")[0] == "target-secret\n"


def test_sandbox_sees_no_supervisor_socket_at_all(two_workspaces):
    srv = two_workspaces
    sockets = sorted(p for p in (srv.data_dir / "run").rglob("*.sock"))
    assert len(sockets) >= 2  # both supervisors are up, each with its own socket on the host
    with srv.client() as client:
        sockets_inside = "find / \\( -path /proc -o -path /sys -o -path /usr \\) -prune -o -type s -print 2>/dev/null"
        out, _ = run_ok(client, "reach", "attacker", f"ls -A /run/flarebox 2>/dev/null; {sockets_inside}; echo end")
        assert out.split() == ["end"], out  # the listening socket has no path inside: it was handed over bound
        for sock in sockets:  # the host paths of the sockets do not exist inside
            probe = f"test -e {sock} && echo visible || echo absent"
            assert run_ok(client, "reach", "attacker", probe)[0] == "absent\n"


def _tcp_probe(port: int) -> str:
    return (
        f"(exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET /v1/health HTTP/1.0\\r\\n\\r\\n' >&3 && "
        f"head -c 12 <&3) 2>/dev/null && echo ' reached' || echo refused"
    )


def test_without_internet_the_server_port_is_unreachable(two_workspaces):
    srv = two_workspaces
    with srv.client() as client:
        out, _ = run_ok(client, "reach", "attacker", _tcp_probe(srv.port))
        assert out.strip() == "refused"
        # nor through any other local address of the host
        probe = f"for ip in $(hostname -I 2>/dev/null) 10.0.2.2 172.17.0.1; do {_tcp_probe(srv.port)}; done"
        out, _ = run_ok(client, "reach", "attacker", probe)
        assert "reached" not in out


def test_with_internet_the_server_port_is_still_unreachable(start_server):
    """ENABLE_INTERNET=true: outbound traffic goes through the sandbox's own network namespace (slirp4netns), which
    refuses the host's loopback — this server's port — directly and through the NAT gateway."""
    if not private_network_available():
        pytest.skip(
            "a shared host network (no slirp4netns, or not root) reaches the host's loopback; "
            "`flarebox serve` says so at start: " + describe(True)
        )
    srv = start_server(env={"ENABLE_INTERNET": "true"})
    assert "outbound only" in srv.output()
    with srv.client() as client:
        assert client.put(ws_url("net", "online"), json={}).status_code == 201
        out, _ = run_ok(client, "net", "online", "ip -br addr 2>/dev/null || cat /proc/net/dev; cat /etc/resolv.conf")
        assert "tap0" in out and "10.0.2.3" in out  # its own interface and the NAT's resolver
        for host in ("127.0.0.1", "10.0.2.2", "localhost", "::1"):
            out, _ = run_ok(client, "net", "online", _tcp_probe(srv.port).replace("127.0.0.1", host))
            assert out.strip() == "refused", host
