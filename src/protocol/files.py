"""Validation of the file tree and process routes: listing pages, move and mkdir bodies, signals.

Both the edge (a caller's request) and the supervisor (what the server forwards) check with these, so a request the
edge let through is read the same way inside the sandbox. No runtime imports.
"""

from dataclasses import dataclass

from protocol import limits
from protocol.errors import ProtocolError
from protocol.validate import _bool, _reject_unknown, _text, validate_abs_path

# What a listing's entry `type` can be (lstat: a symlink is never followed)
ENTRY_TYPES = ("file", "directory", "symlink", "other")

# Signals a caller may send to a process (POST …/processes/{pid}/signal)
SIGNALS = ("TERM", "KILL", "INT", "HUP", "STOP", "CONT")


@dataclass(frozen=True)
class ListRequest:
    path: str
    depth: int = 1  # 1 = the directory's own entries
    limit: int = limits.DEFAULT_LIST_ENTRIES
    cursor: str | None = None  # the `cursor` of the previous page: the last entry's path relative to `path`


@dataclass(frozen=True)
class MoveRequest:
    source: str  # "from"
    target: str  # "to"
    overwrite: bool = False


@dataclass(frozen=True)
class MkdirRequest:
    path: str
    parents: bool = False
    mode: int = 0o755


@dataclass(frozen=True)
class SignalRequest:
    signal: str  # one of SIGNALS
    group: bool = False  # the process's whole process group


def _whole_number(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        number = int(value)
        if low <= number <= high:
            return number
    raise ProtocolError("invalid_query", f"{what} is a whole number from {low} to {high}")


def validate_cursor(value: object) -> str:
    """A page cursor is the relative path of the last entry of the previous page (opaque to callers)."""
    if not isinstance(value, str) or not value or value.startswith("/") or "\x00" in value:
        raise ProtocolError("invalid_query", "cursor must be the `cursor` of a previous page")
    if len(value.encode("utf-8", "surrogatepass")) > limits.MAX_PATH_BYTES:
        raise ProtocolError("invalid_query", "cursor must be the `cursor` of a previous page")
    if any(part in ("", ".", "..") for part in value.split("/")):
        raise ProtocolError("invalid_query", "cursor must be the `cursor` of a previous page")
    return value


def parse_list_query(query: dict[str, str]) -> ListRequest:
    """The query of GET …/files?list=1 (path, depth, limit, cursor; `list` itself is the caller's to check)."""
    if "path" not in query:
        raise ProtocolError("invalid_query", "path is required")
    path = validate_abs_path(query["path"])
    depth = _whole_number(query.get("depth", "1"), "depth", 1, limits.MAX_LIST_DEPTH)
    limit = _whole_number(query.get("limit", str(limits.DEFAULT_LIST_ENTRIES)), "limit", 1, limits.MAX_LIST_ENTRIES)
    cursor = validate_cursor(query["cursor"]) if "cursor" in query else None
    return ListRequest(path, depth, limit, cursor)


def parse_recursive(value: str | None) -> bool:
    if value is None or value == "false":
        return False
    if value == "true":
        return True
    raise ProtocolError("invalid_query", "recursive is true or false")


def parse_move_request(obj: dict) -> MoveRequest:
    """POST …/files/move {"from", "to", "overwrite"?}."""
    _reject_unknown(obj, frozenset(("from", "to", "overwrite")))
    source = validate_abs_path(_text(obj, "from"), what="from")
    target = validate_abs_path(_text(obj, "to"), what="to")
    return MoveRequest(source, target, _bool(obj, "overwrite", False))


def parse_dir_mode(value: object) -> int:
    if value is None:
        return 0o755
    if not (isinstance(value, str) and 1 <= len(value) <= 4 and all(c in "01234567" for c in value)):
        raise ProtocolError("invalid_field", "mode is an octal permission such as 0755")
    return int(value, 8) & 0o1777  # never setuid or setgid


def parse_mkdir_request(obj: dict) -> MkdirRequest:
    """POST …/files/mkdir {"path", "parents"?, "mode"?}."""
    _reject_unknown(obj, frozenset(("path", "parents", "mode")))
    path = validate_abs_path(_text(obj, "path"))
    return MkdirRequest(path, _bool(obj, "parents", False), parse_dir_mode(obj.get("mode")))


def validate_pid(value: object) -> int:
    """A process id from a path segment: a whole number from 1 to 2**22 (Linux's pid_max ceiling)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 7:
        pid = int(value)
        if 1 <= pid <= limits.MAX_PID:
            return pid
    raise ProtocolError("invalid_pid", f"a process id is a whole number from 1 to {limits.MAX_PID}")


def parse_signal_request(obj: dict) -> SignalRequest:
    """POST …/processes/{pid}/signal {"signal", "group"?}."""
    _reject_unknown(obj, frozenset(("signal", "group")))
    name = obj.get("signal")
    if name not in SIGNALS:
        raise ProtocolError("invalid_signal", f"signal is one of {', '.join(SIGNALS)}")
    return SignalRequest(name, _bool(obj, "group", False))
