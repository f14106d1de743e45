"""Signalling a command's process group and telling whether any live member is left.

Liveness scans /proc and ignores zombies: in a container the supervisor (or a minimal init) may not reap
re-parented background jobs at once, and a zombie-only group must count as gone so SIGKILL is not awaited needlessly.
"""

import os


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    try:
        names = os.listdir("/proc")
    except OSError:
        return _killpg_probe(pgid)
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # fields after the command name (which may contain spaces and parentheses): state ppid pgrp ...
        fields = stat[stat.rfind(b")") + 2 :].split(b" ", 3)
        if len(fields) >= 3 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _killpg_probe(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
