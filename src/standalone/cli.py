"""The `flarebox` command: `serve` runs the standalone runtime; the other commands are a small client of any Flarebox
server (this machine's by default, or HERMES_CF_ENDPOINT/HERMES_CF_TOKEN) built on the shared protocol client."""

import argparse
import contextlib
import json
import os
import signal
import sys
import uuid
from pathlib import Path

DEFAULT_PORT = 8787
DEFAULT_NAMESPACE = "default"
ERROR_EXIT = 125  # flarebox itself failed (as docker does); a command's own exit code is passed through
CANCELLED_EXIT = 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flarebox", description="A sandboxed remote terminal for AI agents.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the standalone server on this machine")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    serve.add_argument("--data-dir", type=Path, default=None, help="where workspaces, snapshots and the token live")
    serve.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))

    def workspace_command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("workspace")
        p.add_argument("--namespace", "-n", default=os.environ.get("HERMES_CF_NAMESPACE") or DEFAULT_NAMESPACE)
        return p

    run = workspace_command("exec", "run a command in a workspace (created with defaults if missing)")
    run.add_argument("--timeout", type=float, default=None, help="seconds (default 120, at most 900)")
    run.add_argument("--cwd", default=None, help="working directory inside the workspace")
    run.add_argument("--login", action="store_true", help="run in a login shell (bash -lc)")
    run.add_argument("--stdin", "-i", action="store_true", help="send this process's stdin to the command")
    run.add_argument("--ephemeral", action="store_true", help="create the workspace as non-persistent")
    run.add_argument("argv", nargs="*", help="-- COMMAND... (joined with spaces, run by bash -c)")
    workspace_command("status", "show a workspace's state")
    workspace_command("snapshot", "save a snapshot now (the workspace keeps running)")
    workspace_command("snapshots", "list a workspace's snapshots, newest first")
    workspace_command("stop", "snapshot and stop (ephemeral: destroy)")
    workspace_command("rm", "delete a workspace, its container and its snapshots")

    hermes = sub.add_parser("hermes", help="Hermes plugin helpers")
    hermes.add_argument("action", choices=("install",))
    hermes.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if argv[:1] == ["exec"] and "--" in argv:
        # everything after `--` is the command, even words that look like flarebox options
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    if args.command == "exec":
        args.argv = args.argv + command
    if args.command == "serve":
        from standalone.config import default_data_dir
        from standalone.serve import run_server

        return run_server(
            host=args.host, port=args.port, data_dir=args.data_dir or default_data_dir(), log_level=args.log_level
        )
    if args.command == "hermes":
        from standalone import hermes_install  # written alongside the plugin; imported only when asked for

        return hermes_install.main(args.rest)
    return _client_command(args)


# --- client commands -----------------------------------------------------------------------------------------------


def _client():
    from flarebox_hermes.client import Client
    from standalone.config import default_data_dir
    from standalone.token import read_local_token

    endpoint = os.environ.get("HERMES_CF_ENDPOINT")
    token = os.environ.get("HERMES_CF_TOKEN")
    if endpoint and not token:
        # never send this machine's token to another server
        raise SystemExit("flarebox: HERMES_CF_ENDPOINT is set: set HERMES_CF_TOKEN to that server's token too")
    if not endpoint:
        endpoint = f"http://127.0.0.1:{DEFAULT_PORT}"
        token = token or read_local_token(default_data_dir())
    if not token:
        where = default_data_dir() / "token"
        raise SystemExit(f"flarebox: no token: set HERMES_CF_TOKEN, or run `flarebox serve` once to create {where}")
    return Client(endpoint, token)


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False))


def _client_command(args) -> int:
    from flarebox_hermes.client import ApiError, FlareboxError

    try:
        with _client() as client:
            ns, ws = args.namespace, args.workspace
            if args.command == "exec":
                return _exec(client, args)
            if args.command == "status":
                _print_json(client.get_workspace(ns, ws))
            elif args.command == "snapshot":
                _print_json(client.snapshot(ns, ws))
            elif args.command == "snapshots":
                _print_json(client.snapshots(ns, ws))
            elif args.command == "stop":
                _print_json(client.stop(ns, ws))
            elif args.command == "rm":
                _print_json(client.delete_workspace(ns, ws))
            return 0
    except ApiError as err:
        print(f"flarebox: {err.code}: {err.message}", file=sys.stderr)
        # exec's own exit codes belong to the command; flarebox's failures get 125 there
        return ERROR_EXIT if args.command == "exec" else 1
    except (FlareboxError, ValueError) as err:
        print(f"flarebox: {err}", file=sys.stderr)
        return ERROR_EXIT


def _exec(client, args) -> int:
    from flarebox_hermes.client import ApiError

    argv = args.argv
    if not argv:
        print("flarebox: nothing to run: flarebox exec WS -- COMMAND...", file=sys.stderr)
        return 2
    ns, ws = args.namespace, args.workspace
    try:
        client.get_workspace(ns, ws)
    except ApiError as err:
        if err.code != "workspace_not_found":
            raise
        client.put_workspace(ns, ws, {"persistent": not args.ephemeral})
        print(f"flarebox: created workspace {ns}/{ws}", file=sys.stderr)
    request = {"request_id": uuid.uuid4().hex, "command": " ".join(argv), "login": args.login, "env": {}}
    if args.timeout is not None:
        request["timeout"] = args.timeout
    if args.cwd is not None:
        request["cwd"] = args.cwd
    if args.stdin:
        request["stdin"] = sys.stdin.read()
    # Ctrl-C: ask the server to cancel, then finish reading the stream so the exit code is the real one.
    interrupted = []

    def on_sigint(signum, frame):
        if interrupted:
            raise KeyboardInterrupt
        interrupted.append(True)
        try:
            client.cancel(ns, ws, request["request_id"])
            print("\nflarebox: cancelling…", file=sys.stderr)
        except Exception as exc:  # cancel failed: leave now
            print(f"\nflarebox: cancel failed: {exc}", file=sys.stderr)
            raise KeyboardInterrupt from None

    previous = signal.signal(signal.SIGINT, on_sigint)
    out = sys.stdout
    try:
        for event in client.exec(ns, ws, request):
            kind = event["type"]
            if kind == "output":
                out.write(event["data"])
                out.flush()
            elif kind == "status":
                message = f": {event['message']}" if event.get("message") else ""
                print(f"flarebox: {event['phase']}{message}", file=sys.stderr)
            elif kind == "started":
                snapshot = event.get("snapshot")
                extra = f" (snapshot {snapshot['id']} of {snapshot['created_at']})" if snapshot else ""
                print(f"flarebox: container: {event['container']}{extra}", file=sys.stderr)
            elif kind == "exit":
                if event["reason"] != "exited":
                    print(f"flarebox: {event['reason']} (exit {event['exit_code']})", file=sys.stderr)
                return event["exit_code"]
            elif kind == "error":
                if event["code"] == "command_cancelled" and interrupted:
                    return CANCELLED_EXIT
                print(f"flarebox: {event['code']}: {event['message']}", file=sys.stderr)
                return ERROR_EXIT
    except KeyboardInterrupt:
        return CANCELLED_EXIT
    except BrokenPipeError:
        # our reader went away (`flarebox exec … | head`): stop the command too, and exit as a SIGPIPE'd one would
        with contextlib.suppress(Exception):
            client.cancel(ns, ws, request["request_id"])
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 128 + signal.SIGPIPE
    finally:
        signal.signal(signal.SIGINT, previous)
    return ERROR_EXIT  # not reached: the client raises when a stream ends without its terminal event


if __name__ == "__main__":
    sys.exit(main())
