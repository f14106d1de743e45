"""How a workspace call travels from the Worker to its Durable Object: one POST per call.

    POST https://workspace/call/<op>
    x-flarebox-workspace: <namespace>/<workspace>
    body: the op's typed args (durable/operations.py) as JSON — or, for a call that carries a stream (a file
    upload), the stream itself, with the args as ASCII JSON in x-flarebox-args.

The object's Response (often a stream) comes back unchanged.

A WebSocket operation (the terminal, `pty`) is the client's upgrade, forwarded: a GET with `Upgrade: websocket` and
no body (the runtime turns any upgrade through a stub into one), its args in x-flarebox-args. The object answers 101
with its WebSocketPair's client end, or refuses like any call (cloudflare/sockets.py).

A directory call is the same shape, to the one directory object (`env.DIRECTORY.getByName("directory")`):

    POST https://directory/call/<op>
    body: the op's args as a JSON object (directory/directory.py takes and gives JSON-shaped values)

and its answer is JSON: 200 with the op's result, or a protocol error body with the code's status.
"""

import json
from typing import Any

from durable import operations

ORIGIN = "https://workspace"
CALL_PREFIX = "/call/"
DIRECTORY_ORIGIN = "https://directory"
DIRECTORY_NAME = "directory"  # the deployment's one directory object
WORKSPACE_HEADER = "x-flarebox-workspace"
ARGS_HEADER = "x-flarebox-args"


def call_url(op: str) -> str:
    return ORIGIN + CALL_PREFIX + op


def directory_url(op: str) -> str:
    return DIRECTORY_ORIGIN + CALL_PREFIX + op


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_directory_args(raw: bytes) -> dict[str, Any]:
    """A directory call's args; ValueError unless the body is one JSON object."""
    args = json.loads(raw) if raw else None
    if not isinstance(args, dict):
        raise ValueError("a directory call's body is a JSON object of its args")
    return args


def args_body(args: Any) -> bytes:
    return json_bytes(operations.to_json(args))


def args_header(args: Any) -> str:
    # ensure_ascii: header values must be ASCII; non-ASCII paths survive as \u escapes.
    return json.dumps(operations.to_json(args), ensure_ascii=True, separators=(",", ":"))


def decode_args(op: str, raw: str | bytes) -> Any:
    """The typed args of `op` from what args_body/args_header produced; not_found for an unknown op."""
    return operations.from_json(op, json.loads(raw))


def op_from_path(path: str) -> str | None:
    return path[len(CALL_PREFIX) :] if path.startswith(CALL_PREFIX) else None


def op_from_url(url: str) -> str | None:
    rest = url.split("://", 1)[-1]
    slash = rest.find("/")
    return op_from_path(rest[slash:].split("?", 1)[0]) if slash >= 0 else None
