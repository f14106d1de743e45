"""The standalone runtime end to end: a real `flarebox serve` subprocess, real bubblewrap sandboxes, the shared
protocol client, measured against baselines taken in the same run.

  exec round trip   `true` through client → uvicorn → edge → workspace → sandbox supervisor → back (warm workspace,
                    one kept-alive connection), vs the supervisor alone (POST /exec on its unix socket) and vs a
                    bare `bash -c true` spawn, with the project's Python client (httpx, ~0.6 ms of its own per
                    round trip). Report only: the goals (issue 15) are on the same round trips with a bare HTTP
                    client, bench_exec_parts.
  scoped key        the same round trip with a scoped key instead of the deployment token (interleaved with it):
                    what verifying the key in the directory adds. Goal: ≤ 0.3 ms at p50.
  cold start        first exec on a new workspace, request sent → first output event. Goal ≤ 100 ms.
  restore           first exec on a stopped workspace holding 100 MB (half incompressible), → first output, vs the
                    bare `zstd -d | tar -x` of its archive in the same run. Goal ≤ 1.3× the bare extract.
  files             GET and PUT of 100 MiB through the whole stack with curl (it writes the file it gets, as the
                    copy does), vs shutil.copyfile of the same file. Goal ≥ 0.7× the copy's throughput. Beside
                    them, report only, the same curl against a server that only moves the bytes
                    (bench/bare_files.py): the floor any server reaches with this client on this machine.
  memory            the server's RSS growth per idle workspace (created, booted once, idle), and a sandbox's RSS.
"""

import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench import bare_files
from bench.framework import figure, percentile, timed, timed_pair
from flarebox_hermes.client import Client

TOKEN = "bench-token-" + "b" * 40
NS = "bench"
MIB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, root: Path):
        self.data_dir = root / "data"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "SANDBOX_API_TOKEN": TOKEN, "IDLE_SECONDS": "3600", "PYTHONUNBUFFERED": "1"}
        self.log = open(root / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        cmd = [
            sys.executable,
            "-m",
            "standalone.cli",
            "serve",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/v1/health", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("flarebox serve did not start")

    def rss_kib(self) -> int:
        return _rss(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()


def _exec(client: Client, ws: str, command: str) -> tuple[float | None, dict]:
    """Run a command; (seconds from request to first output event, terminal event)."""
    start = time.perf_counter()
    first = None
    end = {}
    for event in client.exec(NS, ws, {"request_id": uuid.uuid4().hex, "command": command}):
        if event["type"] == "output" and first is None:
            first = time.perf_counter() - start
        if event["type"] in ("exit", "error"):
            end = event
    if end.get("type") != "exit":
        raise RuntimeError(f"{command!r} failed: {end}")
    return first, end


def _supervisor_socket(data_dir: Path) -> Path:
    (sock,) = (data_dir / "run").glob("*/sv.sock")
    return sock


def _bare_spawn() -> None:
    subprocess.run(["bash", "-c", "true"], check=True)


@contextmanager
def serving() -> Iterator[tuple[Server, Path]]:
    """A real `flarebox serve` on a temp data dir (the server and that dir), stopped and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="fbx-bench-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        server = Server(root)
        try:
            yield server, root
        finally:
            server.stop()
            subprocess.run(["chmod", "-R", "u+rwX", tmp], check=False)


def boot(server: Server, workspace: str) -> None:
    """Create `workspace` and run its first command, so it is up."""
    with Client(server.url, TOKEN) as client:
        client.put_workspace(NS, workspace, {})
        _exec(client, workspace, "true")


def run(quick: bool = False) -> list[dict]:
    repeat = 30 if quick else 200
    rows = []
    with serving() as (server, root), Client(server.url, TOKEN) as client:
        rows += _round_trips(server, client, repeat)
        rows += _cold_and_restore(server, client, root, quick)
        rows += _files(server, client, root, (20 if quick else 100) * MIB, 2 if quick else 5)
        rows += _memory(server, client, 5 if quick else 20)
    return rows


def _round_trips(server: Server, client: Client, repeat: int) -> list[dict]:
    """The three round trips are interleaved, one of each per round, so that load from elsewhere on the machine
    hits them alike."""
    client.put_workspace(NS, "rt", {})
    _exec(client, "rt", "true")  # boot
    sock = _supervisor_socket(server.data_dir)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://sandbox") as sv:

        def direct() -> None:
            body = {"request_id": uuid.uuid4().hex, "command": "true"}
            with sv.stream("POST", "/exec", json=body) as response:
                lines = [json.loads(line) for line in response.iter_lines() if line]
            assert lines[-1]["type"] == "exit", lines

        def full() -> None:
            _exec(client, "rt", "true")

        minted = httpx.post(
            server.url + "/v1/keys",
            headers={"authorization": f"Bearer {TOKEN}"},
            json={"namespace": NS, "workspace": "rt", "scopes": ["exec"], "label": "bench"},
        )
        minted.raise_for_status()
        keyed_client = Client(server.url, minted.json()["key"])

        def keyed() -> None:
            _exec(keyed_client, "rt", "true")

        samples: dict = {full: [], keyed: [], direct: [], _bare_spawn: []}
        for fn in samples:
            timed(fn, 0, warmup=5)
        for _ in range(repeat):
            for fn, out in samples.items():
                out += timed(fn, 1)
    keyed_client.close()
    full_s, alone, bare = samples[full], samples[direct], samples[_bare_spawn]
    bare_p50 = percentile(bare, 50) * 1000
    keyed_p50, full_p50 = percentile(samples[keyed], 50) * 1000, percentile(full_s, 50) * 1000
    return [
        figure(
            "exec `true` round trip with a scoped key p50",
            keyed_p50,
            "ms",
            "the same with the deployment token p50",
            full_p50,
            note=f"adds {keyed_p50 - full_p50:+.3f} ms (goal ≤ 0.3 ms)",
        ),
        figure(
            "exec `true` round trip, full stack p50 (the Python client, httpx)",
            percentile(full_s, 50) * 1000,
            "ms",
            "bare bash -c true p50",
            bare_p50,
            note="what a Hermes or Python caller sees; the goal is on the bare-client figure (bench_exec_parts)",
        ),
        figure(
            "exec `true` round trip, full stack p95 (the Python client, httpx)",
            percentile(full_s, 95) * 1000,
            "ms",
            "bare bash -c true p95",
            percentile(bare, 95) * 1000,
        ),
        figure(
            "exec `true` round trip, supervisor alone p50 (httpx)",
            percentile(alone, 50) * 1000,
            "ms",
            "bare bash -c true p50",
            bare_p50,
            note="POST /exec on the sandbox's unix socket; the goal is on the bare-client figure (bench_exec_parts)",
        ),
        figure(
            "exec `true` round trip, full stack p50 vs supervisor alone",
            percentile(full_s, 50) * 1000,
            "ms",
            "supervisor alone p50",
            percentile(alone, 50) * 1000,
            note="what the server, edge, workspace and relay add",
        ),
    ]


def _cold_and_restore(server: Server, client: Client, root: Path, quick: bool) -> list[dict]:
    rows = []
    cold = []
    for i in range(2 if quick else 5):
        ws = f"cold{i}"
        client.put_workspace(NS, ws, {})
        first, _ = _exec(client, ws, "echo up")
        cold.append(first)
    rows.append(
        figure(
            "cold start: new workspace → first output p50",
            percentile(cold, 50) * 1000,
            "ms",
            "goal (100 ms)",
            100.0,
            goal=1.0,
            note=f"median of {len(cold)}",
        )
    )

    mb = 20 if quick else 100
    client.put_workspace(NS, "big", {})
    # half incompressible, half text: what a checkout with build outputs looks like to zstd
    _exec(
        client,
        "big",
        f"head -c {mb // 2}M /dev/urandom > /workspace/blob; "
        f"seq 1 100000000 | head -c {mb // 2}M > /workspace/text.txt",
    )
    client.stop(NS, "big")
    restores = []
    for _ in range(1 if quick else 3):
        first, _ = _exec(client, "big", "echo back")
        restores.append(first)
        client.stop(NS, "big")  # snapshot again and stop, for the next round
    # the full archive the restores' chains start from (the largest: the later links are increments that changed
    # nothing); a restore extracts it and then each small increment
    archive = max((server.data_dir / "snapshots" / NS / "big").glob("*.tar.zst"), key=lambda p: p.stat().st_size)
    target = root / "bare-restore"

    def bare_restore() -> None:
        subprocess.run(["rm", "-rf", str(target)], check=True)
        target.mkdir()
        subprocess.run(f"zstd -d -q -c '{archive}' | tar -C '{target}' -xf -", shell=True, check=True)  # noqa: S602

    bare = timed(bare_restore, 3)
    rows.append(
        figure(
            f"restore {mb} MB workspace → first output p50",
            percentile(restores, 50),
            "s",
            "bare zstd -d | tar -x of its archive",
            percentile(bare, 50),
            goal=1.3,
            note=f"archive {archive.stat().st_size / 1e6:.1f} MB; median of {len(restores)}",
        )
    )
    return rows


def _files(server: Server, client: Client, root: Path, size: int, repeat: int) -> list[dict]:
    """A file up and down through the whole stack (curl → uvicorn → edge → workspace → supervisor → the sandbox's
    disk, and back), interleaved with a plain copy of the same file on the same disk."""
    client.put_workspace(NS, "files", {})
    _exec(client, "files", "true")  # boot
    source, fetched, copied = root / "source.bin", root / "fetched.bin", root / "copy.bin"
    with open(source, "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
    url = f"{server.url}/v1/workspaces/{NS}/files/files?path=/workspace/big.bin"
    auth = ["-H", f"Authorization: Bearer {TOKEN}"]

    def put() -> None:
        subprocess.run(["curl", "-sSf", *auth, "-T", str(source), "-o", os.devnull, url], check=True)

    def get() -> None:
        subprocess.run(["curl", "-sSf", *auth, "-o", str(fetched), url], check=True)

    def copy() -> None:
        shutil.copyfile(source, copied)

    put_s, copies = timed_pair(put, copy, repeat, warmup=1)
    get_s, more = timed_pair(get, copy, repeat, warmup=1)
    if hashlib.sha256(fetched.read_bytes()).digest() != hashlib.sha256(source.read_bytes()).digest():
        raise RuntimeError("the file came back different")
    # the same curl against a server that only moves the bytes: the floor any server reaches with this client
    with bare_files.serving(source) as bare_get_url, bare_files.serving(root / "bare_put.bin") as bare_put_url:
        bare_get_s, bare_copies = timed_pair(
            lambda: subprocess.run(["curl", "-sSf", "-o", str(fetched), bare_get_url], check=True), copy, repeat
        )
        bare_put_s, more_bare = timed_pair(
            lambda: subprocess.run(["curl", "-sSf", "-T", str(source), "-o", os.devnull, bare_put_url], check=True),
            copy,
            repeat,
        )
    mib, copy_rate = size / MIB, size / MIB / statistics.median(copies + more)
    bare_copy_rate = size / MIB / statistics.median(bare_copies + more_bare)
    return [
        figure(
            f"file {label} {mib:.0f} MiB, full stack (curl)",
            mib / statistics.median(samples),
            "MiB/s",
            "shutil.copyfile",
            copy_rate,
            goal=0.7,
            better="higher",
            note=f"median of {repeat}, interleaved with the copies",
        )
        for label, samples in (("GET", get_s), ("PUT", put_s))
    ] + [
        figure(
            f"file {label} {mib:.0f} MiB, bare sendfile/recv_into server (curl)",
            mib / statistics.median(samples),
            "MiB/s",
            "shutil.copyfile",
            bare_copy_rate,
            better="higher",
            note=f"the floor of the row above on this machine (bench/bare_files.py); median of {repeat}, interleaved",
        )
        for label, samples in (("GET", bare_get_s), ("PUT", bare_put_s))
    ]


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _pss(pid: int) -> int:
    """Proportional set size: each shared page divided among the processes that map it (the Python binary and
    libraries are shared with the server and every other sandbox, so RSS counts them in full in each)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def _sandbox_kib(hostname: str, measure=_rss) -> int:
    """RSS (or `measure`) of one sandbox's process tree: its bwrap processes (given `--hostname <ws>`) and their
    descendants."""
    roots = []
    for entry in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0") if entry.isdigit() else []
        except OSError:
            continue
        if (
            cmd
            and cmd[0].endswith(b"bwrap")
            and b"--hostname" in cmd
            and cmd[cmd.index(b"--hostname") + 1] == hostname.encode()
        ):
            roots.append(int(entry))
    seen, todo, total = set(), list(roots), 0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            total += measure(pid)
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        todo += [int(c) for c in children]
    return total


def _memory(server: Server, client: Client, count: int) -> list[dict]:
    before = server.rss_kib()
    for i in range(count):
        client.put_workspace(NS, f"mem{i}", {})
        _exec(client, f"mem{i}", "true")
    time.sleep(1)
    per_ws = (server.rss_kib() - before) / count
    return [
        figure(
            "server RSS per idle workspace",
            per_ws,
            "KiB",
            "—",
            None,
            note=f"{count} workspaces booted once, then idle; sandbox processes excluded",
        ),
        figure(
            "sandbox memory (PSS) per idle workspace",
            _sandbox_kib("mem0", _pss) / 1024,
            "MiB",
            "goal (16 MiB)",
            16,
            goal=1.0,
            note="bwrap + supervisor of one idle workspace, shared pages divided among their users",
        ),
        figure(
            "sandbox RSS per idle workspace",
            _sandbox_kib("mem0") / 1024,
            "MiB",
            "goal (16 MiB)",
            16,
            goal=1.0,
            note="the same, every page counted in full (the Python binary and libraries too)",
        ),
    ]
