"""Helpers for the end-to-end tests: exec over raw HTTP (httpx), finding a workspace's sandbox processes, polling."""

import asyncio
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
                httpx.get(self.url + "/v1/health", headers=self.headers(), timeout=2)
                return self  # any HTTP answer (200, or 401/503 for token tests) means it is serving
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


def short_temp_dir() -> Path:
    """A temp dir with a short path: the sandboxes' unix sockets live under the data dir (paths < 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="fbx-e2e-", dir="/tmp"))  # noqa: S108 - short on purpose, removed after
    path.chmod(0o755)
    return path


def remove_temp_dir(path: Path) -> None:
    # sandboxes leave read-only directories behind; make them removable first
    subprocess.run(["chmod", "-R", "u+rwX", str(path)], check=False, capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


QUIET = {"IDLE_SECONDS": "600"}  # nothing idles away under a test's feet


@contextmanager
def serving(env: dict[str, str] | None = None, token: str | None = TOKEN) -> Iterator["ServerProcess"]:
    """One real server in a fresh short temp dir; stopped by PID and its dir removed even when the test fails."""
    with servers(env) as start:
        yield start(token=token)


@contextmanager
def servers(defaults: dict[str, str] | None = None) -> Iterator[Callable[..., "ServerProcess"]]:
    """A factory: start(env={...}, token=..., data_dir=...) starts another server (settings over `defaults`, which
    default to QUIET). Every server started is stopped at exit."""
    root = short_temp_dir()
    started: list[ServerProcess] = []

    def start(env: dict[str, str] | None = None, token: str | None = TOKEN, data_dir: Path | None = None):
        settings = {**(QUIET if defaults is None else defaults), **(env or {})}
        proc = ServerProcess(data_dir or root / f"data{len(started)}", settings, token)
        started.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()
        remove_temp_dir(root)


def rid() -> str:
    return uuid.uuid4().hex


def ws_url(ns: str, ws: str, *rest: str) -> str:
    return "/".join(["/v1/workspaces", ns, ws, *rest])


def put_workspace(client: httpx.Client, ns: str, ws: str, **config: Any) -> httpx.Response:
    return client.put(ws_url(ns, ws), json=config)


def exec_events(client: httpx.Client, ns: str, ws: str, command: str, timeout: float = 120, **fields: Any) -> list:
    """POST …/exec and collect every event (the stream must be a 200 NDJSON stream)."""
    body = {"request_id": fields.pop("request_id", rid()), "command": command, **fields}
    with client.stream("POST", ws_url(ns, ws, "exec"), json=body, timeout=timeout) as response:
        if response.status_code != 200:
            response.read()
            raise AssertionError(f"exec answered {response.status_code}: {response.text}")
        assert response.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in response.iter_lines() if line.strip()]


def output_of(events: list) -> str:
    return "".join(e["data"] for e in events if e["type"] == "output")


def terminal(events: list) -> dict:
    ends = [e for e in events if e["type"] in ("exit", "error")]
    assert len(ends) == 1 and events[-1] is ends[0], f"expected exactly one terminal event last: {events}"
    return ends[0]


def started(events: list) -> dict:
    starts = [e for e in events if e["type"] == "started"]
    assert len(starts) == 1, events
    return starts[0]


def run_ok(client: httpx.Client, ns: str, ws: str, command: str, **fields: Any) -> tuple[str, list]:
    """Run a command that must exit 0; returns (output, events)."""
    events = exec_events(client, ns, ws, command, **fields)
    end = terminal(events)
    assert end["type"] == "exit" and end["exit_code"] == 0, events
    return output_of(events), events


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _is_bwrap(pid: int, cmd: list[str] | None = None) -> bool:
    cmd = _cmdline(pid) if cmd is None else cmd
    return bool(cmd) and os.path.basename(cmd[0]) == "bwrap"


def _runtime_keys(server: "ServerProcess", workspace: str) -> set[str]:
    """The sandbox names (`fbx-<key>`, also their cgroups' names) `workspace` has in any namespace of `server`."""
    keys = set()
    for ws_dir in (server.data_dir / "workspaces").glob(f"*/{workspace}"):
        root = (ws_dir / "root").resolve()
        keys.add("fbx-" + hashlib.sha256(f"{ws_dir.parent.name}/{workspace}\0{root}".encode()).hexdigest()[:12])
    return keys


def sandbox_pids(server: "ServerProcess", workspace: str) -> list[int]:
    """PIDs of the outer bwrap processes running `workspace` for `server`: bwrap is given `--hostname <workspace>`
    and is the server's own child (the launcher execs it) — or, once the server is gone, still sits in the
    workspace's cgroup (named after the workspace's key), so a sandbox outliving its server is found too."""
    keys = _runtime_keys(server, workspace)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        cmd = _cmdline(int(entry))
        if not _is_bwrap(int(entry), cmd):
            continue
        if not any(a == "--hostname" and b == workspace[:63] for a, b in zip(cmd, cmd[1:], strict=False)):
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            cgroup = Path(f"/proc/{entry}/cgroup").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
        if server.proc is not None and parent == server.proc.pid:
            pids.append(int(entry))
        elif parent != 0 and any(f"/{key}" in cgroup for key in keys) and not _is_bwrap(parent):
            pids.append(int(entry))  # the outer bwrap of a sandbox whose server died (its parent is not bwrap)
    return sorted(pids)


class Made:
    """What a test made with the deployment token (keys, workspaces), removed at its end even when it fails:
    subclasses add how they mint."""

    def __init__(self, server: "ServerProcess"):
        from flarebox_hermes.client import Client

        self.server = server
        self.client = Client(server.url, server.token)
        self.keys: list[str] = []
        self.workspaces: list[tuple[str, str]] = []

    def close(self) -> None:
        from flarebox_hermes.client import ApiError

        for key_id in self.keys:
            try:
                self.client.revoke_key(key_id)
            except ApiError:
                pass  # the test revoked it
        for ns, ws in self.workspaces:
            try:
                self.client.delete_workspace(ns, ws)
            except ApiError:
                pass
        self.client.close()


@contextmanager
def tmpfs_at(path: Path, size: str):
    """A tmpfs of `size` mounted at `path` for the duration (skips the test where mounting is impossible).
    Yields a function that resizes it."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")

    def resize(new_size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={new_size}", str(path)], check=True, capture_output=True)

    try:
        yield resize
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


class TerminalSession:
    """One terminal WebSocket (GET W/pty): text frames parsed into `frames`, binary frames gathered into `screen`."""

    def __init__(self, conn, timeout: float = 30):
        self.conn = conn
        self.timeout = timeout
        self.frames: list[dict] = []
        self.screen = b""

    async def until(self, predicate, timeout: float | None = None) -> None:
        async def wait() -> None:
            while not predicate(self):
                message = await self.conn.recv()
                if isinstance(message, bytes):
                    self.screen += message
                else:
                    self.frames.append(json.loads(message))

        await asyncio.wait_for(wait(), timeout or self.timeout)

    def frame(self, kind: str) -> dict | None:
        return next((f for f in self.frames if f["type"] == kind), None)

    async def type(self, text: str) -> None:
        await self.conn.send(text.encode())
