"""Where one exec round trip's time goes (issue 15), on a real `flarebox serve`, every part measured in the same run
and interleaved round by round. The clients are raw kept-alive sockets parsed with httptools, so no Python HTTP
client's cost hides in the figures:

  spawn        `subprocess.run(["bash", "-c", "true"])` from Python on the host: the floor of any exec
  sv floor     GET /health on the sandbox's supervisor socket: its HTTP round trip with no work
  sv exec      POST /exec `true` on that socket, to the terminal event: floor + spawn + its exec work
  server floor GET /v1/health on the server: uvicorn + edge + token check, no workspace
  full exec    POST /v1/workspaces/…/exec `true`, to the terminal event: everything
  server CPU   user + system time of `flarebox serve` per full exec (/proc), and the same for the supervisor

Two rows carry issue 15's goals: the full stack ≤ 2× the spawn and the supervisor alone ≤ 1.3×. The others are
differences of medians (report only; bench/README.md reads them as the breakdown).
"""

import os
import socket
import subprocess
import time
from pathlib import Path

from bench.bench_standalone import NS, TOKEN, _supervisor_socket, boot, serving
from bench.framework import figure, percentile
from bench.rawhttp import RawClient, check_exit, exec_body, unix_client
from standalone.peer import descends_from


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _supervisor_pid(server_pid: int) -> int | None:
    """The supervisor of the server's one sandbox: a descendant of the server running flarebox_supervisor (bwrap's
    command line names it too)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            program = cmd.split(b"\0", 1)[0]
            if (
                b"flarebox_supervisor" in cmd
                and not program.endswith(b"bwrap")
                and descends_from(int(entry), server_pid)
            ):
                return int(entry)
    return None


def run(quick: bool = False) -> list[dict]:
    repeat = 50 if quick else 300
    with serving() as (server, _):
        boot(server, "parts")
        sv_path = _supervisor_socket(server.data_dir)
        sv = unix_client(str(sv_path))
        srv = RawClient(
            socket.create_connection(("127.0.0.1", server.port)),
            "127.0.0.1",
            {"Authorization": f"Bearer {TOKEN}"},
        )
        srv.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        exec_path = f"/v1/workspaces/{NS}/parts/exec"
        parts = {
            "spawn": lambda: subprocess.run(["bash", "-c", "true"], check=True),
            "sv floor": lambda: sv.request("GET", "/health"),
            "sv exec": lambda: check_exit(*sv.request("POST", "/exec", exec_body())),
            "server floor": lambda: srv.request("GET", "/v1/health"),
            "full exec": lambda: check_exit(*srv.request("POST", exec_path, exec_body())),
        }
        samples: dict[str, list[float]] = {name: [] for name in parts}
        for fn in parts.values():
            for _ in range(5):
                fn()
        supervisor = _supervisor_pid(server.proc.pid)
        cpu_server = cpu_sv = 0.0
        for _ in range(repeat):
            for name, fn in parts.items():
                if name == "full exec":
                    server_before = _cpu_seconds(server.proc.pid)
                    sv_before = _cpu_seconds(supervisor) if supervisor else 0.0
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
                if name == "full exec":
                    cpu_server += _cpu_seconds(server.proc.pid) - server_before
                    cpu_sv += (_cpu_seconds(supervisor) - sv_before) if supervisor else 0.0
        sv.close()
        srv.close()
    p50 = {name: percentile(values, 50) * 1000 for name, values in samples.items()}
    note = f"p50 of {repeat}, interleaved"
    return [
        figure(
            "exec `true` round trip, full stack p50",
            p50["full exec"],
            "ms",
            "bare bash -c true p50",
            p50["spawn"],
            goal=2.0,
            note=f"{note}; a bare kept-alive HTTP/1.1 client (bench/rawhttp.py)",
        ),
        figure(
            "exec `true` round trip, supervisor alone p50",
            p50["sv exec"],
            "ms",
            "bare bash -c true p50",
            p50["spawn"],
            goal=1.3,
            note="POST /exec on the sandbox's unix socket, as the server's own client sends it",
        ),
        figure("exec parts: spawn, bash -c true from Python (p50)", p50["spawn"], "ms", "—", None, note=note),
        figure("exec parts: supervisor HTTP floor, GET /health (p50)", p50["sv floor"], "ms", "—", None),
        figure(
            "exec parts: supervisor exec work beyond spawn and floor",
            p50["sv exec"] - p50["sv floor"] - p50["spawn"],
            "ms",
            "—",
            None,
            note=f"supervisor exec `true` p50 {p50['sv exec']:.2f} ms − floor − spawn: parse, Popen's Python side, "
            "pipe, pidfd exit, journal, NDJSON stream",
        ),
        figure("exec parts: server HTTP floor, GET /v1/health (p50)", p50["server floor"], "ms", "—", None),
        figure(
            "exec parts: what the server adds to the supervisor's exec",
            p50["full exec"] - p50["sv exec"],
            "ms",
            "—",
            None,
            note=f"full exec p50 {p50['full exec']:.2f} ms − supervisor exec p50: edge (auth, routing, audit), "
            "workspace (ledger, idle pushes, boot check), the started event, the hop to the supervisor, the relay",
        ),
        figure(
            "exec parts: server CPU per exec",
            cpu_server / repeat * 1000,
            "ms",
            "—",
            None,
            note="user + system time of flarebox serve over the full execs (ticks of 1/100 s)",
        ),
        figure(
            "exec parts: supervisor CPU per exec",
            cpu_sv / repeat * 1000,
            "ms",
            "—",
            None,
            note="the same for the sandbox's supervisor (bash itself excluded: a child process)",
        ),
    ]
