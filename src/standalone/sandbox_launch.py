"""Launch step between the server and bubblewrap: `python -I -S sandbox_launch.py '<json spec>'`, then exec bwrap.

Runs as the server's user in the process that becomes bwrap (so bwrap is the server's direct child and
`--die-with-parent` holds). In order:

1. join the sandbox's cgroups (write our pid to each `cgroup.procs`): bwrap and every process it starts are then
   limited from their first instruction;
1b. with a private network (network.py): enter a new network namespace (owned by the host's user namespace, so
   nothing in the sandbox can reconfigure it), bring its loopback up and tell the server (`net_ready_fd`), which
   plugs slirp4netns in while this goes on: the supervisor starts meanwhile, and the server sends it no command
   before the NAT is in;
2. when root, stage the bind sources: in a private mount namespace, bind each host directory the sandbox needs
   (the workspace's live dirs, the Python install, the supervisor's sources) onto a fresh tmpfs at `stage`. bwrap
   then runs unprivileged and could not reach sources below a private directory (`/root`, pytest's 0700 temp
   dirs); the staged copies are the same inodes, reachable by the sandbox uid;
3. when root, drop to the unprivileged host uid/gid with no supplementary groups;
4. exec bwrap with a clean environment.

Stdlib only, no project imports: it runs with `-I -S` before anything else is set up (no site: the venv's .pth
files, an editable install's import hook among them, cost every sandbox start ~20 ms here). It imports only builtin
and small modules too: the spec comes marshalled (the same interpreter reads it) rather than as JSON, and the
network's ioctl uses `_socket`; `json` (with `re` and `enum`) and `socket` were 15 ms of every sandbox start.
"""

import _socket
import binascii
import ctypes
import fcntl
import marshal
import os
import struct
import sys


def command(spec: dict) -> list[str]:
    """How the server runs this launcher with `spec` (plain dicts, lists, strings, ints, None and bools)."""
    encoded = binascii.b2a_base64(marshal.dumps(spec), newline=False).decode("ascii")
    return [sys.executable, "-I", "-S", __file__, encoded]


CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_NODEV = 0x4
MS_NOSUID = 0x2


def _libc():
    # the C library Python itself is linked with, already loaded: ctypes.util.find_library would run
    # `ldconfig -p` (a subprocess, milliseconds) on every sandbox start to find the same file
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def join_cgroups(procs_files: list[str]) -> None:
    pid = str(os.getpid())
    for path in procs_files:
        with open(path, "w") as f:
            f.write(pid)


def stage_sources(stage: str, sources: list[str]) -> None:
    libc = _libc()
    mount = libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    # open every source first: the tmpfs below may cover some of them (e.g. a stage at /tmp, sources under /tmp)
    fds = [os.open(src, os.O_PATH | os.O_CLOEXEC) for src in sources]
    _check(mount(b"flarebox-stage", stage.encode(), b"tmpfs", MS_NODEV | MS_NOSUID, b"mode=0755,size=64k"), "tmpfs")
    for index, fd in enumerate(fds):
        target = os.path.join(stage, str(index))
        os.mkdir(target, 0o755)
        _check(mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {index}")
        os.close(fd)


def private_network(ready_fd: int) -> None:
    _check(_libc().unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        ifreq = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))  # 127.0.0.1 comes with it
    finally:
        sock.close()
    os.write(ready_fd, b"1")
    os.close(ready_fd)


def drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("could not drop privileges")


def main() -> None:
    spec = marshal.loads(binascii.a2b_base64(sys.argv[1]))
    join_cgroups(spec.get("cgroup_procs", []))
    if spec.get("net_ready_fd") is not None:
        private_network(spec["net_ready_fd"])
    if spec.get("stage"):
        stage_sources(spec["stage"], spec["sources"])
    if spec.get("uid") is not None:
        drop_privileges(spec["uid"], spec["gid"])
    os.chdir("/")
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # reported through the sandbox log; the server sees the exit code
        print(f"flarebox sandbox launch failed: {exc}", file=sys.stderr)
        sys.exit(127)
