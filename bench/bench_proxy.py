"""The port proxy end to end (issue 12): a real `flarebox serve` subprocess, a workspace running a small stdlib HTTP
service (bench/proxy_service.py: HTTP/1.1, keep-alive, TCP_NODELAY), measured against the SAME service program run
directly on the host's loopback in the same run, by the same client (http.client, one kept-alive connection per
target, requests interleaved so machine load hits both alike).

The path: client → uvicorn → edge → workspace → the server's own HTTP/1.1 client (standalone/upstream.py) on a TCP
socket the sandbox supervisor connected inside the sandbox's network namespace and handed over (SCM_RIGHTS), kept
alive between requests → the service.

  small GET         GET /big?bytes=1024 through the proxy vs the same GET to the service on the host. Goal: ≤ 1.5 ms
                    added at p50. Three more same-run rows say where the time goes: the same GET when the service
                    closes every connection (so each request costs a socket hand-over), the bare service with a new
                    TCP connection per request (its baseline) and the server's own GET /v1/health.
  100 MiB download  GET /big?bytes=104857600 through the proxy vs direct, throughput. Goal ≥ 0.5× direct.
  100 MiB upload    PUT /echo with a 100 MiB body (Content-Length given) through the proxy vs direct (report only).
  CPU split         user + system time of the server, the supervisor and the sandboxed service per proxied request
                    (from /proc/<pid>/stat), beside the direct service's: where the time goes without profiling
                    inside the server (it has no profiler hook).
"""

import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_standalone import TOKEN, Server, _free_port
from bench.framework import figure, percentile, timed

NS = "bench"
WS = "proxy"
SERVICE_PORT = 8000  # inside the sandbox (its own network namespace)
CLOSING_PORT = 8001  # the same program again, asked to close every connection: a socket hand-over per request
APP = Path(__file__).resolve().with_name("proxy_service.py")
MIB = 1024 * 1024
SMALL = "/big?bytes=1024"
BIG = 100 * MIB
DOWN = f"/big?bytes={BIG}"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
READ_BUFFER = MIB


class _Target:
    """One kept-alive HTTP/1.1 connection and the prefix that reaches the service's root through it."""

    def __init__(self, connection: http.client.HTTPConnection, prefix: str = "", headers: dict | None = None):
        self.connection = connection
        self.prefix = prefix
        self.headers = headers or {}
        self._buffer = memoryview(bytearray(READ_BUFFER))

    def request(self, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, int, bytes]:
        """(status, body bytes read, the body's first bytes); the body is drained so the connection can be
        reused."""
        try:
            self.connection.request(method, self.prefix + path, body=body, headers={**self.headers, **(headers or {})})
            response = self.connection.getresponse()
            size, first = 0, b""
            while True:
                n = response.readinto(self._buffer)
                if not n:
                    break
                if not size:
                    first = bytes(self._buffer[: min(n, 64)])
                size += n
            if response.will_close:  # would silently reconnect next time and bias the figure: say so
                raise RuntimeError(f"{self.prefix or 'direct'}: the server closed a kept-alive connection")
            return response.status, size, first
        except Exception:
            self.connection.close()  # the next request starts on a fresh connection, not a half-read one
            raise

    def get(self, path: str, want: int | None = None) -> int:
        status, size, _ = self.request("GET", path)
        if status != 200 or (want is not None and size != want):
            raise RuntimeError(f"GET {self.prefix}{path}: {status}, {size} bytes")
        return size

    def close(self) -> None:
        self.connection.close()


def _upload(target: _Target, payload: bytes) -> None:
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(len(payload))}
    status, _, answer = target.request("PUT", "/echo", body=payload, headers=headers)
    if (status, answer) != (200, str(len(payload)).encode()):  # the service counts what reached it
        raise RuntimeError(f"upload through {target.prefix or 'direct'}: {status} {answer!r}")


def _fresh_connection_get(port: int) -> None:
    """The bare service with a new TCP connection per request: the baseline of a proxied request that needs a new
    upstream connection (a socket hand-over) every time."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", SMALL, headers={"Connection": "close"})
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"direct GET (new connection): {response.status}")
    finally:
        connection.close()


def _wait(what: str, check, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, http.client.HTTPException, RuntimeError) as exc:
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up within {seconds:g} s (last error: {last!r})")


def _api(server: Server, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers={**AUTH, "Content-Type": content_type})
        response = connection.getresponse()
        answer = response.read()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {answer[:300]!r}")
        return answer
    finally:
        connection.close()


def _start_service(server: Server) -> None:
    base = f"/v1/workspaces/{NS}/{WS}"
    _api(server, "PUT", base, b"{}")
    _api(server, "PUT", base + "/files?path=/workspace/app.py", APP.read_bytes(), "application/octet-stream")
    for name, port in (("web", SERVICE_PORT), ("closing", CLOSING_PORT)):
        spec = {"command": f"python3 app.py {port}", "port": port, "health": {"path": "/health"}}
        _api(server, "PUT", base + f"/services/{name}", json.dumps(spec).encode())


def _direct_service(root: Path) -> tuple[subprocess.Popen, int]:
    """The same program on the host's loopback; its stdout goes to a file as the sandboxed one's goes to a log."""
    port = _free_port()
    log = open(root / "direct-service.log", "wb")  # noqa: SIM115 - closed right after Popen (the child holds it)
    try:
        proc = subprocess.Popen(
            [sys.executable, str(APP), str(port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        log.close()
    return proc, port


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _descendants(root: int) -> dict[int, bytes]:
    """{pid: cmdline} of every process below `root` (by parent pid: bwrap may be spawned from any thread)."""
    parents: dict[int, int] = {}
    cmdlines: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdlines[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found[child] = cmdlines.get(child, b"")
                todo.append(child)
    return found


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (dead ones included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sandbox_pids(server: Server) -> tuple[int, int]:
    """(the sandbox supervisor's pid, the sandboxed service's pid), found below the server process."""
    below = _descendants(server.proc.pid)
    # the standalone sandbox starts it without site: python -I -S -B -c "…run_module('flarebox_supervisor', …)"
    started = b"run_module('flarebox_supervisor'"
    supervisor = [pid for pid, cmd in below.items() if started in cmd and b"bwrap" not in cmd]
    argv = [b"python3", b"app.py", str(SERVICE_PORT).encode()]  # the measured one, not the closing one
    service = [pid for pid, cmd in below.items() if cmd.split(b"\0")[:3] == argv]
    if len(supervisor) != 1 or len(service) != 1:
        raise RuntimeError(f"expected one supervisor and one service below the server, found {below}")
    return supervisor[0], service[0]


def run(quick: bool = False) -> list[dict]:
    repeat = 200 if quick else 1000
    transfers = 1 if quick else 3
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="fbx-bench-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        direct_proc = None
        targets: list[_Target] = []
        server = Server(root)
        try:
            direct_proc, direct_port = _direct_service(root)
            _start_service(server)
            proxied = _Target(
                http.client.HTTPConnection("127.0.0.1", server.port, timeout=120),
                f"/v1/workspaces/{NS}/{WS}/ports/{SERVICE_PORT}",
                AUTH,
            )
            direct = _Target(http.client.HTTPConnection("127.0.0.1", direct_port, timeout=120))
            targets += [proxied, direct]
            _wait("the direct service", lambda: direct.get("/health") == 2)
            _wait("the proxied service", lambda: proxied.request("GET", "/health")[0] == 200)
            closing = _Target(
                http.client.HTTPConnection("127.0.0.1", server.port, timeout=120),
                f"/v1/workspaces/{NS}/{WS}/ports/{CLOSING_PORT}",
                AUTH,
            )
            targets.append(closing)
            _wait("the second proxied service", lambda: closing.request("GET", "/health")[0] == 200)
            floor = _Target(http.client.HTTPConnection("127.0.0.1", server.port, timeout=120), "", AUTH)
            targets.append(floor)
            rows += _small_get(proxied, direct, closing, floor, direct_port, repeat)
            payload = bytes(range(256)) * (BIG // 256)
            rows += _transfers(proxied, direct, payload, transfers)
            rows += _cpu_split(server, direct_proc.pid, proxied, direct, floor, payload, repeat, transfers)
        finally:
            for target in targets:
                target.close()
            if direct_proc is not None:
                _stop(direct_proc)
            server.stop()  # the sandbox and its service go with the server's process group
            subprocess.run(["chmod", "-R", "u+rwX", tmp], check=False)
    return rows


def _small_get(proxied: _Target, direct: _Target, closing: _Target, floor: _Target, direct_port: int, repeat: int):
    """One of each per round (full stack, direct, full stack with a new upstream connection each time, direct on a
    new connection, the server's own GET /v1/health), so load from elsewhere on the machine hits them alike; the
    last three say where the added time goes."""
    ms = 1000.0
    fns = {
        "full": lambda: proxied.get(SMALL, 1024),
        "direct": lambda: direct.get(SMALL, 1024),
        "handover": lambda: closing.get(SMALL + "&close=1", 1024),  # (another port: the kept-alive one stays)
        "fresh": lambda: _fresh_connection_get(direct_port),
        "floor": lambda: floor.get("/v1/health"),
    }
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        timed(fn, 0, warmup=50)
    for _ in range(repeat):
        for name, fn in fns.items():
            samples[name] += timed(fn, 1)
    full, bare, handover, fresh, floor_s = (samples[k] for k in ("full", "direct", "handover", "fresh", "floor"))
    full_p50, bare_p50 = percentile(full, 50) * ms, percentile(bare, 50) * ms
    added = full_p50 - bare_p50
    handover_p50, fresh_p50 = percentile(handover, 50) * ms, percentile(fresh, 50) * ms
    floor_p50 = percentile(floor_s, 50) * ms
    n = f"n={repeat} interleaved"
    return [
        figure(
            "proxied GET 1 KiB: added latency p50",
            added,
            "ms",
            "goal (1.5 ms)",
            1.5,
            goal=1.0,
            note=f"full stack p50 {full_p50:.3f} ms − direct p50 {bare_p50:.3f} ms (same run, {n})",
        ),
        {
            **figure(
                "proxied GET 1 KiB p50, full stack",
                full_p50,
                "ms",
                "the service directly on host loopback p50",
                bare_p50,
                note=f"one kept-alive HTTP/1.1 connection each (http.client), the proxy's upstream one too; {n}",
            ),
            "samples": [s * ms for s in full],
            "baseline_samples": [s * ms for s in bare],
            "samples_label": "through the proxy",
            "plot": "latency",
        },
        figure(
            "proxied GET 1 KiB p95, full stack",
            percentile(full, 95) * ms,
            "ms",
            "the service directly on host loopback p95",
            percentile(bare, 95) * ms,
        ),
        {
            **figure(
                "proxied GET 1 KiB p50, new upstream connection per request",
                handover_p50,
                "ms",
                "the service directly p50, new TCP connection per request",
                fresh_p50,
                note="a second service (port 8001) answers Connection: close, so every request has the supervisor "
                "connect and hand the "
                f"socket over: ≈ {handover_p50 - full_p50:.3f} ms more than on a kept-alive upstream connection, "
                f"of which a new TCP connection to the service alone is ≈ {fresh_p50 - bare_p50:.3f} ms ({n})",
            ),
            "samples": [s * ms for s in handover],
            "baseline_samples": [s * ms for s in fresh],
            "samples_label": "proxied, socket hand-over per request",
            "plot": "latency",
        },
        figure(
            "direct GET 1 KiB p50, new TCP connection per request",
            fresh_p50,
            "ms",
            "the service directly p50 (kept alive)",
            bare_p50,
            note=f"a new connection to the service by itself: ≈ {fresh_p50 - bare_p50:.3f} ms",
        ),
        figure(
            "server floor: GET /v1/health p50",
            floor_p50,
            "ms",
            "the service directly p50",
            bare_p50,
            note="uvicorn + edge + token check, no workspace: of the server's share, the workspace object and its "
            f"HTTP/1.1 client take ≈ {full_p50 - floor_p50:.3f} ms",
        ),
    ]


def _transfers(proxied: _Target, direct: _Target, payload: bytes, repeat: int) -> list[dict]:
    """Each transfer through the full stack and directly, one of each per round."""
    targets = {"full": proxied, "direct": direct}
    got: dict[str, list[float]] = {name: [] for name in targets}
    put: dict[str, list[float]] = {name: [] for name in targets}
    for round_ in range(repeat + 1):  # round 0 warms up
        for name, target in targets.items():
            get_s = timed(lambda t=target: t.get(DOWN, BIG), 1)
            put_s = timed(lambda t=target: _upload(t, payload), 1)
            if round_:
                got[name] += get_s
                put[name] += put_s
    mib = BIG / MIB
    how = f"median of {repeat}, after a warm-up round" if repeat > 1 else "one run after a warm-up round"

    def rate(samples: list[float]) -> float:
        return mib / percentile(samples, 50)

    return [
        figure(
            "proxied download 100 MiB",
            rate(got["full"]),
            "MiB/s",
            "the service directly on host loopback",
            rate(got["direct"]),
            goal=0.5,
            better="higher",
            note=f"GET /big, Content-Length kept; {how}",
        ),
        figure(
            "proxied upload 100 MiB",
            rate(put["full"]),
            "MiB/s",
            "the service directly on host loopback",
            rate(put["direct"]),
            better="higher",
            note=f"PUT /echo with Content-Length (the service reads and discards it); {how}; report only",
        ),
    ]


def _cpu_split(
    server: Server,
    direct_pid: int,
    proxied: _Target,
    direct: _Target,
    floor: _Target,
    payload: bytes,
    repeat: int,
    transfers: int,
) -> list[dict]:
    """Where the time goes, without touching the server: the CPU each process spends per request (from
    /proc/<pid>/stat; clock ticks, so summed over many requests), proxied requests alone, then direct ones alone."""
    supervisor, service = _sandbox_pids(server)
    tick = os.sysconf("SC_CLK_TCK")
    rows = []
    for label, call, count, unit, scale in (
        ("GET 1 KiB", lambda t: t.get(SMALL, 1024), repeat, "ms", 1000.0),
        ("download 100 MiB", lambda t: t.get(DOWN, BIG), transfers, "s", 1.0),
        ("upload 100 MiB", lambda t: _upload(t, payload), transfers, "s", 1.0),
    ):
        pids = {"flarebox serve": server.proc.pid, "sandbox supervisor": supervisor, "sandboxed service": service}
        before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        for _ in range(count):
            call(proxied)
        spent = {name: (_cpu_seconds(pid) - before[name]) / count * scale for name, pid in pids.items()}
        start = _cpu_seconds(direct_pid)
        for _ in range(count):
            call(direct)
        baseline = (_cpu_seconds(direct_pid) - start) / count * scale
        for name, value in spent.items():
            rows.append(
                figure(
                    f"CPU per proxied {label}: {name}",
                    value,
                    unit,
                    "the service's CPU per direct request",
                    baseline,
                    note=f"user + system over {count} request{'s' if count > 1 else ''} (ticks of 1/{tick} s)",
                )
            )
        if label == "GET 1 KiB":  # the server's floor: what any request costs it before the workspace is reached
            floor.close()  # idle since the latency rounds: uvicorn's keep-alive timeout may have closed it
            floor.get("/v1/health")
            start = _cpu_seconds(server.proc.pid)
            for _ in range(count):
                floor.get("/v1/health")
            rows.append(
                figure(
                    "CPU per GET /v1/health: flarebox serve",
                    (_cpu_seconds(server.proc.pid) - start) / count * scale,
                    unit,
                    "the service's CPU per direct request",
                    baseline,
                    note=f"uvicorn + edge + token check, no workspace; over {count} requests",
                )
            )
    return rows
