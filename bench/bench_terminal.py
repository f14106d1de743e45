"""Terminal sessions on the standalone runtime: how long a keystroke takes to come back.

  keystroke echo    one byte sent on the PTY WebSocket (client → uvicorn → edge-accepted socket → workspace relay →
                    the supervisor's socket → the pty), echoed by the remote tty and readline, and received back
                    — vs the supervisor's exec round trip (POST /exec `true` on the sandbox's unix socket) measured
                    in the same run, interleaved. Goal: keystroke echo p50 ≤ 2× the supervisor's exec p50.

A keystroke is the one thing a person at a terminal feels; an exec round trip is the smallest thing the supervisor
does for an agent, so the ratio says whether the terminal's extra hops (two WebSockets, the relay) cost more than
starting a process.
"""

import asyncio
import json
import time
import uuid
from pathlib import Path

import httpx
from websockets.asyncio.client import connect

from bench.bench_standalone import NS, TOKEN, Server, _supervisor_socket, boot, serving
from bench.framework import figure, percentile


def run(quick: bool = False) -> list[dict]:
    repeat = 50 if quick else 300
    with serving() as (server, _):
        boot(server, "term")
        echo, exec_rt = asyncio.run(_measure(server, _supervisor_socket(server.data_dir), repeat))
    echo_p50, exec_p50 = percentile(echo, 50) * 1000, percentile(exec_rt, 50) * 1000
    return [
        figure(
            "terminal keystroke echo round trip p50",
            echo_p50,
            "ms",
            "supervisor exec `true` round trip p50",
            exec_p50,
            goal=2.0,
            note=f"p95 {percentile(echo, 95) * 1000:.2f} ms; {len(echo)} keystrokes, interleaved with the execs",
        )
    ]


async def _measure(server: Server, sock: Path, repeat: int) -> tuple[list[float], list[float]]:
    url = server.url.replace("http", "ws", 1) + f"/v1/workspaces/{NS}/term/pty"
    transport = httpx.AsyncHTTPTransport(uds=str(sock))
    async with (
        connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, compression=None) as conn,
        httpx.AsyncClient(transport=transport, base_url="http://sandbox") as supervisor,
    ):
        await _until(conn, lambda frame: isinstance(frame, str) and json.loads(frame)["type"] == "session")
        await conn.send(b"stty -echoctl; PS1='$ '\r")  # a short prompt; nothing else comes back but the echo
        await asyncio.sleep(0.5)
        await _drain(conn)
        echo, exec_rt = [], []
        for i in range(repeat + 10):
            key = b"abcdefghij"[i % 10 : i % 10 + 1]
            start = time.perf_counter()
            await conn.send(key)
            await _until(conn, lambda frame, key=key: isinstance(frame, bytes) and key in frame)
            took = time.perf_counter() - start
            start = time.perf_counter()
            body = {"request_id": uuid.uuid4().hex, "command": "true"}
            async with supervisor.stream("POST", "/exec", json=body) as response:
                lines = [json.loads(line) async for line in response.aiter_lines() if line]
            assert lines[-1]["type"] == "exit", lines
            if i >= 10:  # warm-up
                echo.append(took)
                exec_rt.append(time.perf_counter() - start)
            if i % 50 == 49:
                await conn.send(b"\x15")  # Ctrl-U: clear the typed line, so the line never wraps
                await asyncio.sleep(0.05)
                await _drain(conn)
        await conn.send(b"\x15exit\r")
    return echo, exec_rt


async def _until(conn, predicate) -> None:
    while not predicate(await asyncio.wait_for(conn.recv(), 10)):
        pass


async def _drain(conn) -> None:
    while True:
        try:
            await asyncio.wait_for(conn.recv(), 0.05)
        except TimeoutError:
            return
