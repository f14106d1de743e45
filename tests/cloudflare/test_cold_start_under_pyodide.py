"""The Worker's cold start loads only what its requests need: importing src/entry.py in a fresh Pyodide (booted as
the harness boots it: tests/cloudflare/cold_start.mjs) and answering the Worker's first requests loads none of the
Durable Objects' code — the workspace and directory hosts and what is behind them (containers, sockets to the
supervisor, streams, backups, ciphers, alarms, the workspace's state machine, the directory's store). Those are
imported when an object is constructed. A behaviour test: which modules load, never how long it takes (that is
bench/bench_worker.py)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "node_modules" / ".bin" / "node"
PROBE = Path(__file__).with_name("cold_start.mjs")

# Only a Durable Object needs these; none may creep back into the Worker's cold start.
OBJECT_ONLY = (
    "cloudflare.host",
    "cloudflare.directory_host",
    "cloudflare.container",
    "cloudflare.streams",
    "cloudflare.backups",
    "cloudflare.cipher",
    "cloudflare.alarm",
    "cloudflare.clock",
    "cloudflare.storage",
    "durable.workspace",
    "durable.supervisor_client",
    "durable.services",
    "durable.relay",
    "durable.terminal",
    "durable.boot",
    "durable.store",
    "durable.state",
    "durable.backups",
    "durable.schedule",
    "directory.directory",
    "directory.store",
)

# Standard-library modules no request of the Worker needs (calendar: only parsing a timestamp, durable/timefmt.py).
STDLIB_UNNEEDED = ("calendar",)


@pytest.fixture(scope="module")
def cold_start() -> dict:
    if not NODE.exists():
        pytest.fail("node_modules is missing: run `scripts/setup.sh dev` (npm ci)")
    subprocess.run([str(REPO / "scripts" / "vendor_workers_sdk.sh")], check=True, cwd=REPO)
    proc = subprocess.run(
        [str(NODE), "--no-warnings", str(PROBE), "entry", "requests"],
        cwd=REPO,
        env={**os.environ, "HARNESS_ROOT": str(REPO)},
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_named_modules_exist():
    # a renamed module would make the check below pass for nothing
    for name in OBJECT_ONLY:
        assert (REPO / "src" / (name.replace(".", "/") + ".py")).is_file(), name


def test_the_entry_loads_the_worker_side(cold_start):
    loaded = set(cold_start["loaded"])
    assert {"entry", "workers", "worker.edge", "cloudflare.worker_side"} <= loaded


def test_the_worker_answers_its_first_requests(cold_start):
    assert cold_start["statuses"] == [200, 200, 200, 200]


def test_the_cold_start_loads_no_object_code(cold_start):
    assert sorted(set(cold_start["loaded"]) & set(OBJECT_ONLY)) == []
    assert sorted(set(cold_start["loaded"]) & set(STDLIB_UNNEEDED)) == []


def test_the_first_requests_load_no_object_code(cold_start):
    assert sorted(set(cold_start["request_loaded"]) & set(OBJECT_ONLY)) == []
