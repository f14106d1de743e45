"""Runs the real src/entry.py under Pyodide behind tests/cloudflare/harness.mjs (see its header for what is real).

One harness per test module: Pyodide takes a few seconds to boot.
"""

import base64
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "node_modules" / ".bin" / "node"
HARNESS = Path(__file__).with_name("harness.mjs")
READY_SECONDS = 90


class Harness:
    def __init__(self, base: str, token: str, vars_: dict[str, str], state: str):
        self.base = base
        self.token = token
        self.vars = vars_
        self.state = Path(state)  # the harness's scratch directory: objects' SQLite under do/<binding>/
        self.admin = httpx.Client(base_url=base, timeout=120)

    def client(self, token: str | None = None, timeout: float = 120) -> httpx.Client:
        tok = self.token if token is None else token
        headers = {"authorization": f"Bearer {tok}"} if tok else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=timeout)

    def calls(self, object_name: str | None = None, api: str | None = None) -> list[dict]:
        calls = self.admin.get("/__harness/calls").json()
        return [
            c for c in calls if (object_name is None or c["object"] == object_name) and (api is None or c["api"] == api)
        ]

    def knobs(self, **values) -> dict:
        return self.admin.post("/__harness/knobs", content=json.dumps(values)).json()

    def advance(self, seconds: float) -> dict:
        """Move the runtime's clock forward and deliver the alarms that became due."""
        return self.admin.post("/__harness/advance", params={"ms": int(seconds * 1000)}).json()

    def crash(self, object_name: str) -> None:
        self.admin.post("/__harness/crash", params={"object": object_name}).raise_for_status()

    def orphan(self, object_name: str) -> None:
        """Start a container behind the object's back."""
        self.admin.post("/__harness/orphan", params={"object": object_name}).raise_for_status()

    def evict(self, object_name: str, binding: str = "WORKSPACE") -> None:
        """Drop the object's Python instance (the next call constructs a fresh one); binding="DIRECTORY" for the
        directory object."""
        self.admin.post("/__harness/evict", params={"object": object_name, "binding": binding}).raise_for_status()

    def container(self, object_name: str) -> dict:
        return self.admin.get("/__harness/container", params={"object": object_name}).json()

    def freeze(self, object_name: str) -> None:
        """Stop every process of the object's container (SIGSTOP): it accepts connections and answers nothing."""
        self.admin.post("/__harness/freeze", params={"object": object_name}).raise_for_status()

    def thaw(self, object_name: str) -> None:
        self.admin.post("/__harness/thaw", params={"object": object_name}).raise_for_status()

    def deploy(self, grace_seconds: float | None = None) -> dict:
        """A new version of the Worker: every object instance running now is reset `grace_seconds` later (the
        harness's DEPLOY_GRACE_MS, 30 s, by default), cutting the requests it still has in flight."""
        params = {} if grace_seconds is None else {"graceMs": int(grace_seconds * 1000)}
        return self.admin.post("/__harness/deploy", params=params).json()

    def platform(self) -> dict:
        """The platform rules the harness keeps (its constants): start() options, alarm retries, lifetimes, …"""
        return self.admin.get("/__harness/platform").json()

    def cipher(self, op: str, key: str, data: bytes, aad: bytes) -> dict:
        """cloudflare.cipher.WebCryptoCipher(key).seal/open(data, aad) under Pyodide: {"available", "data" (bytes)
        or "error"}."""
        body = {"op": op, "key": key, "data": base64.b64encode(data).decode(), "aad": base64.b64encode(aad).decode()}
        answer = self.admin.post("/__harness/cipher", content=json.dumps(body)).json()
        if "data" in answer:
            answer["data"] = base64.b64decode(answer["data"])
        return answer

    def object_db(self, object_name: str, binding: str = "WORKSPACE") -> Path:
        """The SQLite file of an object's ctx.storage (the harness names it by the sha256 of the object's name)."""
        return self.state / "do" / binding.lower() / (hashlib.sha256(object_name.encode()).hexdigest() + ".sqlite")


def _vendor_sdk() -> None:
    subprocess.run([str(REPO / "scripts" / "vendor_workers_sdk.sh")], check=True, cwd=REPO)


@pytest.fixture(scope="module")
def harness_vars() -> dict[str, str]:
    """Extra Worker vars for this module's harness; a test module overrides this fixture to set its own."""
    return {}


@pytest.fixture(scope="module")
def harness(harness_vars):
    if not NODE.exists():
        pytest.fail("node_modules is missing: run `scripts/setup.sh dev` (npm ci)")
    _vendor_sdk()
    token = secrets.token_urlsafe(32)
    vars_ = {
        "SANDBOX_API_TOKEN": token,
        "IDLE_SECONDS": "600",
        "ENABLE_INTERNET": "true",
        "ALLOWED_INSTANCE_TYPES": "lite,standard-1",
        "DEFAULT_INSTANCE_TYPE": "standard-1",
        "SNAPSHOT_INTERVAL_SECONDS": "0",
        **harness_vars,
    }
    # Short path: the supervisor's unix socket lives under it (sun_path is 108 bytes).
    state = tempfile.mkdtemp(prefix="cfh-", dir="/tmp")  # noqa: S108
    env = {
        **os.environ,
        "HARNESS_ROOT": str(REPO),
        "HARNESS_STATE": state,
        "HARNESS_VARS": json.dumps(vars_),
        "HARNESS_PYTHON": sys.executable,
        # the sandbox's /tmp is its own: a checkout or virtualenv living under /tmp is bound in explicitly
        "HARNESS_BINDS": json.dumps(sorted({str(REPO), sys.prefix, sys.base_prefix})),
        "HARNESS_PORT": "0",
    }
    proc = subprocess.Popen(
        [str(NODE), "--no-warnings", str(HARNESS)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=None,  # the runtime's and the Python code's logs show up in pytest's captured output
        text=True,
    )
    try:
        port = _wait_ready(proc)
        # keep draining stdout so the harness never blocks on a full pipe
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        yield Harness(f"http://127.0.0.1:{port}", token, vars_, state)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the harness destroys its containers, then exits
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(state, ignore_errors=True)


def _wait_ready(proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + READY_SECONDS
    result: list[int] = []

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("HARNESS READY "):
                result.append(int(line.split()[2]))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    if not result:
        raise RuntimeError(f"the harness did not start (exit code {proc.poll()})")
    return result[0]
