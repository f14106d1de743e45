"""The `flarebox` CLI as a user runs it: a real subprocess against a real server."""

import json
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest
from cli_helpers import CONNECTION_VARS, CuttableProxy, clean_env, client_env, run
from e2e import flarebox_command, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]


def hermes_env(server, **extra: str) -> dict[str, str]:
    """Aimed at `server` with the HERMES_CF_* names (and no FLAREBOX_* variable of the developer's own)."""
    env = {k: v for k, v in server.client_env().items() if not k.startswith(CONNECTION_VARS[:3])}
    return dict(env, **extra)


def flarebox(server, *args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        flarebox_command() + list(args),
        env=hermes_env(server),
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
    assert "container:" not in again.stderr and "created" not in again.stderr  # the usual case is not news
    verbose = flarebox(server, "exec", "clirun", "-v", "--", "true")
    assert verbose.returncode == 0 and "container: continuing" in verbose.stderr
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
    env = hermes_env(server, HERMES_CF_TOKEN="w" * 48)
    denied = subprocess.run(flarebox_command() + ["status", "life"], env=env, capture_output=True, text=True)
    assert denied.returncode == 1 and "unauthorized" in denied.stderr and "w" * 48 not in denied.stderr
    denied = subprocess.run(flarebox_command() + ["exec", "life", "--", "true"], env=env, capture_output=True)
    assert denied.returncode == 125 and b"unauthorized" in denied.stderr


def test_ctrl_c_cancels_the_command_on_the_server(server):
    proc = subprocess.Popen(
        flarebox_command() + ["exec", "clicancel", "--", "echo begun; sleep 60; echo never"],
        env=hermes_env(server),
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
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "hermes" / "plugins" / "cloudflare-sandbox" / "plugin.yaml").is_file()


def test_a_closed_stdout_cancels_the_command_and_exits_like_sigpipe(server):
    script = " ".join(flarebox_command()) + " exec clipipe -- 'yes' | head -n 1; echo \"rc=${PIPESTATUS[0]}\""
    result = subprocess.run(["bash", "-c", script], env=hermes_env(server), capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines() == ["y", "rc=141"], result
    assert "Traceback" not in result.stderr
    wait_until(lambda: json.loads(flarebox(server, "status", "clipipe").stdout)["busy"] is False, 15, what="busy=false")


def test_a_remote_endpoint_never_gets_the_local_token(server):
    env = hermes_env(server, FLAREBOX_DATA_DIR=str(server.data_dir))
    del env["HERMES_CF_TOKEN"]
    refused = subprocess.run(flarebox_command() + ["status", "x"], env=env, capture_output=True, text=True)
    assert refused.returncode == 125 and f"no token for {server.url}" in refused.stderr
    assert "--token-file" in refused.stderr and server.token not in refused.stderr


# --- choosing the server: flags, FLAREBOX_*, HERMES_CF_*, the local server --------------------------------------


def test_endpoint_and_token_file_flags_before_or_after_the_subcommand(server, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(server.token + "\n")
    env = clean_env()  # nothing in the environment: the flags alone choose the server
    tf = str(token_file)
    for args in (
        ["--endpoint", server.url, "--token-file", tf, "exec", "cliflags", "--", "echo one"],
        ["exec", "--endpoint", server.url, "--token-file", tf, "cliflags", "--", "echo two"],
        ["-n", "default", "exec", "cliflags", "--endpoint", server.url, "--token-file", tf, "--", "echo 3"],
    ):
        done = run(env, *args)
        assert done.returncode == 0, (args, done.stderr)
        assert done.stdout.strip() in ("one", "two", "3")
    status = run(env, "status", "--endpoint", server.url, "--token-file", str(token_file), "cliflags")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "running"
    missing = run(env, "--endpoint", server.url, "--token-file", str(tmp_path / "nope"), "status", "cliflags")
    assert missing.returncode == 125 and "nope" in missing.stderr


def test_precedence_flag_over_flarebox_over_hermes_variables(server, tmp_path):
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    # FLAREBOX_* beats HERMES_CF_*
    env = clean_env(
        FLAREBOX_ENDPOINT=server.url, FLAREBOX_TOKEN=server.token, HERMES_CF_ENDPOINT=dead, HERMES_CF_TOKEN="h" * 48
    )
    assert run(env, "exec", "cliprec", "--", "true").returncode == 0
    # the HERMES_CF_* names alone keep working
    env = clean_env(HERMES_CF_ENDPOINT=server.url, HERMES_CF_TOKEN=server.token)
    assert run(env, "status", "cliprec").returncode == 0
    # --endpoint beats both; a token set next to another endpoint is not sent to it
    env = clean_env(FLAREBOX_ENDPOINT=dead, FLAREBOX_TOKEN=server.token)
    refused = run(env, "--endpoint", server.url, "status", "cliprec")
    assert refused.returncode == 125 and f"no token for {server.url}" in refused.stderr
    token_file = tmp_path / "token"
    token_file.write_text(server.token)
    assert run(env, "--endpoint", server.url, "--token-file", str(token_file), "status", "cliprec").returncode == 0
    # a token set without an endpoint goes to whichever endpoint is used
    env = clean_env(FLAREBOX_TOKEN=server.token)
    assert run(env, "--endpoint", server.url, "status", "cliprec").returncode == 0


def test_an_unreachable_server_is_named_and_exits_125(tmp_path):
    dead = "http://127.0.0.1:9"
    env = clean_env(FLAREBOX_ENDPOINT=dead, FLAREBOX_TOKEN="t" * 48)
    for args in (
        ["status", "x"],
        ["exec", "x", "--", "true"],
        ["cp", "x:/workspace/a", str(tmp_path / "a")],
        ["attach", "x", "0" * 32],
    ):
        done = run(env, *args)
        assert done.returncode == 125, (args, done.stderr)
        assert f"cannot reach {dead}" in done.stderr and "Traceback" not in done.stderr
    # configuration errors of flarebox's own are 125 too (not 1, not a Python traceback)
    bad = run(clean_env(FLAREBOX_ENDPOINT="http://example.com", FLAREBOX_TOKEN="t" * 48), "status", "x")
    assert bad.returncode == 125 and "FLAREBOX_ENDPOINT" in bad.stderr and "https" in bad.stderr
    usage = run(clean_env(), "exec")
    assert usage.returncode == 125
    no_local = run(clean_env(FLAREBOX_DATA_DIR=str(tmp_path / "empty")), "status", "x")
    assert no_local.returncode == 125 and "flarebox serve" in no_local.stderr


def test_binary_stdin_is_refused_clearly(server):
    done = run(
        client_env(server), "exec", "clistdin", "--stdin", "--", "wc -c", input=b"\xff\xfe\x00binary", text=False
    )
    assert done.returncode == 125
    assert b"stdin must be UTF-8 text (use flarebox cp to upload binary files)" in done.stderr
    assert b"Traceback" not in done.stderr
    text = run(client_env(server), "exec", "clistdin", "--stdin", "--", "wc -c", input="héllo\n")
    assert text.returncode == 0 and text.stdout.strip() == "7"


# --- a dropped stream, and attach ----------------------------------------------------------------------------------


def test_a_closed_proxy_leaves_nothing_listening_and_refuses_when_its_target_does():
    """The relay the drop tests use: a closed one must not take a later test's connection, and a refused upstream
    refuses the client rather than leaving it waiting (the CLI would report a timeout)."""
    dead = socket.create_server(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    proxy = CuttableProxy(dead_port)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
            assert client.recv(1) == b""  # closed at once, not held open
    finally:
        proxy.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10)


def test_a_dropped_stream_names_the_request_and_attach_follows_it_to_its_exit_code(server):
    proxy = CuttableProxy(server.port)
    try:
        proc = subprocess.Popen(
            flarebox_command() + ["exec", "cliattach", "--", "echo begun; sleep 3; echo done; exit 5"],
            env=clean_env(FLAREBOX_ENDPOINT=proxy.url, FLAREBOX_TOKEN=server.token),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline() == "begun\n"
            proxy.cut()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        proxy.close()
    assert proc.returncode == 125, err
    assert "the connection dropped; the command may still be running: flarebox attach cliattach " in err, err
    hint = re.search(r"flarebox attach cliattach ([0-9a-f]{32})(?: --offset (\d+))?$", err, re.MULTILINE)
    assert hint and hint.group(2) == "6", err  # "begun\n" was shown already
    request_id = hint.group(1)
    followed = run(client_env(server), "attach", "cliattach", request_id, timeout=60)
    assert followed.returncode == 5, followed.stderr
    assert followed.stdout == "begun\ndone\n"
    rest = run(client_env(server), "attach", "cliattach", request_id, "--offset", hint.group(2))
    assert rest.returncode == 5 and rest.stdout == "done\n"
    unknown = run(client_env(server), "attach", "cliattach", "f" * 32)
    assert unknown.returncode == 125 and "request_not_found" in unknown.stderr
