"""How a workspace call travels from the Worker to its Durable Object: one POST per call.

    POST https://workspace/call/<op>
    x-flarebox-workspace: <namespace>/<workspace>
    body: the args as JSON — or, for a call that carries a stream (a file upload), the stream itself, with the args
    as ASCII JSON in x-flarebox-args.

The object's Response (often a stream) comes back unchanged.
"""

import json
from typing import Any

ORIGIN = "https://workspace"
CALL_PREFIX = "/call/"
WORKSPACE_HEADER = "x-flarebox-workspace"
ARGS_HEADER = "x-flarebox-args"


def call_url(op: str) -> str:
    return ORIGIN + CALL_PREFIX + op


def args_body(args: dict[str, Any]) -> bytes:
    return json.dumps(args, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def args_header(args: dict[str, Any]) -> str:
    # ensure_ascii: header values must be ASCII; non-ASCII paths survive as \u escapes.
    return json.dumps(args, ensure_ascii=True, separators=(",", ":"))


def op_from_path(path: str) -> str | None:
    return path[len(CALL_PREFIX) :] if path.startswith(CALL_PREFIX) else None
