"""The `flarebox` command: `serve` runs the standalone runtime; the other commands are a small client of any Flarebox
server (this machine's by default; --endpoint/--token-file, FLAREBOX_ENDPOINT/FLAREBOX_TOKEN or
HERMES_CF_ENDPOINT/HERMES_CF_TOKEN for another one) built on the shared protocol client.

Exit codes: `exec` and `attach` pass the command's exit code through; every failure of flarebox itself (usage,
configuration, an unreachable server, an API error, a dropped stream) is 125, as docker does. The other client
commands exit 0, 1 for an API error (named by its code) or a local file error, and 125 for everything else.

The token may be the deployment's token or a scoped key (`fbk_…`, minted by `flarebox keys create`): both are sent
the same way, and a key's refusals (403 forbidden, 401 for a revoked or expired one) say which key it was.
"""

import argparse
import contextlib
import os
import shlex
import signal
import sys
import uuid
from pathlib import Path

from standalone import cli_keys, cli_snapshots
from standalone.cli_copy import cp
from standalone.cli_support import (
    ConfigError,
    FileError,
    UsageError,
    credential_hint,
    ensure_workspace,
    print_json,
    say,
)

DEFAULT_PORT = 8787
DEFAULT_NAMESPACE = "default"
LOCAL_ENDPOINT = f"http://127.0.0.1:{DEFAULT_PORT}"
ERROR_EXIT = 125  # flarebox itself failed (as docker does); a command's own exit code is passed through
API_ERROR_EXIT = 1  # the non-exec commands: the server refused (named by its code), or a local file error
CANCELLED_EXIT = 130
MAX_STDIN_BYTES = 1024 * 1024  # the whole exec request is a JSON body of at most 1 MiB
CLIENT_COMMANDS = ("exec", "attach", "cp", "shell", "status", "stop", "rm", *cli_snapshots.COMMANDS)
DEPLOYMENT_COMMANDS = ("keys", "ls", "audit")  # about the deployment, not one workspace (standalone/cli_keys.py)
# their exit code is the command's (a shell's: the remote shell's): every failure of flarebox's own is 125
STREAM_COMMANDS = ("exec", "attach", "shell")
VALUE_OPTIONS = ("--endpoint", "--token-file", "--namespace", "-n")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors are flarebox's own failures: 125, never a code a command could exit with
        self.print_usage(sys.stderr)
        self.exit(ERROR_EXIT, f"{self.prog}: error: {message}\n")


def _default_namespace() -> str:
    return os.environ.get("FLAREBOX_NAMESPACE") or os.environ.get("HERMES_CF_NAMESPACE") or DEFAULT_NAMESPACE


def _add_connection_options(parser: argparse.ArgumentParser, *, top: bool, namespace_help: str | None = None) -> None:
    # on the top parser they default to None; on each subcommand they are SUPPRESSed, so an option given before
    # the subcommand is not overwritten by the subcommand's default (and one given after it wins). A namespace
    # still None after parsing is the default one (_main), except for the listings, where it means "all".
    default = None if top else argparse.SUPPRESS
    group = parser.add_argument_group("server")
    group.add_argument(
        "--endpoint",
        metavar="URL",
        default=default,
        help=f"the Flarebox server (else $FLAREBOX_ENDPOINT, $HERMES_CF_ENDPOINT, else {LOCAL_ENDPOINT})",
    )
    group.add_argument(
        "--token-file",
        metavar="FILE",
        type=Path,
        default=default,
        help="read the server's token from FILE (else $FLAREBOX_TOKEN, $HERMES_CF_TOKEN, else the local server's)",
    )
    group.add_argument(
        "--namespace",
        "-n",
        metavar="NS",
        default=default,
        help=namespace_help
        or "the workspace's namespace (else $FLAREBOX_NAMESPACE, $HERMES_CF_NAMESPACE, else default)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flarebox", description="A sandboxed remote terminal for AI agents.")
    _add_connection_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the standalone server on this machine")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    serve.add_argument("--data-dir", type=Path, default=None, help="where workspaces, snapshots and the token live")
    serve.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    serve.add_argument(
        "--workers",
        default=None,
        metavar="N",
        help="worker processes, each owning a share of the workspaces: 1-64, or 0 / auto for one per core "
        "(else $FLAREBOX_WORKERS, else 1)",
    )

    def client_command(name: str, help_text: str, *, workspace: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        _add_connection_options(p, top=False)
        if workspace:
            p.add_argument("workspace")
        return p

    run = client_command("exec", "run a command in a workspace (created with defaults if missing)")
    run.add_argument("--timeout", type=float, default=None, help="seconds (default 120, at most 900)")
    run.add_argument("--cwd", default=None, help="working directory inside the workspace")
    run.add_argument("--login", action="store_true", help="run in a login shell (bash -lc)")
    run.add_argument("--stdin", "-i", action="store_true", help="send this process's stdin (UTF-8 text) to the command")
    run.add_argument("--ephemeral", action="store_true", help="create the workspace as non-persistent")
    run.add_argument("--verbose", "-v", action="store_true", help="also say when the container was already running")
    run.add_argument("argv", nargs="*", help="-- COMMAND... (joined with spaces, run by bash -c)")
    attach = client_command("attach", "follow a command started by exec (after a dropped connection) to its end")
    attach.add_argument("request_id", help="the id `flarebox exec` printed when its connection dropped")
    attach.add_argument("--offset", type=int, default=0, help="skip the first N characters of output (default 0)")
    cp = client_command(
        "cp", "copy a file into or out of a workspace: cp SRC WS:/abs/path | cp WS:/abs/path DST", workspace=False
    )
    cp.add_argument("source")
    cp.add_argument("destination")
    client_command("shell", "open an interactive terminal in a workspace (created with defaults if missing)")
    client_command("status", "show a workspace's state")
    cli_snapshots.add_parsers(client_command)
    client_command("stop", "snapshot and stop (ephemeral: destroy)")
    client_command("rm", "delete a workspace, its container and its snapshots")
    cli_keys.add_parsers(sub, lambda p, ns_help: _add_connection_options(p, top=False, namespace_help=ns_help))
    mcp = client_command(
        "mcp", "serve a workspace to an MCP client (Model Context Protocol, on stdio)", workspace=False
    )
    mcp.add_argument("--workspace", "-w", default="default", help="the workspace its tools use (default: default)")

    hermes = sub.add_parser("hermes", help="Hermes helpers: install the plugin, host Hermes' API server in a workspace")
    hermes.add_argument("action", choices=("install", "host"))
    hermes.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _split_exec_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """For exec, everything after the first `--` is the command, even words that look like flarebox options."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in VALUE_OPTIONS else 1
    if i < len(argv) and argv[i] == "exec" and "--" in argv[i:]:
        cut = argv.index("--", i)
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command ran (while importing, or before a request was sent)
        print(file=sys.stderr)
        return CANCELLED_EXIT


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, command = _split_exec_command(argv)
    args = _parser().parse_args(argv)
    if args.command == "exec":
        args.argv = args.argv + command
    if args.command == "serve":
        from standalone.config import default_data_dir
        from standalone.serve import run_server

        return run_server(
            host=args.host,
            port=args.port,
            data_dir=args.data_dir or default_data_dir(),
            log_level=args.log_level,
            workers=args.workers,
        )
    if args.command == "hermes" and args.action == "host":
        from standalone import hermes_host

        return hermes_host.main(args.rest, top=args)
    if args.command == "hermes":
        from standalone import hermes_install  # written alongside the plugin; imported only when asked for

        return hermes_install.main(args.rest)
    if args.namespace is None and args.command not in DEPLOYMENT_COMMANDS:
        args.namespace = _default_namespace()
    if args.command == "mcp":
        try:
            from standalone import mcp_server  # the MCP SDK is imported only when asked for
        except ModuleNotFoundError as err:
            if err.name not in ("mcp", "pydantic"):
                raise
            say(f"flarebox mcp needs the MCP Python SDK ({err.name} is missing): pip install 'mcp>=1.27,<2'")
            return ERROR_EXIT
        return mcp_server.main(args)
    return _client_command(args)


# --- which server, which token -------------------------------------------------------------------------------------


def _normalized(endpoint: str | None) -> str | None:
    return endpoint.rstrip("/") if endpoint else None


def resolve_target(args, environ=None) -> tuple[str, str, str]:
    """(endpoint, token, where the endpoint came from). Endpoint: --endpoint > FLAREBOX_ENDPOINT >
    HERMES_CF_ENDPOINT > the local server. A token goes only to the endpoint it was given with: --token-file to
    whichever endpoint is used; FLAREBOX_TOKEN / HERMES_CF_TOKEN to their own *_ENDPOINT when that is set (else to
    any); this machine's token (<data-dir>/token) only to the local server."""
    from flarebox_hermes.client import check_endpoint
    from standalone.config import default_data_dir
    from standalone.token import read_local_token, token_path

    environ = os.environ if environ is None else environ
    chosen = [
        ("--endpoint", getattr(args, "endpoint", None)),
        ("FLAREBOX_ENDPOINT", environ.get("FLAREBOX_ENDPOINT")),
        ("HERMES_CF_ENDPOINT", environ.get("HERMES_CF_ENDPOINT")),
    ]
    where, endpoint = next(((w, e) for w, e in chosen if e), ("the local server", LOCAL_ENDPOINT))
    try:
        endpoint = check_endpoint(endpoint)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None

    token_file = getattr(args, "token_file", None)
    if token_file is not None:
        try:
            token = Path(token_file).expanduser().read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"--token-file {token_file}: {getattr(err, 'strerror', None) or err}") from None
        if not token:
            raise ConfigError(f"--token-file {token_file} is empty")
        return endpoint, token, where
    for name, bound_to in (("FLAREBOX_TOKEN", "FLAREBOX_ENDPOINT"), ("HERMES_CF_TOKEN", "HERMES_CF_ENDPOINT")):
        token, bound = environ.get(name), _normalized(environ.get(bound_to))
        if token and (bound is None or bound == endpoint):
            return endpoint, token, where
    if endpoint == LOCAL_ENDPOINT:
        data_dir = default_data_dir()
        token = read_local_token(data_dir)
        if token:
            return endpoint, token, where
        raise ConfigError(
            f"no token: run `flarebox serve` once to create {token_path(data_dir)}, "
            "or pass --token-file FILE / set FLAREBOX_TOKEN"
        )
    raise ConfigError(
        f"no token for {endpoint} (from {where}): pass --token-file FILE or set FLAREBOX_TOKEN "
        "(this machine's token, or one set for another endpoint, is never sent to it)"
    )


# --- client commands -----------------------------------------------------------------------------------------------


def _client_command(args) -> int:
    from flarebox_hermes.client import ApiError, Client, FlareboxError, TransportError

    own_failure = ERROR_EXIT if args.command in STREAM_COMMANDS else API_ERROR_EXIT
    token = ""
    try:
        endpoint, token, _ = resolve_target(args)
        client = Client(endpoint, token)
    except (ConfigError, ValueError) as err:
        say(str(err))
        return ERROR_EXIT
    try:
        with client:
            ns = args.namespace
            if args.command == "exec":
                return _exec(client, args)
            if args.command == "attach":
                return _follow(client, args, args.request_id, args.offset)
            if args.command == "cp":
                return cp(client, args)
            if args.command == "shell":
                from standalone import cli_shell  # imports the WebSocket library: only when asked for

                return cli_shell.run(client, endpoint, token, args)
            if args.command in DEPLOYMENT_COMMANDS:
                return cli_keys.run(client, args)
            ws = args.workspace
            if args.command == "status":
                print_json(client.get_workspace(ns, ws))
            elif args.command in cli_snapshots.COMMANDS:
                return cli_snapshots.run(client, args)
            elif args.command == "stop":
                print_json(client.stop(ns, ws))
            elif args.command == "rm":
                print_json(client.delete_workspace(ns, ws))
            return 0
    except UsageError as err:
        say(str(err))
        return ERROR_EXIT
    except FileError as err:
        say(str(err))
        return API_ERROR_EXIT
    except ApiError as err:
        say(f"{err.code}: {err.message}{credential_hint(err, token)}")
        return own_failure
    except TransportError as err:
        if not err.connected:
            hint = " (is `flarebox serve` running?)" if client.endpoint == LOCAL_ENDPOINT else ""
            say(f"cannot reach {client.endpoint}: {err.reason}{hint}")
        else:
            say(f"{client.endpoint}: {err}")
        return ERROR_EXIT
    except (FlareboxError, ValueError) as err:
        say(str(err))
        return ERROR_EXIT
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return CANCELLED_EXIT


def _read_stdin() -> str:
    data = sys.stdin.buffer.read(MAX_STDIN_BYTES + 1)
    if len(data) > MAX_STDIN_BYTES:
        raise UsageError(
            "stdin is over 1 MiB, more than one request can carry: upload it with `flarebox cp FILE WS:/tmp/in` "
            "and redirect (`-- 'COMMAND < /tmp/in'`)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError("stdin must be UTF-8 text (use flarebox cp to upload binary files)") from None


def _exec(client, args) -> int:
    argv = args.argv
    if not argv:
        raise UsageError("nothing to run: flarebox exec WS -- COMMAND...")
    stdin = _read_stdin() if args.stdin else None  # checked before anything happens on the server
    ns, ws = args.namespace, args.workspace
    ensure_workspace(client, ns, ws, persistent=not args.ephemeral)
    request = {"request_id": uuid.uuid4().hex, "command": " ".join(argv), "login": args.login, "env": {}}
    if args.timeout is not None:
        request["timeout"] = args.timeout
    if args.cwd is not None:
        request["cwd"] = args.cwd
    if stdin is not None:
        request["stdin"] = stdin
    try:
        stream = client.exec(ns, ws, request)
    except ValueError as err:  # the body is over the limit (JSON escaping grew the stdin)
        raise UsageError(f"{err}: upload large input with `flarebox cp` and redirect it") from None
    return _follow(client, args, request["request_id"], 0, stream=stream)


def _attach_hint(args, request_id: str, offset: int) -> str:
    words = ["flarebox"]
    if getattr(args, "endpoint", None):
        words += ["--endpoint", args.endpoint]
    if getattr(args, "token_file", None):
        words += ["--token-file", str(args.token_file)]
    words.append("attach")
    if args.namespace != _default_namespace():
        words += ["-n", args.namespace]
    words += [args.workspace, request_id]
    if offset:
        words += ["--offset", str(offset)]
    return shlex.join(words)


def _follow(client, args, request_id: str, offset: int, *, stream=None) -> int:
    """Show a command's events (a fresh exec stream, or a reattach from `offset`) and return its exit code.
    Ctrl-C asks the server to cancel, then keeps reading so the exit code is the real one; a second Ctrl-C leaves."""
    from flarebox_hermes.client import ProtocolViolation, TransportError

    ns, ws = args.namespace, args.workspace
    if stream is None:
        stream = client.reattach(ns, ws, request_id, offset)
    interrupted = []

    def on_sigint(signum, frame):
        if interrupted:
            raise KeyboardInterrupt
        interrupted.append(True)
        try:
            client.cancel(ns, ws, request_id)
            print("\nflarebox: cancelling…", file=sys.stderr, flush=True)
        except Exception as exc:  # cancel failed: leave now
            print(f"\nflarebox: cancel failed: {exc}", file=sys.stderr, flush=True)
            raise KeyboardInterrupt from None

    previous = signal.signal(signal.SIGINT, on_sigint)
    out = sys.stdout
    verbose = getattr(args, "verbose", False)
    try:
        for event in stream:
            kind = event["type"]
            if kind == "output":
                out.write(event["data"])
                out.flush()
                offset = event["offset"] + len(event["data"])
            elif kind == "status":
                message = f": {event['message']}" if event.get("message") else ""
                say(f"{event['phase']}{message}")
            elif kind == "started":
                if event["container"] == "continuing" and not verbose:
                    continue  # the usual case; fresh / restored / restarted are news (processes are gone)
                snapshot = event.get("snapshot")
                extra = f" (snapshot {snapshot['id']} of {snapshot['created_at']})" if snapshot else ""
                say(f"container: {event['container']}{extra}")
            elif kind == "exit":
                if event["reason"] != "exited":
                    say(f"{event['reason']} (exit {event['exit_code']})")
                return event["exit_code"]
            elif kind == "error":
                if event["code"] == "command_cancelled" and interrupted:
                    return CANCELLED_EXIT
                say(f"{event['code']}: {event['message']}")
                return ERROR_EXIT
    except KeyboardInterrupt:
        return CANCELLED_EXIT
    except BrokenPipeError:
        # our reader went away (`flarebox exec … | head`): stop the command too, and exit as a SIGPIPE'd one would
        with contextlib.suppress(Exception):
            client.cancel(ns, ws, request_id)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 128 + signal.SIGPIPE
    except (TransportError, ProtocolViolation) as err:
        if isinstance(err, TransportError) and not err.connected:
            raise  # no connection was made: an exec certainly did not arrive (reported as an unreachable server)
        with contextlib.suppress(BrokenPipeError):
            out.flush()
        say(f"{client.endpoint}: {err}")
        say(f"the connection dropped; the command may still be running: {_attach_hint(args, request_id, offset)}")
        return ERROR_EXIT
    finally:
        signal.signal(signal.SIGINT, previous)
    return ERROR_EXIT  # not reached: the client raises when a stream ends without its terminal event


if __name__ == "__main__":
    sys.exit(main())
