"""The `flarebox` CLI in a real terminal (tmux): Ctrl-C, cp's progress line, and the token banner."""

import json
import os
import re
import shutil

import pytest
from cli_helpers import HAVE_TMUX, Terminal, client_env, flarebox_line, run
from e2e import free_port, wait_until

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap"),
    pytest.mark.skipif(not HAVE_TMUX, reason="needs tmux (scripts/setup.sh dev installs it)"),
]


@pytest.fixture
def terminal(server, tmp_path):
    term = Terminal(client_env(server), tmp_path)
    try:
        yield term
    finally:
        term.close()


def test_ctrl_c_in_a_terminal_cancels_the_command_and_exits_130(server, terminal, tmp_path):
    terminal.type(flarebox_line("exec", "ttycancel", "--", "echo begun; sleep 60; echo never") + '; echo "rc=$?"')
    terminal.wait_for("begun")  # the output line, not the typed command
    terminal.key("C-c")
    screen = terminal.wait_for(r"rc=\d+", timeout=30)
    assert "rc=130" in screen.splitlines() and "never" not in screen.splitlines(), screen
    assert "cancelling" in screen
    status = run(client_env(server), "status", "ttycancel")
    wait_until(
        lambda: json.loads(run(client_env(server), "status", "ttycancel").stdout)["busy"] is False,
        15,
        what="busy=false",
    )
    assert status.returncode == 0


def test_cp_shows_progress_for_a_large_file_on_a_terminal(server, terminal, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(5 * 1024 * 1024))
    small = tmp_path / "small.txt"
    small.write_text("tiny\n")
    terminal.type(flarebox_line("cp", str(big), "ttycp:/workspace/big.bin") + '; echo "up=$?"')
    screen = terminal.wait_for(r"up=\d+", timeout=60)
    assert "up=0" in screen, screen
    assert re.search(r"big\.bin  5\.0 MiB / 5\.0 MiB  100%", screen), screen
    terminal.type(flarebox_line("cp", "ttycp:/workspace/big.bin", str(tmp_path / "back.bin")) + '; echo "down=$?"')
    screen = terminal.wait_for(r"down=\d+", timeout=60)
    assert "down=0" in screen and screen.count("5.0 MiB / 5.0 MiB  100%") == 2, screen
    assert (tmp_path / "back.bin").read_bytes() == big.read_bytes()
    terminal.type(flarebox_line("cp", str(small), "ttycp:/workspace/small.txt") + '; echo "tiny=$?"')
    screen = terminal.wait_for(r"tiny=\d+", timeout=60)
    assert "tiny=0" in screen.splitlines()
    assert not re.search(r"^small\.txt  \d", screen, re.MULTILINE)  # under 1 MiB: no progress line


def test_a_generated_token_is_shown_on_a_terminal_and_never_in_a_redirected_log(tmp_path, start_server):
    # redirected (ServerProcess writes the server's output to a log file): where it is stored, not the token
    logged = start_server(token=None)
    token = (logged.data_dir / "token").read_text().strip()
    wait_until(lambda: "Listening on" in logged.output(), 15, what="the banner")
    assert token not in logged.output()
    assert f"stored it in {logged.data_dir / 'token'}" in logged.output() and "not a terminal" in logged.output()
    # on a terminal: shown, once
    data_dir, port = tmp_path / "tty-data", free_port()
    env = {k: v for k, v in os.environ.items() if k != "SANDBOX_API_TOKEN"}
    term = Terminal(env, tmp_path)
    try:
        term.type(flarebox_line("serve", "--port", str(port), "--data-dir", str(data_dir)) + '; echo "served=$?"')
        screen = term.wait_for(r"Listening on .*", timeout=60)
        shown = (data_dir / "token").read_text().strip()
        assert shown in screen and "shown only this once" in screen
        term.key("C-c")
        assert "served=0" in term.wait_for(r"served=\d+", timeout=30).splitlines()
    finally:
        term.close()
