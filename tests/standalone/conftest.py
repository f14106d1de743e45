"""A real `flarebox serve` subprocess for end-to-end tests.

`server` is module-scoped (one server per test module); `start_server` starts extra ones with their own settings
and data dir. Each runs in its own session on a free loopback port with a temp data dir and a known token; it is
stopped by PID (SIGTERM, then SIGKILL) and its session swept in finally, so no sandbox outlives a test.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

TOKEN = "t0k3n-for-tests-" + "x" * 40
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flarebox_command() -> list[str]:
    """The installed `flarebox` console script next to this interpreter, else the module."""
    script = Path(sys.executable).with_name("flarebox")
    return [str(script)] if script.exists() else [sys.executable, "-m", "standalone.cli"]


class ServerProcess:
    def __init__(self, data_dir: Path, env: dict[str, str], token: str | None = TOKEN):
        self.data_dir = Path(data_dir)
        self.token = token
        self.extra_env = dict(env)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server-{self.port}.log"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_CF_", "SANDBOX_API_TOKEN"))}
        env.update({"PYTHONUNBUFFERED": "1", "FLAREBOX_DATA_DIR": str(self.data_dir)})
        if self.token is not None:
            env["SANDBOX_API_TOKEN"] = self.token
        env.update(self.extra_env)
        return env

    def client_env(self) -> dict[str, str]:
        """Environment for a `flarebox` client command aimed at this server."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_CF_")}
        env.update({"HERMES_CF_ENDPOINT": self.url, "HERMES_CF_TOKEN": self.token or "", "PYTHONUNBUFFERED": "1"})
        return env

    def start(self, timeout: float = 30) -> "ServerProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        cmd = flarebox_command() + ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--data-dir", str(self.data_dir)]
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"flarebox serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/v1/health", headers=self.headers(), timeout=2).status_code in (200, 503):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"flarebox serve did not answer /v1/health in {timeout} s:\n{self.output()}")

    def headers(self, token: str | None = None) -> dict[str, str]:
        token = token or self.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(), timeout=60, **kwargs)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL the server alone (a crash): its sandboxes are left for the sweep in stop()."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM (clean shutdown), SIGKILL if it hangs, then kill whatever is left in its session."""
        if self.proc is None:
            return None
        pid = self.proc.pid
        try:
            if self.proc.poll() is None:
                os.kill(pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.kill(pid, signal.SIGKILL)
                    self.proc.wait(10)
        finally:
            try:
                os.killpg(pid, signal.SIGKILL)  # the session we created: sandboxes orphaned by a crash
            except ProcessLookupError:
                pass
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One real server per test module (IDLE_SECONDS high: nothing idles away under a test's feet)."""
    proc = ServerProcess(tmp_path_factory.mktemp("flarebox") / "data", {"IDLE_SECONDS": "600"})
    try:
        yield proc.start()
    finally:
        proc.stop()


@pytest.fixture
def start_server(tmp_path):
    """Start extra servers: start_server(env={...}, token=..., data_dir=...). All are stopped at teardown."""
    started: list[ServerProcess] = []

    def start(env: dict[str, str] | None = None, token: str | None = TOKEN, data_dir: Path | None = None):
        proc = ServerProcess(data_dir or tmp_path / f"data{len(started)}", env or {}, token)
        started.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()
        # sandboxes may leave read-only directories behind; make them removable for tmp_path cleanup
        for proc in started:
            if proc.data_dir.exists():
                subprocess.run(["chmod", "-R", "u+rwX", str(proc.data_dir)], check=False)


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None
