"""Validation of terminal sessions (GET …/pty): the query that opens or resumes one and the control frames.

A PTY WebSocket carries terminal bytes in binary frames both ways and control as small JSON text frames: the client
sends `{"type": "resize", "cols", "rows"}`; the server sends `session` (the id, whether it resumed, and the output
offset of the byte that follows it), the boot's
`status`/`started` events (as exec's), `exit` (the shell's exit code) and `error` (a protocol error code). No
runtime imports.
"""

import json
import re
from dataclasses import dataclass

from protocol import limits
from protocol.errors import ProtocolError
from protocol.validate import validate_offset

_SESSION_ID = re.compile(r"[0-9a-f]{32}")
MAX_CONTROL_FRAME_BYTES = 1024


@dataclass(frozen=True)
class PtyRequest:
    session: str | None = None  # None: a new session; else one to resume (session_not_found when it is gone)
    cols: int = limits.DEFAULT_PTY_COLS
    rows: int = limits.DEFAULT_PTY_ROWS
    # a resume: the client has the session's output up to this byte offset, so the replay starts there (None: the
    # whole scrollback)
    offset: int | None = None


def _size(value: str | None, what: str, default: int) -> int:
    if value is None:
        return default
    if value.isascii() and value.isdigit() and len(value) <= 4 and 1 <= int(value) <= limits.MAX_PTY_SIZE:
        return int(value)
    raise ProtocolError("invalid_query", f"{what} is a whole number from 1 to {limits.MAX_PTY_SIZE}")


def validate_session_id(value: object) -> str:
    if not isinstance(value, str) or not _SESSION_ID.fullmatch(value):
        raise ProtocolError("invalid_query", "session is the 32 hex characters a `session` frame named")
    return value


def parse_pty_query(query: dict[str, str]) -> PtyRequest:
    """The query of GET …/pty (cols, rows, session, offset), every parameter already known to be one of those."""
    session = validate_session_id(query["session"]) if "session" in query else None
    cols = _size(query.get("cols"), "cols", limits.DEFAULT_PTY_COLS)
    rows = _size(query.get("rows"), "rows", limits.DEFAULT_PTY_ROWS)
    offset = validate_offset(query["offset"]) if "offset" in query else None
    if offset is not None and session is None:
        raise ProtocolError("invalid_query", "offset resumes a session: send it with session")
    return PtyRequest(session, cols, rows, offset)


def parse_control_frame(text: str) -> tuple[int, int]:
    """A client's text frame: only `{"type": "resize", "cols", "rows"}` → (cols, rows); anything else raises
    invalid_field (the session stays open: a bad frame is ignored by the caller after saying so)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONTROL_FRAME_BYTES:
        raise ProtocolError("invalid_field", f"control frames are at most {MAX_CONTROL_FRAME_BYTES} bytes")
    try:
        frame = json.loads(text)
    except ValueError:
        raise ProtocolError("invalid_json", "a text frame is one JSON object") from None
    if not isinstance(frame, dict) or frame.get("type") != "resize" or set(frame) != {"type", "cols", "rows"}:
        raise ProtocolError("invalid_field", 'the one control frame is {"type": "resize", "cols": N, "rows": N}')
    cols, rows = frame["cols"], frame["rows"]
    for value, what in ((cols, "cols"), (rows, "rows")):
        if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= limits.MAX_PTY_SIZE):
            raise ProtocolError("invalid_field", f"{what} is a whole number from 1 to {limits.MAX_PTY_SIZE}")
    return cols, rows
