"""A fork bomb and a memory hog in one workspace are held by its cgroup limits (lite: 128 pids, 256 MiB), and neither
takes the server or the other workspaces down. Needs cgroups (root); skipped with the reason otherwise."""

import json
import sys
import threading
from pathlib import Path

import httpx
import pytest
from e2e import rid, run_ok, sandbox_pids, terminal, ws_url

from standalone.cgroups import Cgroups

pytestmark = pytest.mark.timeout(150)

FORK_BOMB = "bomb() { bomb | bomb & }; bomb; sleep 60"
# grows by 16 MiB steps (so the kernel sees a steady climb) far beyond 256 MiB
MEMORY_HOG = f'{sys.executable} -c "x = []\nwhile True: x.append(bytearray(16 << 20))"'


def _probe_neighbours(srv, stop: threading.Event, results: list) -> None:
    """While the hostile command runs: health and a command in a calm workspace, over and over."""
    with srv.client() as client:
        while not stop.is_set():
            health = client.get("/v1/health", timeout=30).status_code
            out, _ = run_ok(client, "lim", "calm", "echo alive")
            results.append((health, out))


def _run_hostile(srv, workspace: str, command: str, timeout: float) -> tuple[dict, list]:
    stop, results = threading.Event(), []
    prober = threading.Thread(target=_probe_neighbours, args=(srv, stop, results))
    prober.start()
    try:
        body = {"request_id": rid(), "command": command, "timeout": timeout}
        with srv.client() as client, client.stream("POST", ws_url("lim", workspace, "exec"), json=body) as response:
            assert response.status_code == 200
            events = [json.loads(line) for line in response.iter_lines() if line.strip()]
    finally:
        stop.set()
        prober.join(60)
    return terminal(events), results


@pytest.fixture(scope="module")
def workspaces(limited_server):
    with limited_server.client() as client:
        for name in ("calm", "bomb", "hog"):
            assert client.put(ws_url("lim", name), json={"instance": "lite"}).status_code == 201
            run_ok(client, "lim", name, "true")
    return limited_server


def _cgroup_counter(srv, workspace: str, controller: str, filename: str, key: str) -> int:
    """A counter of the workspace's own cgroup (found through its bwrap process), v1 or v2."""
    pid = sandbox_pids(srv, workspace)[0]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") or (controllers == "" and Cgroups.detect()[0].version == 2):
            base = Path("/sys/fs/cgroup") / (controller if controllers else "") / path.lstrip("/")
            if (base / filename).exists():
                counters = dict(row.split() for row in (base / filename).read_text().splitlines())
                return int(counters[key])
    raise AssertionError(f"no {controller} cgroup with {filename} for {workspace}")


def _assert_neighbours_fine(results: list) -> None:
    assert results, "the calm workspace was never probed"
    assert all(result == (200, "alive\n") for result in results), results


def test_fork_bomb_is_bounded_by_the_pids_limit(workspaces):
    srv = workspaces
    end, results = _run_hostile(srv, "bomb", FORK_BOMB, timeout=8)
    assert end["type"] == "exit" and end["reason"] == "timeout" and end["exit_code"] == 124, end
    _assert_neighbours_fine(results)
    # the limit really was hit: forks were refused by the pids controller
    assert _cgroup_counter(srv, "bomb", "pids", "pids.events", "max") > 0
    with srv.client() as client:
        # the bomb's leftovers (background jobs survive the command) are capped: never more than the pids limit
        out, _ = run_ok(client, "lim", "bomb", "ls -d /proc/[0-9]* | wc -l")
        assert int(out) <= 128
        # the workspace itself is still usable once it is stopped and started again
        assert client.post(ws_url("lim", "bomb", "stop")).status_code == 200
        assert run_ok(client, "lim", "bomb", "echo recovered")[0] == "recovered\n"


def test_memory_hog_is_killed_by_the_memory_limit(workspaces):
    srv = workspaces
    end, results = _run_hostile(srv, "hog", MEMORY_HOG, timeout=60)
    # the kernel's OOM killer ends the hog with SIGKILL (128 + 9) long before the timeout
    assert end["type"] == "exit" and end["reason"] == "signal" and end["exit_code"] == 137, end
    _assert_neighbours_fine(results)
    v1 = Cgroups.detect()[0].version == 1
    assert _cgroup_counter(srv, "hog", "memory", "memory.oom_control" if v1 else "memory.events", "oom_kill") > 0
    with srv.client() as client:
        assert run_ok(client, "lim", "hog", "echo still here")[0] == "still here\n"  # the supervisor survived
    assert httpx.get(srv.url + "/v1/health", headers=srv.headers()).status_code == 200
