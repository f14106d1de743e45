"""GET /processes and POST /processes/{pid}/signal: what runs in the sandbox, and stopping or pausing it.

The listing shows the commands exec started (the registry's) and every process of the sandbox user, read from
/proc. The supervisor's own processes are never shown nor signalled, even when they share the sandbox user's uid
(an unprivileged supervisor; the root supervisor's file agent and archive workers): that is the supervisor itself,
its ancestors, and everything in its session or process group. Exec commands and services each start in a session
of their own (runner.py and services.py spawn with start_new_session=True), and a process can never move into
another session, so nothing the sandbox user starts can hide there.

A signal goes through the file agent (AGENT_OPERATIONS): it has exactly the sandbox user's rights, so the kernel
itself refuses a signal to anything else. Pid reuse cannot redirect it: a pidfd is opened first, the process is
checked through /proc, and the signal is sent on the pidfd, which fails if the checked process is gone.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from protocol.errors import ProtocolError
from protocol.files import SIGNALS, parse_signal_request, validate_pid

if TYPE_CHECKING:  # the file agent imports this module for signal_process; it loads no HTTP server (agent.py)
    from flarebox_supervisor.httpserver import Application, Request, Response
    from flarebox_supervisor.runner import Command

MAX_PROCESSES = 4096  # processes one listing shows at most (lowest pids first)...
COMMAND_BYTES = 4096  # ...each command line cut to this many UTF-8 bytes (then "command_truncated": true)...
# ...and the whole answer stays under the server's 1 MiB cap on a control answer (limits.CONTROL_BODY_BYTES), even
# for command lines that JSON escapes to six times their size; past a budget, entries are left off ("truncated")
PROCESSES_BUDGET_BYTES = 768 * 1024
COMMANDS_BUDGET_BYTES = 192 * 1024
_ANCESTORS_MAX = 64  # a parent chain longer than this is not real; stop walking

# the one-letter state of /proc/<pid>/stat (proc(5)), as the words GET /processes answers with
STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "T": "stopped",
    "t": "tracing-stop",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
    "P": "parked",
    "W": "waking",
    "K": "wakekill",
}
_SIGNAL_NUMBERS = {name: getattr(signal, "SIG" + name) for name in SIGNALS}


def _not_found() -> ProtocolError:
    # one answer for a pid that does not exist and one that is not the sandbox user's: nothing foreign is revealed
    return ProtocolError("process_not_found")


# --- reading /proc -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    pid: int
    tgid: int  # a thread's /proc/<tid> exists too (unlisted); it is not a process of its own
    uid: int  # the real uid: whose process it is
    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    starttime: int  # clock ticks after boot


def _reader(dir_fd: int):
    return lambda name, flags: os.open(name, flags | os.O_CLOEXEC, dir_fd=dir_fd)


def _read(dir_fd: int, name: str, limit: int = 64 * 1024) -> bytes:
    with open(name, "rb", opener=_reader(dir_fd)) as f:
        return f.read(limit)


def _open_proc(pid: int) -> int:
    """A descriptor of /proc/<pid>: files read through it belong to that one process, never to a later one that
    got its pid (they fail with ESRCH once it is gone)."""
    return os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _parse(pid: int, stat: bytes, status: bytes) -> ProcStat:
    # the command name sits in parentheses and may hold spaces and parentheses itself: split around the last ")"
    head, _, rest = stat.rpartition(b")")
    fields = rest.split()
    ids = {}
    for line in status.splitlines():
        key, _, value = line.partition(b":")
        if key in (b"Tgid", b"Uid"):
            ids[key] = int(value.split()[0])  # Uid: real effective saved fs
    return ProcStat(
        pid=pid,
        tgid=ids[b"Tgid"],
        uid=ids[b"Uid"],
        comm=head.partition(b"(")[2].decode("utf-8", "replace"),
        state=fields[0].decode(),
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        starttime=int(fields[19]),  # field 22 of proc(5); rest starts at field 3
    )


def _stat_at(dir_fd: int, pid: int) -> ProcStat:
    return _parse(pid, _read(dir_fd, "stat"), _read(dir_fd, "status"))


def _stat(pid: int) -> ProcStat | None:
    """A process's stat, or None once it is gone (or was never there)."""
    try:
        dir_fd = _open_proc(pid)
    except OSError:
        return None
    try:
        return _stat_at(dir_fd, pid)
    except (OSError, ValueError, KeyError, IndexError):
        return None
    finally:
        os.close(dir_fd)


def _pids() -> list[int]:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())


# --- which processes are the sandbox user's ------------------------------------------------------------------------


@dataclass(frozen=True)
class Own:
    """The supervisor's own processes, seen from the calling process (the supervisor, or its forked file agent)."""

    pids: frozenset[int]  # the caller and its ancestors
    pgid: int
    sid: int


def own_processes() -> Own:
    me = os.getpid()
    pids = {me}
    pid = os.getppid()
    while pid > 0 and pid not in pids and len(pids) < _ANCESTORS_MAX:
        pids.add(pid)
        parent = _stat(pid)
        if parent is None:
            break  # unreadable (hidepid) or gone: ancestors further up are not the sandbox user's to reach anyway
        pid = parent.ppid
    return Own(frozenset(pids), os.getpgid(0), os.getsid(0))


def listable(proc: ProcStat, uid: int, own: Own) -> bool:
    """The predicate of the listing and of every signal: a process of the sandbox user that is not the
    supervisor's own."""
    return (
        proc.uid == uid
        and proc.tgid == proc.pid
        and proc.pid not in own.pids
        and proc.pgid != own.pgid
        and proc.sid != own.sid
    )


# --- the listing ---------------------------------------------------------------------------------------------------


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _bounded(text: str) -> tuple[str, bool]:
    """`text` cut to COMMAND_BYTES of UTF-8 (never inside a character), and whether it was cut."""
    data = text.encode()
    if len(data) <= COMMAND_BYTES:
        return text, False
    return data[:COMMAND_BYTES].decode("utf-8", "ignore"), True


def _command_line(dir_fd: int, comm: str) -> tuple[str, bool]:
    # one byte past the bound (and its terminating NUL) tells whether there was more
    raw = _read(dir_fd, "cmdline", COMMAND_BYTES + 2)
    if not raw:
        return f"[{comm}]", False  # a zombie (or a kernel thread) has no command line left
    raw = raw.removesuffix(b"\0")
    return _bounded(raw.replace(b"\0", b" ").decode("utf-8", "replace"))


def _boot_time() -> int:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return int(line.split()[1])
    raise OSError("no btime in /proc/stat")


@dataclass(frozen=True)
class Scan:
    """What every entry of one listing shares."""

    user: str
    sessions: dict[int, str]  # session id → the exec request whose command leads it
    boot: int
    ticks: int


def _describe(pid: int, uid: int, own: Own, scan: Scan) -> dict | None:
    try:
        dir_fd = _open_proc(pid)
    except OSError:
        return None  # gone since the directory was listed
    try:
        proc = _stat_at(dir_fd, pid)
        if not listable(proc, uid, own):
            return None
        command, truncated = _command_line(dir_fd, proc.comm)
    except (OSError, ValueError, KeyError, IndexError):
        return None  # it ended while being read
    finally:
        os.close(dir_fd)
    return {
        "pid": pid,
        "ppid": proc.ppid,
        "pgid": proc.pgid,
        "user": scan.user,
        "command": command,
        "command_truncated": truncated,
        "state": STATES.get(proc.state, "unknown"),
        "started_at": _iso(scan.boot + proc.starttime / scan.ticks),
        "request_id": scan.sessions.get(proc.sid),
    }


class Bounded:
    """Entries of one list, up to a count and a budget of JSON bytes."""

    def __init__(self, max_entries: int, budget: int):
        self.entries: list[dict] = []
        self.truncated = False
        self._max, self._left = max_entries, budget

    def add(self, entry: dict) -> bool:
        """False (and the list marked truncated) once the entry does not fit."""
        size = len(json.dumps(entry)) + 2  # the ", " between entries
        if len(self.entries) >= self._max or size > self._left:
            self.truncated = True
            return False
        self.entries.append(entry)
        self._left -= size
        return True


def list_processes(uid: int, user: str, sessions: dict[int, str]) -> Bounded:
    scan = Scan(user, sessions, _boot_time(), os.sysconf("SC_CLK_TCK"))
    own = own_processes()
    listed = Bounded(MAX_PROCESSES, PROCESSES_BUDGET_BYTES)
    for pid in _pids():
        entry = _describe(pid, uid, own, scan)
        if entry is not None and not listed.add(entry):
            break
    return listed


def describe_command(command: Command) -> dict:
    text, truncated = _bounded(command.request.command)
    terminal = command.journal.terminal
    return {
        "request_id": command.request.request_id,
        "command": text,
        "command_truncated": truncated,
        "started_at": _iso(command.started_wall),
        "state": command.state,  # running | draining (its bash exited, output still relayed) | finished
        "pid": command.process.pid if command.alive else None,
        # the exit code its stream ended with; null while it runs and after an error end (output_limit)
        "exit_code": terminal.get("exit_code") if terminal is not None and terminal["type"] == "exit" else None,
    }


async def get_processes(request: Request) -> Response:
    from flarebox_supervisor.httpio import no_query
    from flarebox_supervisor.httpserver import json_response

    no_query(request)
    commands = request.app["registry"].recent()
    listed_commands = Bounded(len(commands), COMMANDS_BUDGET_BYTES)
    for command in commands:
        if not listed_commands.add(describe_command(command)):
            break
    # newest last, so a session id a later command reuses (pid reuse) points at the later one
    sessions = {c.pgid: c.request.request_id for c in reversed(commands)}
    identity = request.app["identity"]
    listed = await asyncio.to_thread(list_processes, identity.uid, identity.name, sessions)
    return json_response(
        {
            "commands": listed_commands.entries,
            "processes": listed.entries,
            "truncated": listed_commands.truncated or listed.truncated,
        }
    )


# --- signals (run by the file agent, or in-process when the supervisor is unprivileged) ----------------------------


def _pidfd(pid: int) -> int | None:
    """A pidfd for `pid`; None where the kernel has none (then the signal goes by pid, after the same checks)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, NotImplementedError):
        return None
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            return None
        raise _not_found() from None  # ESRCH: no such process; EINVAL: a thread's id


def _check_group(pgid: int, uid: int, own: Own) -> None:
    """Every member of the group must be one the listing shows, or none is signalled."""
    for pid in _pids():
        proc = _stat(pid)
        if proc is not None and proc.pgid == pgid and not listable(proc, uid, own):
            raise ProtocolError(
                "process_not_found", "its process group also holds processes GET /processes does not list"
            )


def _send(pidfd: int | None, pid: int, number: int) -> None:
    if pidfd is None:
        os.kill(pid, number)
    else:
        signal.pidfd_send_signal(pidfd, number)


def signal_process(pid: int, sig: str, group: bool) -> tuple[dict, None]:
    """Send `sig` to `pid` (or its process group), if it is a process the listing shows, with the caller's rights."""
    number = _SIGNAL_NUMBERS[sig]
    uid, own = os.getuid(), own_processes()  # the agent's uid is the sandbox user's
    pidfd = _pidfd(pid)
    try:
        proc = _stat(pid)  # read after the pidfd was opened: while that process lives, its pid is not reused
        if proc is None or not listable(proc, uid, own):
            raise _not_found()
        if group:
            _check_group(proc.pgid, uid, own)
            _send(pidfd, pid, 0)  # the checked process is still there (so the group has not been emptied)...
            os.killpg(proc.pgid, number)
        else:
            _send(pidfd, pid, number)  # ...fails (ESRCH) if the process checked above has ended since
    except (ProcessLookupError, PermissionError):
        raise _not_found() from None
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return {"pid": pid, "signal": sig, "group": group}, None


AGENT_OPERATIONS = {"signal_process": signal_process}


async def post_signal(request: Request) -> Response:
    from flarebox_supervisor.httpio import no_query, read_json
    from flarebox_supervisor.httpserver import json_response

    pid = validate_pid(request.match_info["pid"])
    no_query(request)
    body = parse_signal_request(await read_json(request))
    result, _fd = await request.app["files"].call("signal_process", pid=pid, sig=body.signal, group=body.group)
    return json_response(result)


def add_routes(app: Application) -> None:
    app.add_route("GET", "/processes", get_processes)
    app.add_route("POST", "/processes/{pid}/signal", post_signal)
