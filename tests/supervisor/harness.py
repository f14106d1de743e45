"""Harness for the supervisor tests: the real supervisor as a subprocess on a unix socket, driven with httpx.

Run as root (as here and in CI) it is started with --user nobody, so commands and file access really drop
privileges; otherwise it runs everything as the invoking user.
"""

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

IS_ROOT = os.geteuid() == 0
SANDBOX_USER = "nobody"
# Present in the supervisor's environment; must never reach a command.
LEAK_CANARY = "canary-" + secrets.token_hex(16)

needs_root = pytest.mark.skipif(not IS_ROOT, reason="privilege drop needs root")


def new_id() -> str:
    return secrets.token_hex(16)


@dataclass
class Result:
    events: list[dict]
    status: int = 200

    @property
    def output(self) -> str:
        return "".join(e["data"] for e in self.events if e["type"] == "output")

    @property
    def terminal(self) -> dict:
        return self.events[-1]

    @property
    def heartbeats(self) -> int:
        return sum(1 for e in self.events if e["type"] == "heartbeat")


@dataclass
class Supervisor:
    socket: Path
    workspace: Path
    process: subprocess.Popen
    client: httpx.Client
    uid: int
    extra: dict = field(default_factory=dict)

    def transport(self) -> httpx.HTTPTransport:
        return httpx.HTTPTransport(uds=str(self.socket))

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(self.socket)), base_url="http://sv", timeout=60
        )

    def post_exec(self, body: dict | bytes) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
        return self.client.post("/exec", content=content, headers={"Content-Type": "application/json"})

    def exec(self, command: str, **fields) -> Result:
        body = {"request_id": fields.pop("request_id", new_id()), "command": command, **fields}
        response = self.post_exec(body)
        if response.status_code != 200:
            return Result([response.json()], response.status_code)
        return Result(parse_ndjson(response.text))

    def stream(self, method: str, url: str, **kwargs):
        return self.client.stream(method, url, **kwargs)


def parse_ndjson(text: str) -> list[dict]:
    events = [json.loads(line) for line in text.splitlines() if line]
    assert events, "empty stream"
    return events


def _workspace() -> Path:
    if not IS_ROOT:
        return Path(tempfile.mkdtemp(prefix="flarebox-ws-"))
    # pytest's tmp_path lives under a 0700 directory the sandbox user cannot traverse
    path = Path(tempfile.mkdtemp(prefix="flarebox-ws-"))
    os.chmod(path, 0o755)
    entry = pwd.getpwnam(SANDBOX_USER)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def start_supervisor(tmp_path: Path, env: dict | None = None):
    """Context manager body shared by the fixtures: yields a ready Supervisor, always stops it by PID."""
    socket = tmp_path / "supervisor.sock"
    workspace = _workspace()
    args = [sys.executable, "-m", "flarebox_supervisor", "--unix", str(socket), "--workdir", str(workspace)]
    if IS_ROOT:
        args += ["--user", SANDBOX_USER]
    proc_env = dict(
        os.environ, SANDBOX_API_TOKEN=LEAK_CANARY, FLAREBOX_LEAK_CANARY=LEAK_CANARY, FLAREBOX_HEARTBEAT_SECONDS="1"
    )
    proc_env.update(env or {})
    log = open(tmp_path / "supervisor.log", "wb")  # noqa: SIM115 - closed in finally
    process = subprocess.Popen(args, env=proc_env, stdout=log, stderr=subprocess.STDOUT)
    client = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://sv", timeout=60)
    try:
        deadline = time.monotonic() + 15
        while True:
            assert process.poll() is None, (tmp_path / "supervisor.log").read_text()
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "supervisor did not become healthy"
            time.sleep(0.05)
        uid = pwd.getpwnam(SANDBOX_USER).pw_uid if IS_ROOT else os.getuid()
        yield Supervisor(socket, workspace, process, client, uid)
    finally:
        client.close()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
        shutil.rmtree(workspace, ignore_errors=True)


def wait_until(predicate, timeout: float = 10, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def group_alive(pgid: int) -> bool:
    """Any non-zombie process left in the group?"""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split(b" ", 3)
        if fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def next_event(lines) -> dict:
    """The next non-heartbeat event from an iterator of NDJSON lines (heartbeats depend on machine speed)."""
    for line in lines:
        if line:
            event = json.loads(line)
            if event["type"] != "heartbeat":
                return event
    raise AssertionError("stream ended early")
