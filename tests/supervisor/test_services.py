"""Services in the real supervisor: started by PUT, watched until their port answers, restarted with backoff, ended
`failed` after a crash loop, stopped with their whole process group, and their log followed like exec output."""

import asyncio
import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest

from protocol import limits
from protocol.errors import ERRORS

from .harness import IS_ROOT, group_alive, kill_group, start_supervisor, wait_until

pytestmark = pytest.mark.timeout(60)

BACKOFF = 0.05  # the supervisors here start with FLAREBOX_SERVICE_BACKOFF_FIRST_SECONDS lowered to this
ENV = {"FLAREBOX_SERVICE_BACKOFF_FIRST_SECONDS": str(BACKOFF)}
HTTP_SERVER = "exec python3 -m http.server {port} --bind 127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


class Api:
    """The services routes of one supervisor; remembers every pid it saw, to kill leftovers at teardown."""

    def __init__(self, sup):
        self.sup = sup
        self.client = sup.client
        self.pids: set[int] = set()

    def body(self, command: str, port: int | None = None, **fields) -> dict:
        return {"command": command, "port": port or free_port(), "cwd": str(self.sup.workspace), **fields}

    def put(self, name: str, body: dict):
        response = self.client.put(f"/services/{name}", json=body)
        if response.status_code == 200 and response.json()["pid"]:
            self.pids.add(response.json()["pid"])
        return response

    def services(self) -> dict[str, dict]:
        listed = self.client.get("/services").json()["services"]
        for service in listed:
            if service["pid"]:
                self.pids.add(service["pid"])
        return {s["name"]: s for s in listed}

    def service(self, name: str) -> dict:
        return self.services()[name]

    def wait_state(self, name: str, state: str, timeout: float = 10) -> dict:
        assert wait_until(lambda: self.service(name)["state"] == state, timeout), self.service(name)
        return self.service(name)

    def logs(self, name: str, offset: int = 0) -> list[dict]:
        """A log read to its end (the service must be failed/stopped/deleted for it to end)."""
        response = self.client.get(f"/services/{name}/logs", params={"offset": offset})
        assert response.status_code == 200, response.text
        return [json.loads(line) for line in response.text.splitlines() if line]

    def cleanup(self) -> None:
        self.client.put("/services", json={"services": {}})
        for pid in self.pids:
            kill_group(pid)


def output_of(events: list[dict]) -> str:
    return "".join(e["data"] for e in events if e["type"] == "output")


@pytest.fixture(scope="module")
def module_supervisor(tmp_path_factory):
    yield from start_supervisor(tmp_path_factory.mktemp("services"), ENV)


@pytest.fixture
def api(module_supervisor):
    api = Api(module_supervisor)
    yield api
    api.cleanup()


def test_a_service_starts_runs_as_the_sandbox_user_and_answers_on_its_port(api):
    port = free_port()
    command = 'echo "uid=$(id -u) token=$FLAREBOX_TEST_TOKEN"; ' + HTTP_SERVER.format(port=port)
    put = api.put("web", api.body(command, port, env={"FLAREBOX_TEST_TOKEN": "tok-123"}, restart="always"))
    assert put.status_code == 200, put.text
    service = put.json()
    assert service["name"] == "web" and service["state"] == "starting" and service["restarts"] == 0
    assert service["port"] == port and service["restart"] == "always" and service["health_path"] is None
    assert isinstance(service["pid"], int) and service["started_at"].endswith("Z") and service["last_exit"] is None
    assert "tok-123" not in put.text and "env" not in service  # env holds secrets: never echoed

    ready = api.client.get("/services/web/ready", params={"timeout": 10}).json()
    assert ready["ready"] is True and ready["service"]["state"] == "running"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert conn.recv(100).startswith(b"HTTP/1.0 200")
    listed = api.client.get("/services")
    assert listed.json()["services"] == [ready["service"]] and "tok-123" not in listed.text
    # the service is in its own session, led by the pid reported
    assert os.getpgid(service["pid"]) == service["pid"] and os.getsid(service["pid"]) == service["pid"]
    # services are not commands: the idle alarm's `running` count ignores them
    assert api.client.get("/health").json()["running"] == 0

    with api.client.stream("GET", "/services/web/logs") as response:
        lines = response.iter_lines()
        text = ""
        while "uid=" not in text or "running:" not in text:
            event = json.loads(next(lines))
            text += event.get("data", "")
    assert f"uid={api.sup.uid} token=tok-123\n" in text
    assert "[flarebox] started, pid" in text and f"[flarebox] running: port {port}" in text


def test_logs_follow_live_output_with_offsets_and_resume_from_an_offset(api):
    command = "for i in 1 2 3 4 5; do echo line$i; sleep 0.2; done; exec sleep 300"
    assert api.put("talker", api.body(command, restart="never")).status_code == 200
    frames, arrivals = [], []
    with api.client.stream("GET", "/services/talker/logs") as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        lines = response.iter_lines()
        heartbeats = 0
        while "line5" not in output_of(frames) or heartbeats == 0:
            event = json.loads(next(lines))
            if event["type"] == "heartbeat":
                heartbeats += 1  # 1 s of silence after line5 (the harness sets FLAREBOX_HEARTBEAT_SECONDS=1)
                continue
            assert event["type"] == "output"
            frames.append(event)
            arrivals.append(time.monotonic())
    # offsets are contiguous code point counts from 0
    position = 0
    for frame in frames:
        assert frame["offset"] == position
        position += len(frame["data"])
    text = output_of(frames)
    assert [line for line in text.splitlines() if line.startswith("line")] == [f"line{i}" for i in range(1, 6)]
    first = next(i for i, f in enumerate(frames) if "line1" in f["data"])
    last = next(i for i, f in enumerate(frames) if "line5" in f["data"])
    assert arrivals[last] - arrivals[first] > 0.5  # followed live, not delivered at the end

    # resume from the offset of "line3": the same text from there on, with the same offsets
    offset = text.index("line3")
    with api.client.stream("GET", "/services/talker/logs", params={"offset": offset}) as response:
        event = json.loads(next(response.iter_lines()))
    assert event["offset"] == offset and event["data"].startswith("line3\nline4\nline5\n")
    # an offset past the end waits for more: the stream is still open when a heartbeat comes
    with api.client.stream("GET", "/services/talker/logs", params={"offset": position + 1000}) as response:
        assert json.loads(next(response.iter_lines())) == {"type": "heartbeat"}


def test_a_crash_loop_ends_failed_after_five_quick_exits_with_its_output_kept(api):
    started = time.monotonic()
    assert api.put("crasher", api.body('echo "crash $$"; exit 3')).status_code == 200
    service = api.wait_state("crasher", "failed")
    assert time.monotonic() - started < 5  # 0.05 + 0.1 + 0.2 + 0.4 s of backoff
    assert service["restarts"] == limits.SERVICE_MAX_QUICK_EXITS - 1
    assert service["last_exit"]["code"] == 3 and service["last_exit"]["signal"] is None
    assert service["pid"] is None
    events = api.logs("crasher")  # ends by itself: a failed service produces no more output
    text = output_of(events)
    assert text.count("crash ") == limits.SERVICE_MAX_QUICK_EXITS
    delays = [BACKOFF * 2**i for i in range(limits.SERVICE_MAX_QUICK_EXITS - 1)]
    for delay in delays:
        assert f"[flarebox] exited with code 3; restarting in {delay:g} s\n" in text
    assert text.endswith("[flarebox] exited with code 3\n[flarebox] failed: 5 quick exits in a row\n")
    assert events[-1] == {
        "type": "service",
        "state": "failed",
        "restarts": limits.SERVICE_MAX_QUICK_EXITS - 1,
        "last_exit": service["last_exit"],
    }
    # the supervisor and its other services are unaffected
    assert api.client.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("restart", "code", "state", "restarted"),
    [
        ("always", 0, "failed", True),  # restarted after a clean exit too (until the quick exits add up)
        ("on-failure", 0, "stopped", False),
        ("on-failure", 1, "failed", True),
        ("never", 1, "failed", False),
        ("never", 0, "stopped", False),
    ],
)
def test_restart_policies(api, restart, code, state, restarted):
    assert api.put("policy", api.body(f"echo run; exit {code}", restart=restart)).status_code == 200
    service = api.wait_state("policy", state)
    events = api.logs("policy")
    runs = output_of(events).count("run\n")
    if restarted:
        assert service["restarts"] == limits.SERVICE_MAX_QUICK_EXITS - 1 and runs == limits.SERVICE_MAX_QUICK_EXITS
    else:
        assert service["restarts"] == 0 and runs == 1
        time.sleep(3 * BACKOFF)
        assert api.service("policy")["restarts"] == 0
    assert service["last_exit"]["code"] == code
    assert events[-1]["type"] == "service" and events[-1]["state"] == state
    if restart == "never" and code:
        assert "[flarebox] failed: restart is never\n" in output_of(events)


def test_delete_ends_the_whole_group_and_ends_followers(api):
    # a background child that ignores SIGTERM: only the SIGKILL after the grace period ends it
    command = "(trap '' TERM; exec sleep 300) & echo child=$!; exec sleep 300"
    service = api.put("grouped", api.body(command)).json()
    pgid = service["pid"]
    with api.client.stream("GET", "/services/grouped/logs") as response:
        lines = response.iter_lines()
        text = ""
        while "child=" not in text:
            text += json.loads(next(lines)).get("data", "")
        child = int(text.split("child=")[1].split()[0])
        assert pid_alive(child) and os.getpgid(child) == pgid
        started = time.monotonic()
        deleted = api.client.delete("/services/grouped")
        elapsed = time.monotonic() - started
        assert deleted.status_code == 200 and deleted.json() == {"name": "grouped", "deleted": True}
        rest = [json.loads(line) for line in lines if line]  # the follower's stream ends
    assert not group_alive(pgid) and not pid_alive(child)
    assert limits.KILL_GRACE_SECONDS - 0.5 < elapsed < limits.KILL_GRACE_SECONDS + 5
    assert rest[-1]["type"] == "service" and rest[-1]["state"] == "stopped" and rest[-1]["deleted"] is True
    assert rest[-1]["last_exit"]["signal"] == signal.SIGTERM
    assert "[flarebox] stopping: SIGTERM to the process group" in output_of(rest)
    assert "grouped" not in api.services()
    for method, path in (("DELETE", ""), ("GET", "/logs"), ("GET", "/ready")):
        gone = api.client.request(method, f"/services/grouped{path}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "service_not_found"


def test_what_an_exited_shell_left_running_is_ended_with_it(api):
    # a service is its process group: a background job left behind must not hold the port into the next run
    assert api.put("leftover", api.body("sleep 300 & echo bg=$!; exit 0", restart="never")).status_code == 200
    api.wait_state("leftover", "stopped")
    text = output_of(api.logs("leftover"))
    assert "[flarebox] exited with code 0; not restarted (restart is never)" in text
    assert not pid_alive(int(text.split("bg=")[1].split()[0]))


def test_put_of_the_whole_set_stops_the_services_it_does_not_name(api):
    one = api.put("one", api.body("exec sleep 300")).json()
    two = api.put("two", api.body("exec sleep 300")).json()
    response = api.client.put(
        "/services", json={"services": {"two": api.body("exec sleep 301"), "three": api.body("exec sleep 302")}}
    )
    assert response.status_code == 200, response.text
    listed = response.json()["services"]
    assert [s["name"] for s in listed] == ["three", "two"]
    for service in listed:
        api.pids.add(service["pid"])
    assert wait_until(lambda: not group_alive(one["pid"]), 5)
    assert not group_alive(two["pid"])  # a named service is replaced by its new definition
    assert {s["command"] for s in listed} == {"exec sleep 301", "exec sleep 302"}
    assert all(group_alive(s["pid"]) for s in listed)
    assert sorted(api.services()) == ["three", "two"]
    emptied = api.client.put("/services", json={"services": {}})
    assert emptied.json() == {"services": []}
    assert all(wait_until(lambda s=s: not group_alive(s["pid"]), 5) for s in listed)


def test_replacing_a_service_keeps_its_log_and_resets_restarts(api):
    assert api.put("replaced", api.body("echo first; exit 1", restart="always")).status_code == 200
    assert wait_until(lambda: api.service("replaced")["restarts"] >= 2)
    api.wait_state("replaced", "failed")
    first = api.logs("replaced")
    end = sum(len(e["data"]) for e in first if e["type"] == "output")
    new = api.put("replaced", api.body("echo second; exec sleep 300")).json()
    assert new["restarts"] == 0 and new["state"] == "starting" and new["last_exit"] is None
    with api.client.stream("GET", "/services/replaced/logs", params={"offset": end}) as response:
        event = json.loads(next(response.iter_lines()))
    assert event["offset"] == end  # offsets continue across the replace
    with api.client.stream("GET", "/services/replaced/logs") as response:
        lines = response.iter_lines()
        text = ""
        while "second" not in text:
            text += json.loads(next(lines)).get("data", "")
    assert text.startswith(output_of(first)) and text.count("first\n") == limits.SERVICE_MAX_QUICK_EXITS


def test_replacing_a_running_service_stops_the_old_group(api):
    old = api.put("swap", api.body("exec sleep 300")).json()
    new = api.put("swap", api.body("exec sleep 301")).json()
    assert new["pid"] != old["pid"] and not group_alive(old["pid"]) and group_alive(new["pid"])


def test_ready_waits_for_the_health_path(api):
    port = free_port()
    flag = api.sup.workspace / "healthy"
    script = api.sup.workspace / "health_server.py"
    script.write_text(
        "import http.server, os, sys\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        f"        ok = self.path == '/healthz' and os.path.exists({str(flag)!r})\n"
        "        self.send_response(204 if ok else 503)\n"
        "        self.end_headers()\n"
        "    def log_message(self, *args):\n"
        "        pass\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
    )
    body = api.body(f"exec python3 {script} {port}", port, health_path="/healthz")
    assert api.put("healthy", body).json()["health_path"] == "/healthz"
    assert wait_until(lambda: _accepts(port), 10)  # listening, but its health path answers 503
    not_yet = api.client.get("/services/healthy/ready", params={"timeout": 0.5}).json()
    assert not_yet["ready"] is False and not_yet["service"]["state"] == "starting"
    started = time.monotonic()
    timer = threading.Timer(0.5, flag.touch)  # healthy half a second from now
    timer.start()
    try:
        ready = api.client.get("/services/healthy/ready", params={"timeout": 10}).json()
    finally:
        timer.join()
    assert ready["ready"] is True and ready["service"]["state"] == "running"
    assert 0.4 < time.monotonic() - started < 5
    flag.unlink()


def test_a_ready_wait_follows_a_replace_to_the_new_definition(api):
    port = free_port()
    assert api.put("reborn", api.body("exec sleep 300", port)).status_code == 200  # never listens
    result = {}
    waiter = httpx.Client(transport=api.sup.transport(), base_url="http://sv", timeout=30)

    def wait():
        result["ready"] = waiter.get("/services/reborn/ready", params={"timeout": 15}).json()

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        time.sleep(0.3)
        assert api.put("reborn", api.body(HTTP_SERVER.format(port=port), port)).status_code == 200
        thread.join(20)
    finally:
        waiter.close()
    assert result["ready"]["ready"] is True and result["ready"]["service"]["command"].startswith("exec python3")


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_ready_of_a_service_that_fails_answers_at_once(api):
    assert api.put("doomed", api.body("exit 1", restart="never")).status_code == 200
    started = time.monotonic()
    ready = api.client.get("/services/doomed/ready", params={"timeout": 20}).json()
    assert ready["ready"] is False and ready["service"]["state"] == "failed"
    assert time.monotonic() - started < 5


def test_a_service_whose_cwd_is_missing_fails_with_a_note(api):
    body = api.body("exec sleep 300", cwd="/nonexistent/flarebox", restart="never")
    assert api.put("nocwd", body).status_code == 200
    service = api.wait_state("nocwd", "failed")
    assert service["last_exit"]["code"] is None and service["last_exit"]["signal"] is None
    assert "[flarebox] could not start: No such file or directory" in output_of(api.logs("nocwd"))


def test_at_most_max_services(api):
    bodies = {f"s{i}": api.body("exec sleep 300") for i in range(limits.MAX_SERVICES)}
    response = api.client.put("/services", json={"services": bodies})
    assert response.status_code == 200 and len(response.json()["services"]) == limits.MAX_SERVICES
    for service in response.json()["services"]:
        api.pids.add(service["pid"])
    extra = api.put("one-more", api.body("exec sleep 300"))
    assert extra.status_code == 400 and extra.json()["error"]["code"] == "invalid_field"
    assert str(limits.MAX_SERVICES) in extra.json()["error"]["message"]
    assert api.put("s0", api.body("exec sleep 301")).status_code == 200  # replacing one is not one more
    too_many = {**bodies, "one-more": api.body("exec sleep 300")}
    response = api.client.put("/services", json={"services": too_many})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_field"
    assert len(api.services()) == limits.MAX_SERVICES


@pytest.mark.parametrize("port", [0, 65536, 8080, "abc", True, -1, 1.5, None])
def test_invalid_ports_are_refused(api, port):
    response = api.put("badport", {**api.body("exec sleep 300"), "port": port})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_port"
    assert "badport" not in api.services()


@pytest.mark.parametrize("name", ["Web", "-web", "web_1", "a" * 33, "web.1", "%20"])
def test_invalid_names_are_refused(api, name):
    response = api.put(name, api.body("exec sleep 300"))
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_name"
    for method, path in (("DELETE", ""), ("GET", "/logs"), ("GET", "/ready")):
        response = api.client.request(method, f"/services/{name}{path}")
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_name"
    assert api.services() == {}


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"command": ""}, "invalid_field"),
        ({"command": 5}, "invalid_field"),
        ({"command": None}, "invalid_field"),
        ({"restart": "sometimes"}, "invalid_field"),
        ({"cwd": "relative/dir"}, "invalid_cwd"),
        ({"cwd": None}, "invalid_cwd"),
        ({"env": {"A": 1}}, "invalid_field"),
        ({"env": ["A"]}, "invalid_field"),
        ({"health_path": "no-slash"}, "invalid_field"),
        ({"secrets": ["A"]}, "unknown_field"),
    ],
)
def test_invalid_bodies_are_refused(api, change, code):
    response = api.put("badbody", {**api.body("exec sleep 300"), **change})
    assert response.status_code == 400 and response.json()["error"]["code"] == code, response.text
    assert api.services() == {}


def test_malformed_requests_are_refused(api):
    client = api.client
    cases = [
        (client.put("/services/x", content=b"{", headers={"Content-Type": "application/json"}), "invalid_json"),
        (client.put("/services/x", content=b"[]", headers={"Content-Type": "application/json"}), "invalid_json"),
        (client.put("/services/x", content=b"{}", headers={"Content-Type": "text/plain"}), "unsupported_media_type"),
        (client.put("/services/x", params={"a": "b"}, json=api.body("exit 0")), "invalid_query"),
        (client.put("/services", json={"services": []}), "invalid_field"),
        (client.put("/services", json={"services": {"x": []}}), "invalid_field"),
        (client.put("/services", json={"services": {}, "more": 1}), "unknown_field"),
        (client.put("/services", json={"services": {"Bad": api.body("exit 0")}}), "invalid_name"),
        (client.get("/services/x/logs", params={"offset": "-1"}), "invalid_query"),
        (client.get("/services/x/ready", params={"timeout": "abc"}), "invalid_query"),
        (client.get("/services/x/ready", params={"timeout": "-1"}), "invalid_query"),
        (client.get("/services/x/ready", params={"timeout": "nan"}), "invalid_query"),
    ]
    for response, code in cases:
        assert response.status_code == ERRORS[code][0] and response.json()["error"]["code"] == code, response.text
    # one bad entry refuses the whole set, and the running set is left as it was
    assert api.put("kept", api.body("exec sleep 300")).status_code == 200
    bad = {"services": {"fine": api.body("exec sleep 300"), "broken": {**api.body("x"), "port": 0}}}
    response = client.put("/services", json=bad)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_port"
    assert "services.broken" in response.json()["error"]["message"]
    assert sorted(api.services()) == ["kept"]


def test_a_service_body_may_exceed_the_json_limit_with_its_secrets(api):
    # secrets' values travel in env: a body over MAX_BODY_BYTES (1 MiB) is taken on these routes
    env = {f"SECRET_{i}": "v" * 100_000 for i in range(12)}
    body = api.body('echo "len=${#SECRET_11}"; exec sleep 300', env=env)
    assert len(json.dumps(body)) > limits.MAX_BODY_BYTES
    assert api.put("big", body).status_code == 200
    response = api.client.put("/services", json={"services": {"big": body}})
    assert response.status_code == 200, response.text
    with api.client.stream("GET", "/services/big/logs") as stream:
        lines = stream.iter_lines()
        text = ""
        while "len=" not in text:
            text += json.loads(next(lines)).get("data", "")
    assert "len=100000\n" in text


def test_supervisor_shutdown_ends_every_service_group(tmp_path):
    gen = start_supervisor(tmp_path, ENV)
    sup = next(gen)
    api = Api(sup)
    try:
        a = api.put("a", api.body("sleep 300 & exec sleep 300")).json()
        b = api.put("b", api.body("trap '' TERM; sleep 300")).json()
        assert group_alive(a["pid"]) and group_alive(b["pid"])
        sup.process.send_signal(signal.SIGTERM)
        sup.process.wait(15)
        assert not group_alive(a["pid"]) and not group_alive(b["pid"])
    finally:
        for pid in api.pids:
            kill_group(pid)
        gen.close()


@pytest.mark.skipif(not IS_ROOT, reason="checks the privilege drop")
def test_a_service_cannot_signal_the_supervisor(api):
    body = api.body(f"kill -TERM {api.sup.process.pid} 2>&1; echo rc=$?; exec sleep 300")
    assert api.put("hostile", body).status_code == 200
    with api.client.stream("GET", "/services/hostile/logs") as response:
        lines = response.iter_lines()
        text = ""
        while "rc=" not in text:
            text += json.loads(next(lines)).get("data", "")
    assert "rc=1" in text and api.sup.process.poll() is None


# -- in-process units: the log ring, the restart policy, the quick-exit count --------------------------------------


def test_the_log_ring_keeps_the_newest_code_points_with_absolute_offsets():
    from flarebox_supervisor.servicelog import ServiceLog

    log = ServiceLog(max_chars=10)
    log.append("0123456")
    log.append("789abc")
    assert log.size == 13 and log.first == 3
    assert log.read(0, 100) == "3456789abc"  # an offset before the first kept starts at the first kept
    assert log.read(5, 3) == "567" and log.read(9, 100) == "9abc" and log.read(13, 100) == ""
    log.append("x" * 25)  # one append longer than the ring
    assert log.size == 38 and log.first == 28 and log.read(0, 100) == "x" * 10
    many = ServiceLog(max_chars=10)
    for i in range(5000):
        many.append(chr(ord("a") + i % 26))
    assert many.first == 4990 and many.read(0, 100) == "".join(chr(ord("a") + i % 26) for i in range(4990, 5000))
    assert len(many._chunks) < 2100  # dropped chunks are compacted away


def test_supervisor_notes_start_on_a_line_of_their_own():
    from flarebox_supervisor.servicelog import ServiceLog

    log = ServiceLog(max_chars=1000)
    log.append("partial")
    log.note("exited with code 1")
    log.note("failed")
    assert log.read(0, 1000) == "partial\n[flarebox] exited with code 1\n[flarebox] failed\n"


async def test_following_a_ring_from_a_dropped_offset_starts_at_the_first_kept():
    from flarebox_supervisor.servicelog import ServiceLog
    from flarebox_supervisor.stream import follow

    log = ServiceLog(max_chars=10)
    log.append("a" * 15 + "b" * 10)
    log.finish({"type": "service", "state": "failed", "restarts": 0, "last_exit": None})
    events = [json.loads(line) for chunk in [c async for c in follow(log, 3, 1)] for line in chunk.splitlines()]
    assert events[0] == {"type": "output", "data": "b" * 10, "offset": 15}
    assert events[-1]["type"] == "service"


def test_backoff_doubles_from_the_first_delay_up_to_the_cap():
    from flarebox_supervisor.services import after_exit, restart_delay
    from flarebox_supervisor.settings import Settings

    settings = Settings()
    assert [restart_delay(n, settings) for n in range(0, 5)] == [0.5, 0.5, 1, 2, 4]
    assert restart_delay(8, settings) == 30 and restart_delay(20, settings) == limits.SERVICE_BACKOFF_MAX_SECONDS
    assert after_exit("always", False, 1, settings) == "restart"
    assert after_exit("always", True, 4, settings) == "restart"
    assert after_exit("always", False, 5, settings) == "failed"
    assert after_exit("on-failure", True, 5, settings) == "failed"
    assert after_exit("on-failure", False, 1, settings) == "stopped"
    assert after_exit("never", True, 1, settings) == "failed"
    assert after_exit("never", False, 1, settings) == "stopped"


async def test_a_long_run_resets_the_quick_exit_count(tmp_path):
    from flarebox_supervisor.identity import resolve_identity
    from flarebox_supervisor.services import Services
    from flarebox_supervisor.settings import Settings
    from protocol.services import SupervisedService

    settings = Settings(
        workdir=str(tmp_path),
        service_quick_exit_seconds=0.2,
        service_backoff_first_seconds=0.01,
        service_max_quick_exits=2,
    )
    identity = resolve_identity("nobody")
    services = Services(settings, identity)
    cwd = "/"
    try:
        # each run outlasts the quick-exit threshold: never two quick exits in a row, so it keeps restarting
        await services.put("slow", SupervisedService("sleep 0.3; exit 1", free_port(), cwd, {}, None, "on-failure"))
        deadline = time.monotonic() + 10
        while services.get("slow").restarts < 3:
            assert time.monotonic() < deadline
            assert services.get("slow").state != "failed"
            await asyncio.sleep(0.02)
        text = services.get("slow").log.read(0, 100_000)
        assert text.count("restarting in 0.01 s") >= 3 and "0.02 s" not in text  # the delay reset too
        await services.put("quick", SupervisedService("exit 1", free_port(), cwd, {}, None, "on-failure"))
        deadline = time.monotonic() + 5
        while services.get("quick").state != "failed":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert services.get("quick").restarts == 1
    finally:
        await services.stop_all()


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n", 302),  # not followed: ready
        (b"HTTP/1.0 200\r\n\r\nno reason phrase, no length", 200),
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", 503),
        (b"SSH-2.0-OpenSSH_9.6\r\n", None),  # something listens, but it is not HTTP
        (b"HTTP/1.1 200 OK\r\nX-Filler: " + b"y" * 70_000 + b"\r\n\r\n", None),  # a head that never ends in time
    ],
)
async def test_a_health_probe_reads_only_the_answers_status(answer, status):
    from flarebox_supervisor.services import _probe_status

    asked = []

    async def answer_once(reader, writer):
        asked.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await asyncio.wait_for(_probe_status(port, "/healthz"), 5) == status
    finally:
        server.close()
    assert asked == [f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()]


async def test_a_probe_cancelled_as_its_connect_fails_still_ends(monkeypatch):
    """Python 3.11's asyncio.wait_for hands back the inner result when a cancel lands in the step it arrives: a
    probe of a port nobody listens on then outlived its run, and a shutdown waiting for it never ended."""
    from flarebox_supervisor.identity import resolve_identity
    from flarebox_supervisor.servicelog import ServiceLog
    from flarebox_supervisor.services import Service, Services
    from flarebox_supervisor.settings import Settings
    from protocol.services import SupervisedService

    services = Services(Settings(), resolve_identity("nobody"))
    service = Service("web", SupervisedService("true", free_port(), "/", {}, None, "never"), services, ServiceLog(1000))
    probe: asyncio.Task | None = None
    attempts = 0

    async def refused(host, port):
        nonlocal attempts
        attempts += 1
        asyncio.get_running_loop().call_soon(probe.cancel)  # the cancel comes in the step the refusal arrives
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(asyncio, "open_connection", refused)
    probe = asyncio.get_running_loop().create_task(service._probe())
    done, _ = await asyncio.wait({probe}, timeout=2)
    assert probe in done and probe.cancelled(), f"the probe lived on after {attempts} attempts"
    assert attempts == 1 and service.state == "starting"
