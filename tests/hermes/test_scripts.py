"""scripts/check_hermes_contract.py against both real Hermes venvs; scripts/smoke.py --live against flarebox serve."""

import os
import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.timeout(180)

CONTRACT = REPO / "scripts" / "check_hermes_contract.py"


def site_packages(python):
    return next((python.parent.parent / "lib").glob("python3*/site-packages"))


def test_contract_check_passes_on_a_hermes_with_provider_plugins(hermes_iot):
    done = subprocess.run(
        [str(hermes_iot), str(CONTRACT), "--hermes-source", str(site_packages(hermes_iot))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "RESULT PASS" in done.stdout and "FAIL" not in done.stdout
    assert "PASS  process handle has no pid" in done.stdout


def test_contract_check_fails_clearly_on_hermes_019(hermes_019):
    done = subprocess.run([str(hermes_019), str(CONTRACT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "agent.terminal_env_provider" in done.stdout and "v0.20.6" in done.stdout


def test_smoke_live_passes_against_the_standalone_runtime(server):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_CF_")}
    env.update(HERMES_CF_ENDPOINT=server.url, HERMES_CF_TOKEN=server.token)
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "smoke.py"), "--live"],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "RESULT PASS" in done.stdout
    assert "ok   container: restored" in done.stdout
    assert server.token not in done.stdout + done.stderr


def test_smoke_without_live_does_nothing():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "smoke.py")], capture_output=True, text=True)
    assert done.returncode == 2 and "--live" in done.stdout
