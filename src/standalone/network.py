"""Outbound-only internet for a sandbox: its own network namespace, connected by slirp4netns (user-mode NAT).

Sharing the host's network namespace would let any command reach every service on the host's loopback — this
server's own port first of all. Instead bwrap unshares the network and slirp4netns plugs a tap device into it:
the sandbox gets 10.0.2.100 behind a NAT, DNS at 10.0.2.3, and `--disable-host-loopback` refuses connections to the
host's 127.0.0.0/8 through the gateway. The host's other addresses stay reachable like those of any machine on the
network (a server bound to 0.0.0.0 is as reachable as it is from the LAN: it still needs the token).

The namespace is made by the launcher while it is still root, and slirp4netns joins it by path (CAP_SYS_ADMIN in
the host user namespace): a root server only.
It is sandboxed itself (`--enable-sandbox --enable-seccomp`: own mount namespace, capabilities dropped), runs in
the sandbox's own cgroup (so the memory its connections take is charged to the sandbox, not the host) with at most
SLIRP_MAX_FDS open files, and exits when the server closes its exit pipe — or dies, which closes it too.

Not blocked: the host's own non-loopback addresses. A host service bound to 0.0.0.0 (or to the host's LAN address)
is reachable from a sandbox through that address, and the connection arrives *from* that address, so a service that
trusts "local" peers by source address would trust the sandbox. Bind such services to 127.0.0.1.
"""

import os
import select
import shutil
import subprocess
import time
from collections.abc import Callable

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NAMESERVER = "10.0.2.3"
MTU = 65520
# one descriptor per connection the sandbox opens: bounds the kernel socket state a sandbox can pin on the host
SLIRP_MAX_FDS = 512
# How slirp4netns is started: it joins the sandbox's cgroups and gets its open-file cap before it runs (so it is
# limited from its first instruction), by a shell rather than the sandbox's Python launcher, whose interpreter start
# competed with the sandbox's own on every boot. Arguments: the cap, the cgroup.procs files, --, the command.
_LIMITED = (
    'ulimit -n "$1" || exit 127; shift; '
    'while [ "$1" != -- ]; do echo $$ > "$1" || exit 127; shift; done; shift; exec "$@"'
)


def limited_command(nofile: int, cgroup_procs: list[str], argv: list[str]) -> list[str]:
    """`argv` run in the cgroups of `cgroup_procs`, with at most `nofile` open files, from its first instruction."""
    return ["/bin/sh", "-c", _LIMITED, "sh", str(nofile), *cgroup_procs, "--", *argv]


def private_network_available() -> bool:
    return os.geteuid() == 0 and shutil.which("slirp4netns", path=PATH) is not None


def describe(enable_internet: bool) -> str:
    """How sandboxes reach the network here, for `flarebox serve`'s start notice."""
    if not enable_internet:
        return "off"
    if private_network_available():
        return (
            "on (outbound only, through slirp4netns; the host's loopback is unreachable, but services listening on "
            "the host's other addresses, 0.0.0.0 included, are reachable from sandboxes: bind them to 127.0.0.1)"
        )
    why = "not root" if os.geteuid() != 0 else "slirp4netns is not installed"
    return (
        f"on, SHARED with the host ({why}): commands can reach every service on the host's loopback, this server's "
        "port included; run as root with slirp4netns installed, or set ENABLE_INTERNET=false"
    )


def data_fd(data: bytes) -> int:
    """A pipe read end holding `data` (for bwrap --ro-bind-data and --file); the write end is closed."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)  # small (< pipe buffer): never blocks
    finally:
        os.close(write_end)
    return read_end


class PrivateNetwork:
    """One sandbox's network. The launcher (sandbox_launch.py, still root) makes the namespace and goes on to bwrap;
    start() plugs slirp4netns into it meanwhile (the sandbox's start waits for both); stop() when the sandbox is
    gone. The namespace is the launcher's, which bwrap keeps (same process), so slirp4netns finds it by the pid at
    any time; bwrap's children inherit it.

    The namespace belongs to the host's user namespace (bwrap then runs without --unshare-net), so the sandbox has
    no capability over it, and bwrap's own loopback setup never races slirp4netns' netlink calls."""

    def __init__(self):
        self._ready_r, self._ready_w = os.pipe()  # launcher → server: the namespace exists, loopback is up
        self._resolv = data_fd(f"nameserver {NAMESERVER}\n".encode())
        self._proc: subprocess.Popen | None = None
        self._exit_w: int | None = None

    def launch_spec(self) -> dict:
        return {"net_ready_fd": self._ready_w}

    def bwrap_args(self) -> list[str]:
        target = "/etc/resolv.conf"
        if os.path.islink(target):  # e.g. systemd-resolved's stub: cover the file it points at
            target = os.path.realpath(target)
        return ["--ro-bind-data", str(self._resolv), target]

    def child_fds(self) -> tuple[int, ...]:
        return (self._ready_w, self._resolv)

    def spawned(self) -> None:
        """The launcher holds its copies now; close ours."""
        for name in ("_ready_w", "_resolv"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    async def start(
        self, pid: int, timeout: float, log_fd: int, alive: Callable[[], bool], cgroup_procs: list[str]
    ) -> None:
        """Plug slirp4netns into the namespace of launcher `pid`; its output goes to `log_fd`, and it joins the
        sandbox's cgroup (`cgroup_procs`) before it runs."""
        import asyncio

        await asyncio.to_thread(self._start, pid, timeout, log_fd, alive, cgroup_procs)

    def _start(self, pid: int, timeout: float, log_fd: int, alive: Callable[[], bool], cgroup_procs: list[str]) -> None:
        deadline = time.monotonic() + timeout
        if self._read(self._ready_r, deadline, alive) != b"1":
            raise OSError("the sandbox launcher could not make its network namespace")
        exit_r, self._exit_w = os.pipe()
        ready_r, ready_w = os.pipe()
        try:
            argv = [shutil.which("slirp4netns", path=PATH) or "slirp4netns", "--configure", f"--mtu={MTU}"]
            argv += ["--disable-host-loopback", "--enable-sandbox", "--enable-seccomp", "--netns-type=path"]
            argv += [f"--exit-fd={exit_r}", f"--ready-fd={ready_w}", f"/proc/{pid}/ns/net", "tap0"]
            self._proc = subprocess.Popen(
                limited_command(SLIRP_MAX_FDS, cgroup_procs, argv),
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                env={"PATH": PATH},
                pass_fds=(exit_r, ready_w),
                start_new_session=True,
            )
        finally:
            os.close(exit_r)
            os.close(ready_w)
        try:
            if self._read(ready_r, deadline, lambda: self._proc.poll() is None) != b"1":
                raise OSError(f"slirp4netns failed to configure the network (exit {self._proc.poll()})")
        finally:
            os.close(ready_r)

    @staticmethod
    def _read(fd: int, deadline: float, alive: Callable[[], bool]) -> bytes:
        waiter = select.poll()  # not select(): a busy server's descriptors pass its FD_SETSIZE (1024)
        waiter.register(fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError("the sandbox network was not ready in time")
            if waiter.poll(min(left, 0.1) * 1000):
                return os.read(fd, 1)
            if not alive():
                raise OSError("the sandbox exited while its network was set up")

    def stop(self) -> None:
        self.spawned()
        if self._ready_r >= 0:
            os.close(self._ready_r)
            self._ready_r = -1
        if self._exit_w is not None:
            os.close(self._exit_w)  # slirp4netns exits when this closes
            self._exit_w = None
        if self._proc is not None:
            try:
                self._proc.wait(2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
            self._proc = None
