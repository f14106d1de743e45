"""Flarebox protocol v1: the wire contract shared by the Worker, the Durable Object, the supervisor and clients.

Plain Python with no third-party imports: it runs under CPython and under Pyodide.
"""

from protocol.errors import ERRORS, ProtocolError, error_body, http_status
from protocol.events import (
    CONTAINER_STATES,
    EXIT_REASONS,
    STATUS_PHASES,
    decode_line,
    encode_event,
    error_event,
    exit_event,
    heartbeat_event,
    output_event,
    started_event,
    status_event,
)
from protocol.limits import *  # noqa: F403 - the limits are the module's public surface
from protocol.validate import (
    ExecRequest,
    WorkspaceConfig,
    parse_exec_request,
    parse_json_object,
    parse_workspace_config,
    validate_abs_path,
    validate_name,
    validate_offset,
    validate_request_id,
)

PROTOCOL_VERSION = 1

__all__ = [
    "PROTOCOL_VERSION",
    "ERRORS",
    "ProtocolError",
    "error_body",
    "http_status",
    "EXIT_REASONS",
    "CONTAINER_STATES",
    "STATUS_PHASES",
    "decode_line",
    "encode_event",
    "error_event",
    "exit_event",
    "heartbeat_event",
    "output_event",
    "started_event",
    "status_event",
    "ExecRequest",
    "WorkspaceConfig",
    "parse_exec_request",
    "parse_json_object",
    "parse_workspace_config",
    "validate_abs_path",
    "validate_name",
    "validate_offset",
    "validate_request_id",
]
