"""`flarebox shell` in a real terminal (tmux): the remote prompt, a command, window resizes, the remote exit code as
its own, the local terminal restored, and a dropped connection resumed on the same session."""

import shutil

import pytest
from cli_helpers import HAVE_TMUX, CuttableProxy, Terminal, clean_env, client_env, flarebox_line

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


def test_a_shell_runs_commands_follows_resizes_and_exits_with_the_remote_code(terminal):
    terminal.type("SAVED=$(stty -g)")
    terminal.type(
        flarebox_line("shell", "ttyshell")
        + '; echo "rc=$?"; [ "$(stty -g)" = "$SAVED" ] && echo restored || echo "not restored"'
    )
    terminal.type("echo remote-$((6*7)) $(id -un)")
    terminal.wait_for(r"remote-42 sandbox", timeout=60)
    terminal.type("stty size")
    terminal.wait_for(r"50 200")  # the tmux window's size, given when the session opened
    terminal.resize(120, 40)
    terminal.type("stty size")
    terminal.wait_for(r"40 120")  # SIGWINCH → a resize frame → the remote tty
    terminal.type("exit 3")
    screen = terminal.wait_for(r"(not )?restored", timeout=30)  # printed after rc=: the local terminal's settings
    assert "rc=3" in screen.splitlines() and "restored" in screen.splitlines(), screen


def test_ctrl_c_goes_to_the_remote_command_not_to_the_shell_command(terminal):
    terminal.type(flarebox_line("shell", "ttyshell") + '; echo "rc=$?"')
    terminal.type("sleep 100; echo slept")
    terminal.wait_for(r"\S*\$ sleep 100; echo slept", timeout=60)
    terminal.key("C-c")
    terminal.type('echo "interrupted=$?"')
    screen = terminal.wait_for(r"interrupted=\d+")
    assert "interrupted=130" in screen.splitlines() and "slept" not in screen.splitlines(), screen
    terminal.type("exit 0")
    assert "rc=0" in terminal.wait_for(r"rc=\d+", timeout=30).splitlines()


def test_a_dropped_connection_says_so_and_resumes_the_same_session(server, tmp_path):
    proxy = CuttableProxy(server.port)
    term = Terminal(clean_env(FLAREBOX_ENDPOINT=proxy.url, FLAREBOX_TOKEN=server.token), tmp_path)
    try:
        term.type(flarebox_line("shell", "ttyshell") + '; echo "rc=$?"')
        term.type("KEPT=yes-$((3*3))")
        term.type("echo ready")
        term.wait_for("ready", timeout=60)
        proxy.cut()
        term.wait_for(r"\[flarebox\] connection lost; reconnecting to session [0-9a-f]{32}…", timeout=30)
        term.wait_for(r"\[flarebox\] reconnected", timeout=30)
        term.type("echo $KEPT")
        screen = term.wait_for("yes-9")  # the same shell, so the same variables
        # the resume asked for the output from where this terminal was: nothing shown before the drop comes twice
        assert screen.splitlines().count("ready") == 1, screen
        term.type("exit 5")
        assert "rc=5" in term.wait_for(r"rc=\d+", timeout=30).splitlines()
    finally:
        term.close()
        proxy.close()
