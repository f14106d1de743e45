"""A load generator for a real `flarebox serve`, shared by the CI load test (tests/load/, reduced) and the benchmark
(bench/bench_load.py, full size). Loopback only, bounded in time and count.

  mix   N client threads (one protocol client each, like N agents) for a fixed time on W workspaces, each request a
        random choice of exec, file write, file read (of a file that client wrote: contents checked by sha256) and
        status. Every answer is checked; anything unexpected is an error.
  soak  every workspace, in parallel, goes through C idle cycles: write new files, wait (without activity — status
        reads are not activity) until the idle alarm has snapshotted and stopped it, then exec: it must say
        `restored` and every file written in every earlier cycle must be there, byte for byte.
"""

import hashlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from flarebox_hermes.client import Client, FlareboxError

TOKEN = "load-token-" + "l" * 40
NS = "load"
KINDS = ("exec", "write", "read", "status")
WEIGHTS = (4, 2, 2, 2)


@dataclass
class Tally:
    """Latencies (seconds) per operation kind and every error, appended from many threads (list.append is
    atomic)."""

    samples: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[tuple[str, str]] = field(default_factory=list)

    def ok(self, kind: str, seconds: float) -> None:
        self.samples[kind].append(seconds)

    def fail(self, kind: str, why: str) -> None:
        self.errors.append((kind, why[:300]))

    @property
    def served(self) -> int:
        """Requests answered correctly."""
        return sum(len(v) for v in self.samples.values())


# --- the server -----------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`flarebox serve` in its own session with a temp data dir; stop() ends it and everything it started.
    `workers`: its worker processes (`--workers`; 1 is the one process)."""

    def __init__(self, idle_seconds: int, workers: int = 1):
        self.workers = workers
        self.root = Path(tempfile.mkdtemp(prefix="fbx-load-", dir="/tmp"))  # noqa: S108 - short socket paths
        self.root.chmod(0o755)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_CF_", "SANDBOX_API_TOKEN"))}
        env.update({"SANDBOX_API_TOKEN": TOKEN, "IDLE_SECONDS": str(idle_seconds), "PYTHONUNBUFFERED": "1"})
        self._log = open(self.root / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        cmd = [
            sys.executable,
            "-m",
            "standalone.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.root / "data"),
            "--log-level",
            "warning",
            "--workers",
            str(workers),
        ]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/v1/health", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"flarebox serve did not start:\n{self.log_tail()}")
            time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """CPU time the server's own processes have used (user + system): the one process, or the parent and its
        worker processes (its direct children; the sandboxes are the workers' children, not counted)."""
        total = 0
        for pid in [self.proc.pid, *self._children()]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def _children(self) -> list[int]:
        """The worker processes: children forked from the server (its own command line; a sandbox's is bwrap's)."""
        try:
            own = Path(f"/proc/{self.proc.pid}/cmdline").read_bytes()
        except OSError:
            return []
        kids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    same = Path(f"/proc/{entry}/cmdline").read_bytes() == own
                except OSError:
                    continue
                if same and int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    kids.append(int(entry))
        return kids

    def client(self) -> Client:
        return Client(self.url, TOKEN, timeout=120)

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return (self.root / "server.log").read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(10)
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._log.close()
            subprocess.run(["chmod", "-R", "u+rwX", str(self.root)], check=False, capture_output=True)
            subprocess.run(["rm", "-rf", str(self.root)], check=False, capture_output=True)


# --- one operation each ---------------------------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _exec(client: Client, ws: str, command: str) -> tuple[str, dict, str | None]:
    """(output, terminal event, `container` of the started event)."""
    out, end, container = [], {}, None
    for event in client.exec(NS, ws, {"request_id": uuid.uuid4().hex, "command": command}):
        if event["type"] == "output":
            out.append(event["data"])
        elif event["type"] == "started":
            container = event.get("container")
        elif event["type"] in ("exit", "error"):
            end = event
    return "".join(out), end, container


def _read(client: Client, ws: str, path: str) -> bytes:
    with tempfile.TemporaryFile() as sink:
        client.read_file(NS, ws, path, sink)
        sink.seek(0)
        return sink.read()


def _pick(rng: random.Random, workspaces: list[str], mine: dict) -> tuple[str, str]:
    ws = rng.choice(workspaces)
    kind = rng.choices(KINDS, WEIGHTS)[0]
    return ws, ("write" if kind == "read" and not mine.get(ws) else kind)


def _do(client: Client, rng: random.Random, ws: str, kind: str, mine: dict, tally: Tally, cid: int) -> None:
    """One request of `kind`, checked; its latency or its error goes to `tally`. `mine`: this client's files."""
    begun = time.perf_counter()
    try:
        if kind == "exec":
            token = rng.getrandbits(64)
            out, end, _ = _exec(client, ws, f"printf 'load %s\\n' {token}; seq 1 {rng.randint(1, 200)} | wc -l")
            if end.get("type") != "exit" or end.get("exit_code") != 0 or not out.startswith(f"load {token}\n"):
                raise AssertionError(f"exec answered {end} with {out[:100]!r}")
        elif kind == "write":
            data = rng.randbytes(rng.randint(1, 32) * 1024)
            path = f"/workspace/c{cid}/f{rng.randint(0, 9)}.bin"
            client.write_file(NS, ws, path, data)
            mine.setdefault(ws, {})[path] = _sha(data)
        elif kind == "read":
            path, digest = rng.choice(sorted(mine[ws].items()))
            if _sha(_read(client, ws, path)) != digest:
                raise AssertionError(f"{ws}:{path} read back different bytes")
        else:
            status = client.get_workspace(NS, ws)
            if status.get("state") not in ("created", "starting", "restoring", "running", "saving", "stopped"):
                raise AssertionError(f"status {status}")
    except (FlareboxError, AssertionError, httpx.HTTPError, OSError) as exc:
        tally.fail(kind, f"{type(exc).__name__}: {exc}")
        return
    tally.ok(kind, time.perf_counter() - begun)


def setup(server: Server, workspaces: int) -> list[str]:
    names = [f"w{i:02d}" for i in range(workspaces)]
    with server.client() as client:
        for name in names:
            client.put_workspace(NS, name, {})
    return names


def mix(
    server: Server,
    names: list[str],
    clients: int,
    seconds: float,
    seed: int = 1,
    think: tuple[float, float] = (0.0, 0.0),
) -> Tally:
    """`clients` threads issue requests for `seconds` (each finishes the request in flight), back to back or with a
    random pause drawn from `think` (seconds) between two requests."""
    tally = Tally()
    deadline = time.monotonic() + seconds

    def worker(cid: int) -> None:
        rng = random.Random(seed * 1000 + cid)
        mine: dict = {}
        with server.client() as client:
            while time.monotonic() < deadline:
                _do(client, rng, *_pick(rng, names, mine), mine, tally, cid)
                if think[1] > 0:
                    time.sleep(rng.uniform(*think))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 300)
    if any(t.is_alive() for t in threads):
        tally.fail("mix", "a client thread was still running 300 s after the deadline")
    return tally


def soak(server: Server, names: list[str], cycles: int, idle_seconds: int, seed: int = 2) -> Tally:
    """Every workspace through `cycles` snapshot/stop/restore cycles, in parallel; contents checked each time.
    Kinds: `restore` (first exec after the idle stop: restore + run), `idle_stop` (last write → stopped)."""
    tally = Tally()

    def cycle_all(ws: str, rng: random.Random) -> None:
        written: dict[str, str] = {}
        with server.client() as client:
            for cycle in range(cycles):
                try:
                    data = rng.randbytes(256 * 1024) + os.urandom(64 * 1024)
                    path = f"/workspace/soak/cycle{cycle}.bin"
                    client.write_file(NS, ws, path, data)
                    written[path] = _sha(data)
                    out, end, _ = _exec(client, ws, f"echo {cycle} >> /workspace/soak/log")
                    if end.get("exit_code") != 0:
                        raise AssertionError(f"append failed: {end}")
                    stopped_from = time.perf_counter()
                    deadline = time.monotonic() + idle_seconds + 120
                    while client.get_workspace(NS, ws)["state"] != "stopped":  # status reads are not activity
                        if time.monotonic() > deadline:
                            raise AssertionError("the idle alarm never stopped the workspace")
                        time.sleep(0.25)
                    tally.ok("idle_stop", time.perf_counter() - stopped_from)
                    begun = time.perf_counter()
                    out, end, container = _exec(client, ws, "cd /workspace/soak && sha256sum cycle*.bin && cat log")
                    tally.ok("restore", time.perf_counter() - begun)
                    if container != "restored" or end.get("exit_code") != 0:
                        raise AssertionError(f"after the idle stop: container={container}, end={end}")
                    sums = {
                        f"/workspace/soak/{name}": digest
                        for digest, name in (line.split() for line in out.splitlines() if line.endswith(".bin"))
                    }
                    log_lines = [line for line in out.splitlines() if not line.endswith(".bin")]
                    if sums != written or log_lines != [str(c) for c in range(cycle + 1)]:
                        raise AssertionError(f"cycle {cycle}: contents differ after restore: {out[:300]!r}")
                    for p, digest in written.items():  # and through the file route too
                        if _sha(_read(client, ws, p)) != digest:
                            raise AssertionError(f"{p} read back different bytes")
                except (FlareboxError, AssertionError, httpx.HTTPError, OSError, KeyError) as exc:
                    tally.fail("soak", f"{ws} cycle {cycle}: {type(exc).__name__}: {exc}")
                    return

    threads = [
        threading.Thread(target=cycle_all, args=(ws, random.Random(seed + i)), daemon=True)
        for i, ws in enumerate(names)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(cycles * (idle_seconds + 180))
    if any(t.is_alive() for t in threads):
        tally.fail("soak", "a workspace's cycle was still running at the deadline")
    return tally


def baseline(server: Server, ws: str, repeat: int, seed: int = 3) -> Tally:
    """The same operations from one client on an otherwise idle server: the unloaded latency of each kind."""
    tally = Tally()
    rng = random.Random(seed)
    mine: dict = {}
    with server.client() as client:
        _do(client, rng, ws, "write", mine, Tally(), 0)  # a file to read back (not counted)
        for _ in range(repeat):  # interleaved kinds, like the mix
            for kind in KINDS:
                _do(client, rng, ws, kind, mine, tally, 0)
    return tally
