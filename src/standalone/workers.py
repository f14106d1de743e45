"""`flarebox serve --workers N`: N worker processes, each the owner of a share of the workspaces.

The parent binds the public socket, takes what is taken once per data dir (a root server's uid range, the private
runtime dir: sandbox_driver.ServerClaim), indexes the workspaces on disk, and forks the workers. Every worker
accepts on the shared socket and runs the whole edge; a workspace's calls go to its owner (placement.py), in process
or over the owner's unix socket in the runtime dir (shards.py). So a workspace's object, lock, boot, alarm, SQLite
file and sandbox all live in one process.

Start-up is a barrier: every worker builds its app (its snapshot store's crash cleanup included) and listens on its
worker socket, then the parent lets all of them accept clients — so no worker's cleanup runs while another already
saves a snapshot, and no call finds an owner not yet listening.

SIGINT/SIGTERM to the parent: every worker gets SIGTERM and shuts down as the one process does (streams get their
grace, sandboxes are stopped, files kept, SQLite closed); the parent exits 0 once all are gone. A worker that dies
on its own is reported and the server stops with status 1 — its share of the workspaces would otherwise be
unreachable while the rest goes on (a supervisor — systemd, a container runtime — restarts the whole server). A worker
whose parent dies gets SIGTERM (PR_SET_PDEATHSIG).
"""

import asyncio
import contextlib
import ctypes
import logging
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from durable.ports import Cipher
from durable.settings import Settings
from standalone import redact, seccomp
from standalone.cgroups import Cgroups
from standalone.sandbox_driver import ServerClaim
from standalone.seccomp import SeccompUnavailable
from standalone.token import ServerToken
from standalone.uids import UidRangeError, UnsafeDirError

log = logging.getLogger("flarebox.workers")

START_SECONDS = 120  # every worker built and serving within this, or the start fails
STOP_SECONDS = 120  # after SIGTERM, a worker still running after this (stopping its sandboxes) is killed
BUILT, SERVING = b"b", b"s"
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class _Serving:
    """What every worker is given alike: the shared socket, the parent's claim on the data dir, and the settings."""

    listener: socket.socket
    claim: ServerClaim
    data_dir: Path
    settings: Settings
    token: ServerToken
    cipher: Cipher | None
    log_level: str
    host: str
    port: int


@dataclass
class _Worker:
    index: int
    pid: int
    status_fd: int  # the worker's reports (BUILT, SERVING); end of file when it is gone
    go_fd: int  # the parent's word to start accepting
    exit_status: int | None = None


def _bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.set_inheritable(False)  # the workers get it by fork; nothing they exec (bwrap) does
    except BaseException:
        sock.close()
        raise
    return sock


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def run_workers(
    *, host, port, data_dir: Path, settings, token, cipher, workers: int, log_level: str, base_url: str
) -> int:
    from standalone.serve import adopt_workspaces, banner

    try:
        listener = _bind(host, port)
    except OSError as err:
        print(f"flarebox: cannot listen on {host}:{port}: {err.strerror or err}", file=sys.stderr)
        return 1
    try:
        try:
            claim = ServerClaim(data_dir)
        except (UidRangeError, UnsafeDirError) as err:
            print(f"flarebox: {err}", file=sys.stderr)
            return 2
        try:
            try:
                os.close(seccomp.filter_fd())  # checked once here: a worker would fail the same way
            except SeccompUnavailable as err:
                print(f"flarebox: {err}", file=sys.stderr)
                return 2
            _, limits_report = Cgroups.detect()
            adopt_workspaces(data_dir, settings)  # the index, once, before any worker opens it
            sys.stdout.flush()
            sys.stderr.flush()
            serving = _Serving(listener, claim, data_dir, settings, token, cipher, log_level, host, port)
            return _supervise(
                serving,
                workers,
                base_url,
                lambda: banner(sys.stdout, data_dir, host, token, base_url, limits_report, settings, workers),
            )
        finally:
            claim.close()
    finally:
        listener.close()


def _supervise(serving: _Serving, count: int, base_url: str, show) -> int:
    parent = os.getpid()
    started: list[_Worker] = []
    for index in range(count):
        status_r, status_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                _die_with_parent(parent)
                for other in started:
                    os.close(other.status_fd)
                    os.close(other.go_fd)
                os.close(status_r)
                os.close(go_w)
                code = _worker(serving, index, count, status_w, go_r)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        os.close(status_w)
        os.close(go_r)
        started.append(_Worker(index, pid, status_r, go_w))

    stop = _Stop()
    stop.install()
    try:
        if not _wait_for(started, BUILT, stop):
            return _stop_all(started, stop, failed=True)
        show()
        for w in started:
            os.write(w.go_fd, b"g")
        if not _wait_for(started, SERVING, stop):
            return _stop_all(started, stop, failed=True)
        sys.stdout.write(f"Listening on {base_url} with {count} worker processes  (Ctrl-C to stop)\n")
        sys.stdout.flush()
        failed = _watch(started, stop)
        return _stop_all(started, stop, failed=failed)
    finally:
        stop.uninstall()
        for w in started:
            _close_go(w)
            with contextlib.suppress(OSError):
                os.close(w.status_fd)


def _close_go(worker: _Worker) -> None:
    """A worker still waiting for the word to start reads the end of its pipe instead, and exits."""
    if worker.go_fd >= 0:
        with contextlib.suppress(OSError):
            os.close(worker.go_fd)
        worker.go_fd = -1


class _Stop:
    """SIGINT/SIGTERM to the parent, noticed through a wakeup pipe in the parent's select."""

    def __init__(self):
        self.signals: list[int] = []
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._previous: dict[int, object] = {}
        self._previous_fd = -1

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        self._previous_fd = signal.set_wakeup_fd(self._write_fd)

    def _handle(self, signum, frame) -> None:
        self.signals.append(signum)

    def uninstall(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        os.close(self.read_fd)
        os.close(self._write_fd)

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_fd, 256):
                pass


def _wait_for(workers: list[_Worker], word: bytes, stop: _Stop) -> bool:
    """Every worker said `word` (False: one died or failed first, a signal came, or START_SECONDS passed)."""
    waiting = {w.status_fd: w for w in workers}
    deadline = time.monotonic() + START_SECONDS
    with selectors.DefaultSelector() as sel:
        for fd in waiting:
            sel.register(fd, selectors.EVENT_READ)
        sel.register(stop.read_fd, selectors.EVENT_READ)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"flarebox: the workers did not start within {START_SECONDS} s", file=sys.stderr)
                return False
            for key, _ in sel.select(left):
                if key.fd == stop.read_fd:
                    stop.drain()
                    return False
                data = os.read(key.fd, 1)
                if data != word:
                    worker = waiting[key.fd]
                    _reap(worker)
                    print(f"flarebox: worker {worker.index} failed to start ({_describe(worker)})", file=sys.stderr)
                    return False
                sel.unregister(key.fd)
                del waiting[key.fd]
    return True


def _watch(workers: list[_Worker], stop: _Stop) -> bool:
    """Serve until a signal (False) or until a worker dies on its own (True: the server fails)."""
    with selectors.DefaultSelector() as sel:
        for w in workers:
            sel.register(w.status_fd, selectors.EVENT_READ, w)
        sel.register(stop.read_fd, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                if key.fd == stop.read_fd:
                    stop.drain()
                    if stop.signals:
                        return False
                    continue
                if os.read(key.fd, 1):
                    continue  # nothing else is said after SERVING; ignore
                stop.drain()
                if stop.signals:  # a Ctrl-C reaches the workers too (one process group): they are stopping
                    return False
                worker = key.data
                _reap(worker)
                print(
                    f"flarebox: worker {worker.index} (pid {worker.pid}) {_describe(worker)}; stopping the server, "
                    "whose other workers cannot serve its share of the workspaces",
                    file=sys.stderr,
                )
                return True


def _reap(worker: _Worker, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while worker.exit_status is None:
        pid, status = os.waitpid(worker.pid, os.WNOHANG)
        if pid:
            worker.exit_status = status
            return
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)


def _describe(worker: _Worker) -> str:
    status = worker.exit_status
    if status is None:
        return "stopped answering"
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


def _stop_all(workers: list[_Worker], stop: _Stop, *, failed: bool) -> int:
    """SIGTERM every live worker, wait for them (SIGKILL after STOP_SECONDS); 0 when all stopped cleanly and
    nothing failed. A second signal to the parent is passed on (uvicorn then ends its streams at once)."""
    for w in workers:
        _close_go(w)
        if w.exit_status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    seen = len(stop.signals)
    resend = time.monotonic() + 1
    while any(w.exit_status is None for w in workers):
        if time.monotonic() > resend:  # a SIGTERM that came before uvicorn took the signals over was lost
            resend = time.monotonic() + 1
            for w in workers:
                if w.exit_status is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.pid, signal.SIGTERM)
        if len(stop.signals) > seen:  # asked again: no more grace
            seen = len(stop.signals)
            for w in workers:
                if w.exit_status is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.pid, signal.SIGINT)
        for w in workers:
            if w.exit_status is None:
                with contextlib.suppress(ChildProcessError):
                    pid, status = os.waitpid(w.pid, os.WNOHANG)
                    if pid:
                        w.exit_status = status
        if time.monotonic() > deadline:
            for w in workers:
                if w.exit_status is None:
                    print(f"flarebox: worker {w.index} did not stop in {STOP_SECONDS} s; killing it", file=sys.stderr)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.pid, signal.SIGKILL)
                    os.waitpid(w.pid, 0)
                    w.exit_status = -9
            failed = True
        time.sleep(0.05)
    clean = all(
        os.WIFEXITED(w.exit_status) and os.WEXITSTATUS(w.exit_status) == 0 for w in workers if w.exit_status != -9
    )
    return 1 if failed or not clean else 0


# --- one worker --------------------------------------------------------------------------------------------------


def _worker(serving: _Serving, index: int, count: int, status_fd: int, go_fd: int) -> int:
    from standalone.serve import build_app, uvicorn_config

    token = serving.token
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s [worker {index}] %(name)s: %(message)s"))
    try:
        app, registry, driver = build_app(
            serving.data_dir,
            serving.settings,
            token.value if token.usable else None,
            serving.cipher,
            claim=serving.claim,
            shard=(index, count),
        )
    except (UidRangeError, UnsafeDirError, SeccompUnavailable) as err:
        print(f"flarebox: worker {index}: {err}", file=sys.stderr)
        return 2
    config = uvicorn_config(app, serving.host, serving.port, serving.log_level)
    server = uvicorn.Server(config)
    redact.install(token.value)  # after uvicorn.Config, which set up uvicorn's log handlers

    async def main() -> None:
        await app.sharded.start()
        os.write(status_fd, BUILT)
        if os.read(go_fd, 1) != b"g":  # blocking on purpose: nothing is served before every worker is built
            await app.sharded.close()  # the start was called off (another worker failed, or a signal)
            await registry.shutdown()
            return
        armed = registry.rearm_alarms()
        if armed:
            log.info("re-armed %d workspace alarm(s)", armed)
        served = asyncio.ensure_future(server.serve(sockets=[serving.listener]))
        while not server.started and not served.done():  # noqa: ASYNC110 - uvicorn has no "started" event
            await asyncio.sleep(0.05)
        if server.started:
            os.write(status_fd, SERVING)
        await served

    # uvicorn handles SIGINT/SIGTERM while serving and re-raises them afterwards: no-ops end the worker with 0
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        asyncio.run(main())
    finally:
        driver.close()  # the sandboxes are stopped by now (lifespan shutdown); the claim stays with the parent
    return 0 if server.started else 1
