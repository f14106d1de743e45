"""What a sandbox could reach of the host besides its binds: its own log descriptor (break 4 of the isolation
issue: `pidfd_getfd` on the sandbox's pid 1 or 2) and the network helper that serves it (break 6: slirp4netns outside
the sandbox's limits). Each attack runs from inside a real sandbox.
"""

import os
import socket
import threading
from pathlib import Path

import pytest
import sandbox_fixtures as fx

from durable.ports import StartSpec
from standalone.cgroups import Cgroups
from standalone.log_tail import TAIL_BYTES
from standalone.network import SLIRP_MAX_FDS, private_network_available

short_tmp, make_sandbox = fx.short_tmp, fx.make_sandbox
pytestmark = pytest.mark.timeout(120)


def _spec(internet: bool = False) -> StartSpec:
    return StartSpec(image="hermes", instance="lite", env={}, enable_internet=internet)


async def _run(sandbox, command: str) -> str:
    import json
    import secrets

    body = json.dumps({"request_id": secrets.token_hex(16), "command": command, "timeout": 60}).encode()
    response = await sandbox.fetch("POST", "/exec", body=body, headers={"content-type": "application/json"})
    events = [json.loads(line) for line in (await response.read(limit=64 << 20)).splitlines() if line.strip()]
    assert events[-1]["type"] == "exit", events[-1]
    return "".join(e["data"] for e in events if e["type"] == "output")


# Steals fd 1 and 2 of the sandbox's pid 1 (bwrap's init) and pid 2 (the supervisor) and writes 16 MiB into each.
STEAL_LOG = r"""
import ctypes, os, stat, time
libc = ctypes.CDLL(None, use_errno=True)
for pid in (1, 2):
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        print(f"{pid} open-denied {exc.errno}"); continue
    for fd in (1, 2):
        got = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
        if got < 0:
            print(f"{pid}/{fd} denied"); continue
        mode = os.fstat(got).st_mode
        kind = "fifo" if stat.S_ISFIFO(mode) else "file" if stat.S_ISREG(mode) else "other"
        os.set_blocking(got, False)
        written, deadline = 0, time.monotonic() + 10
        while written < 16 << 20 and time.monotonic() < deadline:
            try:
                written += os.write(got, b"injected\n" * 7000)
            except BlockingIOError:
                time.sleep(0.001)
        print(f"{pid}/{fd} {kind} {written}")
"""


def _host_bytes(root) -> int:
    """Bytes in files under `root` outside the sandbox's live dir (what a leaking log would grow)."""
    total = 0
    for dirpath, _, files in os.walk(root):
        if "/live" in dirpath:
            continue
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


async def test_the_sandbox_log_is_a_bounded_pipe_not_a_host_file(make_sandbox, short_tmp):
    sandbox = make_sandbox()
    await sandbox.start(_spec())
    before = _host_bytes(short_tmp)
    out = await _run(sandbox, f"python3 -I -c '{STEAL_LOG}'")
    lines = out.split("\n")
    results = [line.split() for line in lines if line.strip()]
    assert results, out
    for result in results:
        assert result[1] in ("denied", "open-denied", "fifo"), out  # never a host file
    assert _host_bytes(short_tmp) - before < 1 << 20  # nothing grew outside the workspace
    assert len(sandbox._log._tail) <= TAIL_BYTES  # the server keeps only a bounded tail
    assert sandbox._log.text().startswith("(sandbox output)")  # and says whose words it is
    assert (await _run(sandbox, "echo still-fine")) == "still-fine\n"


def _host_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route's source address
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


FLOOD = r"""
import socket, sys, time
held, failed = [], 0
for _ in range(int(sys.argv[3])):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((sys.argv[1], int(sys.argv[2]))); held.append(s)
    except OSError:
        failed += 1; s.close()
print(len(held), failed, flush=True)
time.sleep(float(sys.argv[4]))
"""


def _proc_file(pid: int, name: str) -> str:
    return Path(f"/proc/{pid}/{name}").read_text(errors="replace")


async def test_the_network_helper_is_charged_to_the_sandbox(make_sandbox):
    if not private_network_available():
        pytest.skip("needs a root server with slirp4netns (the sandbox otherwise has no helper of its own)")
    manager, report = Cgroups.detect()
    if manager is None:
        pytest.skip(report)
    sandbox = make_sandbox(cgroups=manager)
    await sandbox.start(_spec(internet=True))
    slirp = sandbox._net._proc.pid
    assert "slirp4netns" in _proc_file(slirp, "cmdline")
    assert slirp in sandbox.cgroup.pids()  # its memory and pids count against the sandbox's limits
    limits = {line[:26].strip(): line[26:].split() for line in _proc_file(slirp, "limits").splitlines()}
    assert limits["Max open files"][:2] == [str(SLIRP_MAX_FDS)] * 2

    host = _host_address()
    if host is None:
        return
    # a connection flood from a lite sandbox: the helper's descriptors stay capped, the rest is refused
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))  # noqa: S104 - reachable through the host's own address, as from the LAN
        listener.listen(4096)
        stop, accepted = threading.Event(), []
        listener.settimeout(0.2)

        def accept():
            while not stop.is_set():
                try:
                    accepted.append(listener.accept()[0])
                except (TimeoutError, OSError):
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            port = listener.getsockname()[1]
            count = SLIRP_MAX_FDS + 300
            out = await _run(sandbox, f"ulimit -n 4096; python3 -I -c '{FLOOD}' {host} {port} {count} 0")
            held = int(out.split()[0])
            assert held < SLIRP_MAX_FDS, out  # capped by the helper's own limit, not the host's
            assert len(os.listdir(f"/proc/{slirp}/fd")) <= SLIRP_MAX_FDS
        finally:
            stop.set()
            thread.join(5)
            for conn in accepted:
                conn.close()
    assert (await _run(sandbox, "echo alive")) == "alive\n"
