"""`flarebox keys`, `flarebox ls` and `flarebox audit` as a user runs them (a real subprocess against a real server),
and a scoped key used as the CLI's token exactly as the deployment token is."""

import json
import re
import shutil
import time
import uuid

import pytest
from cli_helpers import HAVE_TMUX, Terminal, client_env, flarebox_line, run
from e2e import Made

from flarebox_hermes.client import ApiError

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

KEY_SHAPE = re.compile(r"fbk_([0-9a-f]{16})_[A-Za-z0-9_-]{32}")


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


class Tracker(Made):
    """The deployment token's client; every workspace and key a test makes is removed at its end."""

    def workspace(self, ns: str, ws: str, **config) -> None:
        self.client.put_workspace(ns, ws, {"persistent": True, **config})
        self.workspaces.append((ns, ws))

    def mint(self, *args: str) -> tuple[str, str]:
        """`flarebox keys create ARGS` with the deployment token → (secret, id)."""
        done = run(client_env(self.server), "keys", "create", *args)
        assert done.returncode == 0, done.stderr
        match = KEY_SHAPE.fullmatch(done.stdout.strip())
        assert match, done.stdout
        self.keys.append(match.group(1))
        return match.group(0), match.group(1)


@pytest.fixture
def admin(server):
    tracker = Tracker(server)
    try:
        yield tracker
    finally:
        tracker.close()


def key_env(server, key: str) -> dict[str, str]:
    return dict(client_env(server), FLAREBOX_TOKEN=key)


def rows(stdout: str) -> list[list[str]]:
    """A table's data rows, split on runs of two or more spaces (cells hold single spaces at most)."""
    lines = stdout.splitlines()
    return [re.split(r"\s{2,}", line.strip()) for line in lines[1:] if line.strip()]


# --- keys create / ls / rm ---------------------------------------------------------------------------------------


def test_keys_create_ls_rm_round_trip(server, admin):
    ns = unique("keys")
    env = client_env(server)
    created = run(
        env, "keys", "create", "-n", ns, "--workspace", "proj", "--scope", "exec", "-s", "files,snapshots",
        "--expires-in", "30d", "--label", "ci bot",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    match = KEY_SHAPE.fullmatch(secret)
    assert match and created.stdout == secret + "\n", created.stdout  # stdout is the secret alone
    key_id = match.group(1)
    admin.keys.append(key_id)
    assert f"created key {key_id} (ci bot) for {ns}/proj, scopes exec,files,snapshots" in created.stderr
    assert "only time" not in created.stderr  # the warning is for a terminal; a pipe gets the secret alone
    assert secret not in created.stderr

    listed = run(env, "keys", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert secret not in listed.stdout and secret[21:] not in listed.stdout  # the secret is never listed again
    (mine,) = [k for k in json.loads(listed.stdout) if k["id"] == key_id]
    assert mine["namespace"] == ns and mine["workspace"] == "proj" and mine["label"] == "ci bot"
    assert mine["scopes"] == ["exec", "files", "snapshots"] and mine["last_used_at"] is None
    created_at = time.mktime(time.strptime(mine["created_at"][:19], "%Y-%m-%dT%H:%M:%S"))
    expires_at = time.mktime(time.strptime(mine["expires_at"][:19], "%Y-%m-%dT%H:%M:%S"))
    assert abs(expires_at - created_at - 30 * 86400) <= 1  # 30d is 30 days

    table = run(env, "keys", "ls", "-n", ns)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:5] == ["ID", "LABEL", "NAMESPACE", "WORKSPACE", "SCOPES"]
    (row,) = rows(table.stdout)
    assert row[:5] == [key_id, "ci bot", ns, "proj", "exec,files,snapshots"]
    assert row[5] == mine["expires_at"][:19].replace("T", " ") and row[6] == "never"
    other = run(env, "keys", "ls", "-n", unique("none"))
    assert other.returncode == 0 and other.stdout == "" and "no keys" in other.stderr

    removed = run(env, "keys", "rm", key_id)
    assert removed.returncode == 0 and f"revoked key {key_id} (ci bot) for {ns}/proj" in removed.stderr
    after = run(env, "keys", "ls", "--json")
    assert key_id not in {k["id"] for k in json.loads(after.stdout)}
    again = run(env, "keys", "rm", key_id)
    assert again.returncode == 1 and "key_not_found" in again.stderr


@pytest.mark.skipif(not HAVE_TMUX, reason="needs tmux (scripts/setup.sh dev installs it)")
def test_keys_create_on_a_terminal_warns_that_the_secret_is_shown_once(server, admin, tmp_path):
    ns = unique("keyst")
    term = Terminal(client_env(server), tmp_path)
    try:
        term.type(flarebox_line("keys", "create", "-n", ns, "-s", "exec") + '; echo "rc=$?"')
        screen = term.wait_for(r"rc=\d+", timeout=60)
    finally:
        term.close()
    keys = KEY_SHAPE.findall(screen)
    admin.keys += keys
    assert "rc=0" in screen.splitlines() and len(keys) == 1, screen
    assert "this is the only time the secret is shown: store it now" in screen
    assert f"flarebox keys rm {keys[0]}" in screen


def test_keys_create_json_whole_namespace_and_usage_errors(server, admin):
    ns = unique("keysj")
    env = client_env(server)
    done = run(env, "keys", "create", "-n", ns, "-s", "exec", "--expires-in", "3600", "--json")
    assert done.returncode == 0, done.stderr
    key = json.loads(done.stdout)
    admin.keys.append(key["id"])
    assert KEY_SHAPE.fullmatch(key["key"]) and key["key"][4:20] == key["id"]
    assert key["workspace"] is None and key["scopes"] == ["exec"] and key["label"] == ""
    table = run(env, "keys", "ls", "-n", ns)
    assert rows(table.stdout)[0][1:4] == ["-", ns, "*"]  # no label; every workspace of the namespace

    # the CLI's own failures: 125, before anything reaches the server
    for args, says in [
        (["keys", "create", "-n", ns, "-s", "root"], "unknown scope 'root'"),
        (["keys", "create", "-n", ns], "at least one --scope"),
        (["keys", "create", "-s", "exec"], "needs --namespace"),
        (["keys", "create", "-n", ns, "-s", "exec", "--expires-in", "soon"], "--expires-in 'soon'"),
        (["keys", "rm", "not-a-key-id"], "16 lowercase hex"),
    ]:
        refused = run(env, *args)
        assert refused.returncode == 125 and says in refused.stderr, (args, refused.stderr)
    assert {k["id"] for k in admin.client.list_keys(ns)} == {key["id"]}  # none of them minted anything
    # the server's own refusal: its code and message, exit 1
    too_long = run(env, "keys", "create", "-n", ns, "-s", "exec", "--expires-in", "99999w")
    assert too_long.returncode == 1 and "invalid_field: expires_in" in too_long.stderr
    # only the deployment token manages keys: a key (even with manage) cannot mint, list or revoke
    secret, key_id = admin.mint("-n", ns, "-s", "exec,files,manage")
    as_key = key_env(server, secret)
    for args in (["keys", "create", "-n", ns, "-s", "exec"], ["keys", "ls"], ["keys", "rm", key_id]):
        refused = run(as_key, *args)
        assert refused.returncode == 1 and "forbidden: only the deployment token manages keys" in refused.stderr
        assert secret not in refused.stderr and f"scoped key {key_id}" in refused.stderr


# --- a key as the CLI's token --------------------------------------------------------------------------------------


def test_a_key_runs_exec_in_its_workspace_and_is_refused_clearly_elsewhere(server, admin, tmp_path):
    ns = unique("kexec")
    admin.workspace(ns, "mine")
    admin.workspace(ns, "theirs")
    secret, key_id = admin.mint("-n", ns, "-w", "mine", "-s", "exec", "-s", "files", "--label", "agent")
    env = key_env(server, secret)

    ran = run(env, "exec", "-n", ns, "mine", "--", "echo via-key; exit 3")
    assert ran.returncode == 3 and ran.stdout == "via-key\n", ran.stderr
    status = run(env, "status", "-n", ns, "mine")  # reading a workspace's status: any scope on it
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "running"
    local = tmp_path / "up.txt"
    local.write_text("uploaded by a key\n")
    assert run(env, "cp", "-n", ns, str(local), "mine:/workspace/up.txt").returncode == 0
    down = run(env, "cp", "-n", ns, "mine:/workspace/up.txt", "-")
    assert down.returncode == 0 and down.stdout == "uploaded by a key\n"

    # elsewhere: 403 forbidden, named, with the key's id (never its secret), the CLI's own failure for exec
    for workspace in ("theirs", "nosuch"):
        refused = run(env, "exec", "-n", ns, workspace, "--", "echo never")
        assert refused.returncode == 125 and refused.stdout == ""
        assert "forbidden: the key does not open this workspace or operation" in refused.stderr
        assert f"scoped key {key_id}" in refused.stderr and secret not in refused.stderr
    other_ns = run(env, "exec", "-n", unique("other"), "mine", "--", "echo never")
    assert other_ns.returncode == 125 and "forbidden" in other_ns.stderr
    no_scope = run(env, "snapshot", "-n", ns, "mine")  # snapshots is not among its scopes
    assert no_scope.returncode == 1 and "forbidden" in no_scope.stderr
    assert admin.client.snapshots(ns, "mine") == []
    with pytest.raises(ApiError) as missing:
        admin.client.get_workspace(ns, "nosuch")  # the refused exec created nothing
    assert missing.value.code == "workspace_not_found"

    # revoked: 401, saying it is the key that is no longer accepted
    assert run(client_env(server), "keys", "rm", key_id).returncode == 0
    revoked = run(env, "exec", "-n", ns, "mine", "--", "echo never")
    assert revoked.returncode == 125 and "unauthorized" in revoked.stderr and "revoked" in revoked.stderr


def test_a_key_without_manage_cannot_create_the_workspace_exec_would(server, admin):
    ns = unique("kman")
    secret, _ = admin.mint("-n", ns, "-s", "exec")
    refused = run(key_env(server, secret), "exec", "-n", ns, "fresh", "--", "true")
    assert refused.returncode == 125
    assert f"workspace {ns}/fresh does not exist, and creating it needs a key with the manage scope" in refused.stderr
    manager, _ = admin.mint("-n", ns, "-s", "exec,manage")
    admin.workspaces.append((ns, "fresh"))
    made = run(key_env(server, manager), "exec", "-n", ns, "fresh", "--", "echo made")
    assert made.returncode == 0 and made.stdout == "made\n" and f"created workspace {ns}/fresh" in made.stderr


# --- flarebox ls ---------------------------------------------------------------------------------------------------


def test_ls_with_the_deployment_token_and_with_keys(server, admin):
    ns, other = unique("lsa"), unique("lsb")
    admin.workspace(ns, "alpha", instance="lite")
    admin.workspace(ns, "beta")
    admin.workspace(other, "gamma")
    env = client_env(server)

    everything = run(env, "ls")
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout.splitlines()[0].split()[:2] == ["WORKSPACE", "STATE"]
    names = [r[0] for r in rows(everything.stdout)]
    assert {f"{ns}/alpha", f"{ns}/beta", f"{other}/gamma"} <= set(names)
    assert names == sorted(names, key=lambda n: n.split("/"))  # in (namespace, workspace) order
    one_ns = run(env, "ls", "-n", ns)
    table = {r[0]: r for r in rows(one_ns.stdout)}
    assert set(table) == {f"{ns}/alpha", f"{ns}/beta"}
    assert table[f"{ns}/alpha"][1] == "created" and table[f"{ns}/alpha"][3] == "lite"
    as_json = json.loads(run(env, "ls", "-n", ns, "--json").stdout)
    assert [(e["workspace"], e["state"]) for e in as_json] == [("alpha", "created"), ("beta", "created")]

    one, _ = admin.mint("-n", ns, "-w", "alpha", "-s", "files")
    seen = run(key_env(server, one), "ls")
    assert seen.returncode == 0 and [r[0] for r in rows(seen.stdout)] == [f"{ns}/alpha"]
    wide, wide_id = admin.mint("-n", ns, "-s", "exec")
    seen = run(key_env(server, wide), "ls")
    assert [r[0] for r in rows(seen.stdout)] == [f"{ns}/alpha", f"{ns}/beta"]
    beyond = run(key_env(server, wide), "ls", "-n", other)  # naming what lies beyond is refused, not answered empty
    assert beyond.returncode == 1 and "forbidden" in beyond.stderr and wide_id in beyond.stderr
    empty = run(env, "ls", "-n", unique("void"))
    assert empty.returncode == 0 and empty.stdout == "" and "no workspaces" in empty.stderr


def test_ls_and_audit_follow_next_pages(server, admin, monkeypatch, capsys):
    from standalone import cli, cli_keys

    ns = unique("page")
    for name in ("p1", "p2", "p3"):
        admin.workspace(ns, name)
    for key, value in client_env(server).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(cli_keys, "MAX_PAGE", 1)  # one entry a page: every `next` must be followed
    assert cli.main(["ls", "-n", ns, "--json"]) == 0
    assert [e["workspace"] for e in json.loads(capsys.readouterr().out)] == ["p1", "p2", "p3"]
    assert cli.main(["audit", "-n", ns, "--limit", "2", "--json"]) == 0
    captured = capsys.readouterr()
    assert [r["workspace"] for r in json.loads(captured.out)] == ["p3", "p2"]  # newest first, across two pages
    assert cli.main(["audit", "-n", ns, "--limit", "2"]) == 0
    assert "showing the newest 2" in capsys.readouterr().err


# --- flarebox audit ------------------------------------------------------------------------------------------------


def test_audit_shows_the_exec_who_ran_it_and_its_outcome(server, admin):
    ns = unique("aud")
    env = client_env(server)
    admin.workspaces.append((ns, "w"))
    assert run(env, "exec", "-n", ns, "w", "--", "echo by-admin").returncode == 0
    secret, key_id = admin.mint("-n", ns, "-w", "w", "-s", "exec,manage", "--label", "auditor")
    as_key = key_env(server, secret)
    # an escape sequence in a command must reach whoever reads the log as text, never as a terminal control
    assert run(as_key, "exec", "-n", ns, "w", "--", "echo by-key #\x1b[2J").returncode == 0
    run(env, "exec", "-n", ns, "nosuch-but-valid", "--ephemeral", "--", "true")  # another workspace: filtered below
    admin.workspaces.append((ns, "nosuch-but-valid"))

    done = run(env, "audit", "-n", ns, "-w", "w")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split()[:4] == ["TIME", "(UTC)", "WHO", "TARGET"]
    assert "\x1b" not in done.stdout and "by-key #\\x1b[2J" in done.stdout
    table = rows(done.stdout)
    ops = [(r[1], r[3], r[-1]) for r in table]
    assert ops[0] == (f"key {key_id} (auditor)", "exec", "echo by-key #\\x1b[2J")  # newest first
    assert ("admin", "exec", "echo by-admin") in ops
    assert ops.index(("admin", "exec", "echo by-admin")) > 0
    assert ops[-1][:2] == ("admin", "put_config")  # exec created the workspace first
    assert all(r[2] == f"{ns}/w" for r in table) and all(r[4].startswith("ok 20") for r in table)

    records = json.loads(run(env, "audit", "-n", ns, "--json").stdout)
    assert [r["seq"] for r in records] == sorted((r["seq"] for r in records), reverse=True)
    assert {r["workspace"] for r in records} == {"w", "nosuch-but-valid"}
    key_exec = next(r for r in records if r["actor"] == "key")
    assert key_exec["key_id"] == key_id and key_exec["command"] == "echo by-key #\x1b[2J"
    newest = run(env, "audit", "-n", ns, "--limit", "1")
    assert len(rows(newest.stdout)) == 1 and "showing the newest 1" in newest.stderr
    recent = json.loads(run(env, "audit", "-n", ns, "--since", "1h", "--json").stdout)
    assert len(recent) == len(records)
    later = run(env, "audit", "-n", ns, "--since", "2099-01-01")
    assert later.returncode == 0 and later.stdout == "" and "no audit records" in later.stderr
    bad = run(env, "audit", "--since", "yesterday-ish")
    assert bad.returncode == 125 and "--since" in bad.stderr

    # a key with manage reads the audit of its own reach; without manage, or beyond its reach, it is refused
    mine = json.loads(run(as_key, "audit", "--json").stdout)
    assert mine and {(r["namespace"], r["workspace"]) for r in mine} == {(ns, "w")}
    beyond = run(as_key, "audit", "-n", ns, "-w", "nosuch-but-valid")
    assert beyond.returncode == 1 and "forbidden" in beyond.stderr
    runner, _ = admin.mint("-n", ns, "-s", "exec")
    refused = run(key_env(server, runner), "audit")
    assert refused.returncode == 1 and "forbidden" in refused.stderr


def test_cli_scopes_match_the_protocol():
    from flarebox_hermes import client
    from protocol import keys
    from standalone import cli_keys

    assert cli_keys.SCOPES == keys.SCOPES == client.SCOPES
    assert client.KEY_PREFIX == keys.KEY_PREFIX and client.KEY_PATTERN == keys.KEY_PATTERN
    assert client.KEY_ID_PATTERN == keys.KEY_ID_PATTERN


def test_durations_and_times():
    from standalone.cli_keys import parse_duration, parse_since
    from standalone.cli_support import UsageError

    assert parse_duration("90") == 90 and parse_duration("15m") == 900 and parse_duration("12h") == 43200
    assert (
        parse_duration("30d") == 30 * 86400 and parse_duration("1d12h") == 129600 and parse_duration("2w") == 14 * 86400
    )
    for bad in ("0", "0d", "", "1y", "-5", "1.5h", "d"):
        with pytest.raises(UsageError):
            parse_duration(bad)
    now = 1_800_000_000
    assert parse_since("2h", now=now) == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 7200))
    assert parse_since("2026-12-01") == "2026-12-01T00:00:00.000Z"
    assert parse_since("2026-12-01T09:30:00Z") == "2026-12-01T09:30:00.000Z"
    assert parse_since("2026-12-01T10:30:00+01:00") == "2026-12-01T09:30:00.000Z"


def test_keys_create_binds_a_proxy_key_to_one_service(server, admin):
    ns, ws = unique("keyss"), "chat"
    admin.workspace(ns, ws)
    env = client_env(server)
    done = run(env, "keys", "create", "-n", ns, "-w", ws, "-s", "proxy", "--service", "web", "--json")
    assert done.returncode == 0, done.stderr
    key = json.loads(done.stdout)
    admin.keys.append(key["id"])
    assert (key["service"], key["scopes"], key["workspace"]) == ("web", ["proxy"], ws)
    # the server's rule, said by the CLI: a service binding needs one workspace and exactly the proxy scope
    refused = run(env, "keys", "create", "-n", ns, "-s", "proxy", "--service", "web")
    assert refused.returncode == 1 and "needs a workspace" in refused.stderr
    # the bound key opens nothing but /v1/proxy (which answers for the service: not defined here, so 404)
    as_key = key_env(server, key["key"])
    listing = run(as_key, "ls", "-n", ns)
    assert listing.returncode == 1 and "forbidden" in listing.stderr
