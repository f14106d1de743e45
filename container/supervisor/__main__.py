"""python -m flarebox_supervisor [--host H --port P | --unix PATH | --listen-fd N [--ready-fd N]] [--user sandbox]
[--workdir DIR]

`--listen-fd` serves on an inherited unix socket that its parent already bound (the standalone runtime binds it in
a directory the sandbox cannot see, so nothing inside can move or replace the path the server connects to); the
supervisor calls listen() itself, so the server's SO_PEERCRED check sees the sandbox's process, not its own.
`--ready-fd` is an inherited pipe: one byte is written to it, and it is closed, once the supervisor listens, so
its parent connects then instead of polling."""

import sys

if __name__ == "__main__":
    # No TLS in the supervisor: the supervisor speaks plain HTTP only (its socket, and services on the sandbox's
    # loopback), but asyncio imports ssl when it can: milliseconds of start and megabytes of libssl in every
    # sandbox. asyncio treats ssl as absent then. Set before any other import; processes the supervisor starts
    # (commands, archive workers) are interpreters of their own.
    sys.modules.setdefault("ssl", None)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402

from flarebox_supervisor import __version__  # noqa: E402
from flarebox_supervisor.agent import make_file_access  # noqa: E402
from flarebox_supervisor.identity import resolve_identity  # noqa: E402
from flarebox_supervisor.settings import settings_from_env  # noqa: E402

log = logging.getLogger("flarebox_supervisor")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flarebox_supervisor", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0", help="TCP address to listen on (default 0.0.0.0)")  # noqa: S104
    parser.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    parser.add_argument("--unix", metavar="PATH", help="listen on this unix socket instead of TCP")
    parser.add_argument("--listen-fd", type=int, metavar="N", help="serve on this inherited, bound unix socket")
    parser.add_argument("--ready-fd", type=int, metavar="N", help="write one byte to this pipe once listening")
    parser.add_argument("--user", default="sandbox", help="unprivileged user for commands and files when root")
    parser.add_argument("--workdir", default="/workspace", help="default cwd of commands")
    return parser.parse_args(argv)


def _signal_ready(fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.write(fd, b"1")
    except OSError:
        pass  # the parent went away; it is not waiting any more
    finally:
        os.close(fd)


async def serve(args: argparse.Namespace, app) -> None:
    from flarebox_supervisor.httpserver import Server

    server = Server(app)
    if args.listen_fd is not None:
        await server.start(sock=socket.socket(fileno=args.listen_fd))
    elif args.unix:
        await server.start(path=args.unix)
    else:
        await server.start(host=args.host, port=args.port)
    _signal_ready(args.ready_fd)
    log.info("flarebox supervisor %s listening on %s as %s", __version__, server.name, app["identity"].name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    identity = resolve_identity(args.user)
    settings = settings_from_env(os.path.abspath(args.workdir))
    files = make_file_access(identity)  # forks the file agent now, while the process has a single thread
    from flarebox_supervisor.server import make_app  # the HTTP server and the routes: after the fork, not in the agent

    try:
        asyncio.run(serve(args, make_app(settings, identity, files)))
    finally:
        files.close()


if __name__ == "__main__":
    main()
