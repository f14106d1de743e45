"""The `flarebox` CLI as a user runs it: a real subprocess against a real server."""

import json
import shutil
import signal
import subprocess
import time

import pytest
from e2e import flarebox_command, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]


def flarebox(server, *args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        flarebox_command() + list(args),
        env=server.client_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def test_exec_passes_output_exit_code_and_progress(server):
    first = flarebox(server, "exec", "clirun", "--", "echo out; echo also-out >&2; exit 7")
    assert first.returncode == 7, first.stderr
    assert first.stdout == "out\nalso-out\n"  # the command's stdout and stderr, merged by the protocol
    assert "created workspace default/clirun" in first.stderr
    assert "container: fresh" in first.stderr and "starting" in first.stderr
    again = flarebox(server, "exec", "clirun", "--cwd", "/", "--", "pwd", ";", "ls", "-d", "/workspace")
    assert again.returncode == 0 and again.stdout == "/\n/workspace\n"
    assert "container: continuing" in again.stderr and "created" not in again.stderr
    timed_out = flarebox(server, "exec", "clirun", "--timeout", "1", "--", "sleep 30")
    assert timed_out.returncode == 124 and "timeout" in timed_out.stderr
    piped = flarebox(server, "exec", "clirun", "--stdin", "--", "tr a-z A-Z", input="shout\n")
    assert piped.returncode == 0 and piped.stdout == "SHOUT\n"


def test_status_snapshot_snapshots_stop_rm(server):
    assert flarebox(server, "exec", "-n", "clins", "life", "--", "echo v1 > /workspace/v").returncode == 0
    status = flarebox(server, "status", "-n", "clins", "life")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "running"
    snap = flarebox(server, "snapshot", "-n", "clins", "life")
    assert snap.returncode == 0, snap.stderr
    snap_id = json.loads(snap.stdout)["id"]
    listed = flarebox(server, "snapshots", "-n", "clins", "life")
    assert [s["id"] for s in json.loads(listed.stdout)] == [snap_id]
    stopped = flarebox(server, "stop", "-n", "clins", "life")
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["state"] == "stopped"
    back = flarebox(server, "exec", "-n", "clins", "life", "--", "cat /workspace/v")
    assert back.returncode == 0 and back.stdout == "v1\n"
    assert "restoring" in back.stderr and "container: restored" in back.stderr
    removed = flarebox(server, "rm", "-n", "clins", "life")
    assert removed.returncode == 0 and json.loads(removed.stdout) == {"deleted": True}
    gone = flarebox(server, "status", "-n", "clins", "life")
    assert gone.returncode == 1 and "workspace_not_found" in gone.stderr
    # a wrong token is reported by code, and never echoed
    env = dict(server.client_env(), HERMES_CF_TOKEN="w" * 48)
    denied = subprocess.run(flarebox_command() + ["status", "life"], env=env, capture_output=True, text=True)
    assert denied.returncode == 1 and "unauthorized" in denied.stderr and "w" * 48 not in denied.stderr
    denied = subprocess.run(flarebox_command() + ["exec", "life", "--", "true"], env=env, capture_output=True)
    assert denied.returncode == 125 and b"unauthorized" in denied.stderr


def test_ctrl_c_cancels_the_command_on_the_server(server):
    proc = subprocess.Popen(
        flarebox_command() + ["exec", "clicancel", "--", "echo begun; sleep 60; echo never"],
        env=server.client_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "begun\n"
        started_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "never" not in out and time.monotonic() - started_at < 30
    # the command is really gone on the server, not just the client
    wait_until(
        lambda: json.loads(flarebox(server, "status", "clicancel").stdout)["busy"] is False, 15, what="busy=false"
    )


def test_hermes_install_subcommand_installs_the_plugin(tmp_path):
    result = subprocess.run(
        flarebox_command() + ["hermes", "install", "--hermes-home", str(tmp_path / "hermes")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "hermes" / "plugins" / "cloudflare-sandbox" / "plugin.yaml").is_file()


def test_a_closed_stdout_cancels_the_command_and_exits_like_sigpipe(server):
    script = " ".join(flarebox_command()) + " exec clipipe -- 'yes' | head -n 1; echo \"rc=${PIPESTATUS[0]}\""
    result = subprocess.run(["bash", "-c", script], env=server.client_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.splitlines() == ["y", "rc=141"], result
    assert "Traceback" not in result.stderr
    wait_until(lambda: json.loads(flarebox(server, "status", "clipipe").stdout)["busy"] is False, 15, what="busy=false")


def test_a_remote_endpoint_never_gets_the_local_token(server):
    env = dict(server.client_env(), FLAREBOX_DATA_DIR=str(server.data_dir))
    del env["HERMES_CF_TOKEN"]
    refused = subprocess.run(flarebox_command() + ["status", "x"], env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "HERMES_CF_TOKEN" in refused.stderr
