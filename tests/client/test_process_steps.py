"""RemoteProcess's decision after a failed attempt (`next_step`): a table of failures → what the reader does next.

Pure: no server, no thread. The live behaviour (a cut stream reattached, a busy workspace waited out) is in
test_process_live.py."""

import pytest

from flarebox_hermes.client import ApiError, FlareboxError, ProtocolViolation, TransportError
from flarebox_hermes.process import (
    CANCELLED_EXIT_CODE,
    FINISH,
    GIVE_UP,
    REATTACH,
    RESEND,
    Failure,
    Step,
    next_step,
)

BUSY = ApiError(409, "workspace_busy", "saving")
CANCELLED = ApiError(409, "command_cancelled", "cancelled")
NOT_FOUND = ApiError(404, "request_not_found", "no such request")
CUT = TransportError("cut", reason="the stream ended early")
REFUSED = TransportError("refused", connected=False, reason="connection refused")


def failure(error: FlareboxError, **known) -> Failure:
    # defaults: the first attempt, sent and not yet started, plenty of busy time left
    fields = {"started": False, "sent": True, "request_built": True, "killed": False, "busy_retry_left": True}
    fields["failures"] = 1 if isinstance(error, TransportError) else 0
    return Failure(error, **{**fields, **known})


def gave_up(code: str, message: str) -> Step:
    return Step(GIVE_UP, error_code=code, message=message)


EXITED_CANCELLED = Step(FINISH, exit_code=CANCELLED_EXIT_CODE)
REFUSED_BUSY = gave_up("workspace_busy", "the Flarebox server refused the command: workspace_busy: saving")
LOST = gave_up("transport", "lost the connection to the Flarebox server: the stream ended early")
UNREACHABLE = gave_up("transport", "cannot reach the Flarebox server: connection refused; the command did not run")

TABLE = [
    # --- the server refused (ApiError)
    ("busy before it started: resend under a fresh id", failure(BUSY), Step(RESEND, delay=0.5)),
    ("busy but killed meanwhile: never sent again", failure(BUSY, killed=True), EXITED_CANCELLED),
    ("killed wins over busy time running out", failure(BUSY, killed=True, busy_retry_left=False), EXITED_CANCELLED),
    ("busy for too long", failure(BUSY, busy_retry_left=False), REFUSED_BUSY),
    ("busy on a reattach is not resent", failure(BUSY, started=True), REFUSED_BUSY),
    ("cancelled before it started", failure(CANCELLED), EXITED_CANCELLED),
    ("cancelled on a reattach", failure(CANCELLED, started=True), EXITED_CANCELLED),
    (
        "a reattach finds no such command",
        failure(NOT_FOUND, started=True),
        gave_up("request_not_found", "the Flarebox server refused the command: request_not_found: no such request"),
    ),
    # --- the connection failed (TransportError)
    ("never connected, nothing sent: did not run", failure(REFUSED), UNREACHABLE),
    ("never connected outranks too many failures", failure(REFUSED, failures=9), UNREACHABLE),
    ("never connected outranks a failed upload", failure(REFUSED, request_built=False), UNREACHABLE),
    ("cut after sending: reattach from 0", failure(CUT), Step(REATTACH, delay=0.5, assume_started=True)),
    ("refused while reattaching: reattach again", failure(REFUSED, started=True), Step(REATTACH, delay=0.5)),
    ("second failure in a row", failure(CUT, started=True, failures=2), Step(REATTACH, delay=1.0)),
    ("backoff is capped", failure(CUT, started=True, failures=3), Step(REATTACH, delay=2.0)),
    ("the last allowed reattach", failure(CUT, started=True, failures=4), Step(REATTACH, delay=2.0)),
    ("too many failures in a row", failure(CUT, started=True, failures=5), LOST),
    ("too many failures outranks a failed upload", failure(CUT, request_built=False, failures=5), LOST),
    (
        "uploading stdin failed: nothing to reattach to",
        failure(CUT, request_built=False, sent=False),
        gave_up("transport", "could not upload stdin to the Flarebox server: the stream ended early"),
    ),
    ("not yet sent: reattach without assuming a start", failure(CUT, sent=False), Step(REATTACH, delay=0.5)),
    # --- the server broke the protocol (any other FlareboxError)
    (
        "a protocol violation",
        failure(ProtocolViolation("event after the end"), started=True),
        gave_up("protocol", "the Flarebox server broke the protocol: event after the end"),
    ),
    (
        "any other client error",
        failure(FlareboxError("odd")),
        gave_up("protocol", "the Flarebox server broke the protocol: odd"),
    ),
]


@pytest.mark.parametrize(("known", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_next_step(known, expected):
    assert next_step(known) == expected
