"""Running the `flarebox` CLI as a person does: a real process with a real environment, and a real terminal (tmux)."""

import contextlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from e2e import flarebox_command

# the variables that choose a server: a developer's own settings must not aim the tests elsewhere
CONNECTION_VARS = ("FLAREBOX_ENDPOINT", "FLAREBOX_TOKEN", "FLAREBOX_NAMESPACE", "HERMES_CF_")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CONNECTION_VARS)}
    env.update({"PYTHONUNBUFFERED": "1"}, **extra)
    return env


def client_env(server, **extra: str) -> dict[str, str]:
    """Aimed at `server` the documented way (FLAREBOX_ENDPOINT / FLAREBOX_TOKEN)."""
    return clean_env(FLAREBOX_ENDPOINT=server.url, FLAREBOX_TOKEN=server.token, **extra)


def run(env: dict[str, str], *args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("text", True)
    return subprocess.run(flarebox_command() + list(args), env=env, capture_output=True, timeout=timeout, **kwargs)


class Terminal:
    """One tmux session on a private socket running `bash --norc`; everything typed runs in a real terminal."""

    def __init__(self, env: dict[str, str], cwd: Path):
        self._dir = Path(tempfile.mkdtemp(prefix="fbx-tmux-", dir="/tmp"))  # noqa: S108 - short: a socket path
        self.socket = str(self._dir / "sock")
        self.env = env
        subprocess.run(
            [
                "tmux",
                "-S",
                self.socket,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "200",
                "-y",
                "50",
                "bash --norc --noprofile",
            ],
            env=dict(env, PS1="$ ", TERM="xterm"),
            cwd=cwd,
            check=True,
            timeout=30,
        )

    def type(self, line: str) -> None:
        subprocess.run(["tmux", "-S", self.socket, "send-keys", "-l", line], check=True, timeout=10)
        subprocess.run(["tmux", "-S", self.socket, "send-keys", "Enter"], check=True, timeout=10)

    def key(self, key: str) -> None:
        subprocess.run(["tmux", "-S", self.socket, "send-keys", key], check=True, timeout=10)

    def resize(self, cols: int, rows: int) -> None:
        subprocess.run(
            ["tmux", "-S", self.socket, "resize-window", "-x", str(cols), "-y", str(rows)], check=True, timeout=10
        )

    def screen(self) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, "capture-pane", "-p", "-J", "-S", "-200"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return done.stdout

    def wait_for(self, line: str, timeout: float = 60) -> str:
        """Wait until a whole line of the screen matches the regex `line` (the typed command never does)."""
        deadline = time.monotonic() + timeout
        pattern = re.compile(line, re.MULTILINE)
        while True:
            screen = self.screen()
            if any(pattern.fullmatch(row.rstrip()) for row in screen.splitlines()):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{line!r} did not appear on the terminal in {timeout} s:\n{screen}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)


def flarebox_line(*args: str) -> str:
    return shlex.join(flarebox_command() + list(args))


HAVE_TMUX = shutil.which("tmux") is not None


class CuttableProxy:
    """A TCP relay in front of a server whose live connections the test can cut (the network dropping).

    close() leaves nothing listening. A listener closed while its thread is blocked in accept() stays open in the
    kernel and takes the next connection to its port, so it is shut down first, which ends that accept()."""

    def __init__(self, target_port: int):
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._live: list[socket.socket] = []
        self._lock = threading.Lock()
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target))
            except OSError:
                client.close()  # a refused upstream is a refused client, never one left hanging
                continue
            with self._lock:
                self._live += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            live, self._live = self._live, []
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._acceptor.join(timeout=10)
        self._listener.close()
        self.cut()
