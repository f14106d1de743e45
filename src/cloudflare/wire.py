"""How a workspace call travels from the Worker to its Durable Object: one POST per call.

    POST https://workspace/call/<op>
    x-flarebox-workspace: <namespace>/<workspace>
    body: the op's typed args (durable/operations.py) as JSON — or, for a call that carries a stream (a file
    upload), the stream itself, with the args as ASCII JSON in x-flarebox-args.

The object's Response (often a stream) comes back unchanged.
"""

import json
from typing import Any

from durable import operations

ORIGIN = "https://workspace"
CALL_PREFIX = "/call/"
WORKSPACE_HEADER = "x-flarebox-workspace"
ARGS_HEADER = "x-flarebox-args"


def call_url(op: str) -> str:
    return ORIGIN + CALL_PREFIX + op


def args_body(args: Any) -> bytes:
    return json.dumps(operations.to_json(args), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def args_header(args: Any) -> str:
    # ensure_ascii: header values must be ASCII; non-ASCII paths survive as \u escapes.
    return json.dumps(operations.to_json(args), ensure_ascii=True, separators=(",", ":"))


def decode_args(op: str, raw: str | bytes) -> Any:
    """The typed args of `op` from what args_body/args_header produced; not_found for an unknown op."""
    return operations.from_json(op, json.loads(raw))


def op_from_path(path: str) -> str | None:
    return path[len(CALL_PREFIX) :] if path.startswith(CALL_PREFIX) else None
