"""Exec stream events (NDJSON, one JSON object per line) and their encoding."""

import json

STATUS_PHASES = ("starting", "restoring", "ready")
CONTAINER_STATES = ("continuing", "fresh", "restored", "restarted")
EXIT_REASONS = ("exited", "timeout", "cancelled", "signal")
EVENT_TYPES = ("status", "started", "output", "heartbeat", "exit", "error")
TERMINAL_TYPES = ("exit", "error")


def status_event(phase: str, message: str = "") -> dict:
    if phase not in STATUS_PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    event = {"type": "status", "phase": phase}
    if message:
        event["message"] = message
    return event


def started_event(
    request_id: str | None, container: str, snapshot: dict | None = None, backup: dict | None = None
) -> dict:
    """`container` tells the client what survived: processes and files (continuing), nothing: a new workspace
    (fresh), files as of `snapshot` and no processes (restored), or all files but no processes (restarted: the
    sandbox died but its disk survived, which only the standalone runtime can offer). A restored container says
    `from`: "snapshot", or "backup" with that backup when every snapshot had expired (or a backup was chosen)."""
    if container not in CONTAINER_STATES:
        raise ValueError(f"unknown container state {container!r}")
    event = {"type": "started", "request_id": request_id, "container": container, "snapshot": snapshot}
    if backup is not None:
        event.update({"from": "backup", "backup": backup})
    elif container == "restored":
        event["from"] = "snapshot"
    return event


def output_event(data: str, offset: int) -> dict:
    """`offset` counts code points of this command's output before `data`; reattach with ?offset=N."""
    return {"type": "output", "data": data, "offset": offset}


def heartbeat_event() -> dict:
    return {"type": "heartbeat"}


def exit_event(exit_code: int, reason: str, duration_ms: int) -> dict:
    if reason not in EXIT_REASONS:
        raise ValueError(f"unknown exit reason {reason!r}")
    return {"type": "exit", "exit_code": exit_code, "reason": reason, "duration_ms": duration_ms}


def error_event(code: str, message: str | None = None) -> dict:
    from protocol.errors import ERRORS

    if code not in ERRORS:
        raise ValueError(f"unknown error code {code!r}")
    return {"type": "error", "code": code, "message": message or ERRORS[code][1]}


def encode_event(event: dict) -> bytes:
    """One NDJSON line. ensure_ascii=False keeps output compact; separators drop padding."""
    return (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def decode_line(line: bytes | str) -> dict:
    """Parse one NDJSON line into an event, rejecting anything that is not a known event object."""
    if isinstance(line, bytes):
        line = line.decode("utf-8")
    event = json.loads(line)
    if not isinstance(event, dict) or event.get("type") not in EVENT_TYPES:
        raise ValueError("not a protocol event")
    return event


def is_terminal(event: dict) -> bool:
    return event.get("type") in TERMINAL_TYPES
