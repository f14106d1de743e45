"""How the supervisor starts: it tells its parent the moment it listens (--ready-fd), loads only what serving needs
(no ssl, no aiohttp, no archive or WebSocket modules until they are asked for; a file agent forked before the HTTP
server is loaded), and still refuses a
bad operator setting at start."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.supervisor.harness import IS_ROOT, SANDBOX_USER, needs_root, new_id, start_supervisor


def _launch(tmp_path: Path, extra: list[str], env: dict | None = None, **popen) -> subprocess.Popen:
    args = [sys.executable, "-m", "flarebox_supervisor", "--unix", str(tmp_path / "s.sock"), "--workdir", str(tmp_path)]
    if IS_ROOT:
        args += ["--user", SANDBOX_USER]
    return subprocess.Popen(args + extra, env={**os.environ, **(env or {})}, **popen)


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_the_ready_pipe_gets_one_byte_once_the_socket_accepts(tmp_path):
    read_fd, write_fd = os.pipe()
    process = _launch(tmp_path, ["--ready-fd", str(write_fd)], pass_fds=(write_fd,), stderr=subprocess.DEVNULL)
    os.close(write_fd)
    try:
        assert os.read(read_fd, 16) == b"1"
        # no retry: the socket listens when the byte comes
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(tmp_path / "s.sock")), base_url="http://sv") as client:
            assert client.get("/health").status_code == 200
            # the supervisor closed its end (EOF), and no command it starts holds a copy
            assert os.read(read_fd, 16) == b""
            body = {"request_id": new_id(), "command": f"test -e /proc/self/fd/{write_fd} && echo leaked || echo ok"}
            events = [json.loads(line) for line in client.post("/exec", json=body).text.splitlines() if line]
            assert "".join(e["data"] for e in events if e["type"] == "output") == "ok\n"
    finally:
        os.close(read_fd)
        _stop(process)


def test_a_supervisor_that_dies_before_listening_closes_the_ready_pipe(tmp_path):
    read_fd, write_fd = os.pipe()
    process = _launch(
        tmp_path, ["--ready-fd", str(write_fd), "--listen-fd", "999"], pass_fds=(write_fd,), stderr=subprocess.DEVNULL
    )
    os.close(write_fd)
    try:
        assert os.read(read_fd, 16) == b""  # EOF, never the ready byte
        assert process.wait(10) != 0
    finally:
        os.close(read_fd)
        _stop(process)


_HTTP_PARSER = "httptools/parser/parser"  # the C extension httpserver.py parses with


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_the_supervisor_does_not_load_ssl(supervisor):
    assert supervisor.exec("true").terminal["exit_code"] == 0
    maps = _mapped(supervisor.process.pid)
    assert "_ssl" not in maps and "libssl" not in maps
    assert "/aiohttp/" not in maps  # its server and client are not the supervisor's any more (httpserver.py)
    assert _HTTP_PARSER in maps  # what the check reads is really the supervisor's serving process


def test_archive_service_terminal_and_websocket_modules_are_imported_on_first_use_only(tmp_path):
    script = (
        "import sys\n"
        "from flarebox_supervisor.agent import LocalFiles\n"
        "from flarebox_supervisor.identity import resolve_identity\n"
        "from flarebox_supervisor.server import make_app\n"
        "from flarebox_supervisor.settings import settings_from_env\n"
        f"make_app(settings_from_env({str(tmp_path)!r}), resolve_identity('nobody'), LocalFiles())\n"
        "lazy = {'flarebox_supervisor.' + name for name in ('services', 'terminals', 'port_sockets')}\n"
        "print(sorted(m for m in sys.modules if 'archive' in m or m.startswith(('websockets', 'aiohttp'))"
        " or m in lazy))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_archive_and_service_routes_work_once_loaded(supervisor):
    (supervisor.workspace / "a.txt").write_text("x")
    response = supervisor.client.get("/files/archive", params={"path": str(supervisor.workspace)})
    assert response.status_code == 200 and response.content
    assert supervisor.client.get("/export").status_code == 200
    assert supervisor.client.get("/services").json() == {"services": []}
    assert supervisor.client.get("/services/web/logs").json()["error"]["code"] == "service_not_found"


@pytest.mark.parametrize("name", ["FLAREBOX_MAX_IMPORT_BYTES", "FLAREBOX_MAX_IMPORT_ENTRIES"])
def test_a_bad_import_limit_still_stops_the_supervisor_at_start(tmp_path, name):
    process = _launch(tmp_path, [], {name: "lots"}, stderr=subprocess.PIPE)
    try:
        _, err = process.communicate(timeout=30)
        assert process.returncode != 0
        assert name.encode() in err
    finally:
        _stop(process)


def test_a_lowered_import_limit_is_still_applied(tmp_path):
    gen = start_supervisor(tmp_path, {"FLAREBOX_MAX_IMPORT_BYTES": "10"})
    sup = next(gen)
    try:
        response = sup.client.put("/import", content=b"x" * 100, headers={"Content-Length": "100"})
        assert response.status_code == 413
    finally:
        gen.close()


@needs_root
def test_the_file_agent_is_forked_before_the_http_server_is_loaded(supervisor):
    (supervisor.workspace / "f.txt").write_text("x")
    assert supervisor.client.get("/files", params={"path": str(supervisor.workspace / "f.txt")}).text == "x"
    children = Path(f"/proc/{supervisor.process.pid}/task/{supervisor.process.pid}/children").read_text().split()
    agents = [int(c) for c in children if Path(f"/proc/{c}/status").read_text().count(f"\t{supervisor.uid}\t") > 0]
    assert agents, "no file agent found"
    for pid in agents:
        maps = _mapped(pid)
        assert _HTTP_PARSER not in maps
    assert _HTTP_PARSER in _mapped(supervisor.process.pid)
