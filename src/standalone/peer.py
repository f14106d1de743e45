"""Who answers on a sandbox's supervisor socket: checked on every new connection (SO_PEERCRED).

The socket's path lives in a directory only the server can reach, so nothing in a sandbox can swap it for another
workspace's. This is the second lock: a connection is used only when the process that listens on it runs as the
workspace's own host uid and descends from that workspace's bwrap process. Anything else (a socket planted by
another process, a pid that belongs to another sandbox) fails the connection as if the supervisor were gone.
"""

import socket
import struct

_UCRED = struct.Struct("3i")  # pid, uid, gid
_MAX_DEPTH = 64  # the sandbox's process tree is shallow; a longer chain is not ours


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ')'
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(_MAX_DEPTH):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            pid = parent_pid(pid)
        except (OSError, ValueError, IndexError):
            return False
    return False
