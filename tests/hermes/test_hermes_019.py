"""hermes-agent 0.19.0 (newest PyPI release, no provider plugins): register() declines with one clear line, and
the environment works at the BaseEnvironment level, with Hermes 0.19's own file and terminal tools on top."""

import subprocess

import pytest

pytestmark = [pytest.mark.timeout(300)]


def test_base_environment_on_hermes_019(old_hermes):
    done = subprocess.run(
        old_hermes.command("base_019"),
        env=old_hermes.env(),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=old_hermes.home.parent,
    )
    from .conftest import parse_result

    r = parse_result(done.stdout, done.stderr)
    assert "needs Hermes Agent v0.20.6 (tag v2026.8.27) or later" in done.stdout + done.stderr
    assert r["snapshot_ready"] is True
    assert r["cd"] == {"output": "/workspace/d\n", "returncode": 0}
    assert r["persist"]["output"] == "/workspace/d\nV=1\n"
    assert r["exit"]["returncode"] == 5
    assert r["stdin"]["output"] == "héllo 🙂\n" * 3
    assert r["big_stdin"]["output"] == "900001\n"  # over the inline limit: staged through PUT /files
    assert r["timeout"]["returncode"] == 124
    assert r["write_tool"].get("error") is None and r["write_tool"]["bytes_written"] == 16
    assert r["read_tool"]["content"].startswith("1|hello from 0.19")
    assert r["terminal_tool"]["output"] == "hello from 0.19"
    # the per-call execute_code path (RPC poller running commands while the script runs) does not deadlock
    assert r["execute_code"]["status"] == "success" and r["execute_code"]["tool_calls_made"] == 1
    assert r["execute_code"]["output"] == "INNER via-rpc\n"
    assert r["execute_code_seconds"] < 60
    assert {k: v["output"] for k, v in r["concurrent"].items()} == {str(i): f"c{i}\n" for i in range(4)}
    assert r["concurrent_seconds"] < 20  # four 1 s commands ran side by side, not one after another
    name, is_runtime_error, message, hint = r["dead"]
    assert name == "EnvironmentConnectionError" and is_runtime_error
    assert "cannot reach the Flarebox server" in message and "Flarebox" in hint
