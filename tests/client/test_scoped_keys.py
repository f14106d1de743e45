"""A scoped key as the plugin's HERMES_CF_TOKEN, against a real `flarebox serve`: the client's key, listing and audit
calls; the environment opening an existing workspace with a key that lacks `manage` (PUT refused, GET allowed) and
running commands there; and the clear refusals when the workspace is missing, beyond the key, or the key is revoked.

Hermes itself is not needed: `tools.environments.base` is replaced for these tests by a small BaseEnvironment with
the two methods the plugin's environment uses (the real ones are exercised in tests/hermes)."""

import importlib
import shutil
import sys
import types
import uuid

import pytest
from e2e import Made, serving

import flarebox_hermes
from flarebox_hermes.client import ApiError, Client, check_key_id, key_id_of

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

SECRET = "fbk_0123456789abcdef_" + "A" * 32


@pytest.fixture(scope="module")
def server():
    with serving() as proc:
        yield proc


class Admin(Made):
    """The deployment token's client; removes the keys and workspaces a test made."""

    def mint(self, ns: str, scopes: list[str], workspace: str | None = None) -> str:
        key = self.client.mint_key(ns, scopes, workspace=workspace, label="plugin test")
        self.keys.append(key["id"])
        return key["key"]

    def workspace(self, ns: str, ws: str, persistent: bool = True) -> None:
        self.client.put_workspace(ns, ws, {"persistent": persistent, "cwd": "/workspace"})
        self.workspaces.append((ns, ws))


@pytest.fixture
def admin(server):
    tracker = Admin(server)
    try:
        yield tracker
    finally:
        tracker.close()


class _BaseEnvironment:
    """What the plugin's environment uses of Hermes' BaseEnvironment (with probe=True it skips init_session)."""

    def __init__(self, *, cwd: str, timeout: int):
        self.cwd, self.timeout = cwd, timeout

    def _wait_for_process(self, proc, timeout: int = 60):
        proc.wait(timeout)
        return {"output": proc.stdout.read().decode(), "returncode": proc.returncode}


@pytest.fixture
def environment(monkeypatch):
    """flarebox_hermes.environment imported over the stand-in BaseEnvironment, and forgotten afterwards."""
    base = types.ModuleType("tools.environments.base")
    base.BaseEnvironment = _BaseEnvironment
    for name, module in {
        "tools": types.ModuleType("tools"),
        "tools.environments": types.ModuleType("tools.environments"),
        "tools.environments.base": base,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    names = ("flarebox_hermes.environment", "flarebox_hermes.compat")
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    try:
        yield importlib.import_module("flarebox_hermes.environment")
    finally:
        for n in names:
            sys.modules.pop(n, None)
            attr = n.rsplit(".", 1)[1]
            if hasattr(flarebox_hermes, attr):
                delattr(flarebox_hermes, attr)
        for n, module in saved.items():
            sys.modules[n] = module
            setattr(flarebox_hermes, n.rsplit(".", 1)[1], module)


def settings_for(server, token: str, ns: str, ws: str | None = None):
    from flarebox_hermes.config import Settings

    return Settings(endpoint=server.url, token=token, namespace=ns, workspace=ws)


def open_env(environment, server, token: str, ns: str, ws: str, *, persistent: bool = True):
    return environment.CloudflareSandboxEnvironment(
        settings=settings_for(server, token, ns, ws),
        workspace=ws,
        cwd="/workspace",
        timeout=60,
        persistent=persistent,
        probe=True,
    )


def refusal(environment, server, token: str, ns: str, ws: str, **kwargs):
    with pytest.raises(environment.EnvironmentConnectionError) as err:
        open_env(environment, server, token, ns, ws, **kwargs)
    return str(err.value), err.value.retry_hint


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


# --- the environment with a scoped key -----------------------------------------------------------------------------


def test_a_key_without_manage_uses_an_existing_workspace(server, admin, environment, tmp_path):
    ns = unique("pk")
    admin.workspace(ns, "proj")
    key = admin.mint(ns, ["exec", "files"], workspace="proj")
    env = open_env(environment, server, key, ns, "proj")
    try:
        result = env._wait_for_process(env._run_bash("echo from-key; echo data > /workspace/f.txt; exit 4"))
        assert result == {"output": "from-key\n", "returncode": 4}
        env.fetch_file("/workspace/f.txt", tmp_path / "f.txt", max_bytes=1024)
        assert (tmp_path / "f.txt").read_text() == "data\n"
        big = "x" * (environment.INLINE_STDIN_LIMIT + 10)  # staged through PUT /files: the files scope
        staged = env._wait_for_process(env._run_bash("wc -c", stdin_data=big))
        assert staged["returncode"] == 0 and staged["output"].strip() == str(len(big))
    finally:
        env.cleanup()
    # the PUT was refused (no manage) and is in the audit log as such; the workspace's config is untouched
    records = admin.client.list_audit(ns, "proj")["records"]
    puts = [r for r in records if r["operation"] == "put_config"]
    assert [(r["actor"], r["status"], r["code"]) for r in puts] == [("key", 403, "forbidden"), ("admin", 201, None)]
    assert admin.client.get_workspace(ns, "proj")["config"]["persistent"] is True


def test_a_key_with_manage_creates_the_workspace(server, admin, environment):
    ns = unique("pm")
    key = admin.mint(ns, ["exec", "files", "manage"])
    admin.workspaces.append((ns, "made"))
    env = open_env(environment, server, key, ns, "made")
    try:
        assert env._wait_for_process(env._run_bash("echo made"))["output"] == "made\n"
    finally:
        env.cleanup()
    assert admin.client.get_workspace(ns, "made")["state"] in ("created", "running", "stopped")


def test_a_missing_workspace_names_the_missing_manage_scope(server, admin, environment):
    ns = unique("px")
    key = admin.mint(ns, ["exec", "files"])
    message, hint = refusal(environment, server, key, ns, "absent")
    assert f"workspace {ns}/absent does not exist" in message
    assert f"scoped key {key_id_of(key)}" in message and "lacks the manage scope" in message
    assert key not in message and key not in hint
    assert hint == environment.CREDENTIAL_HINT  # not "retry once the server is reachable"
    with pytest.raises(ApiError) as gone:
        admin.client.get_workspace(ns, "absent")
    assert gone.value.code == "workspace_not_found"  # nothing was created


def test_a_workspace_beyond_the_key_and_a_revoked_key_say_what_to_do(server, admin, environment):
    ns = unique("pb")
    admin.workspace(ns, "theirs")
    key = admin.mint(ns, ["exec", "files"], workspace="mine")
    message, hint = refusal(environment, server, key, ns, "theirs")
    assert f"does not open workspace {ns}/theirs" in message and "HERMES_CF_NAMESPACE" in message
    assert "HERMES_CF_WORKSPACE" in message and hint == environment.CREDENTIAL_HINT

    admin.workspace(ns, "mine")
    admin.client.revoke_key(key_id_of(key))
    message, hint = refusal(environment, server, key, ns, "mine")
    assert "unauthorized" in message and f"scoped key {key_id_of(key)}" in message and "revoked" in message
    assert hint == environment.CREDENTIAL_HINT
    message, _ = refusal(environment, server, "w" * 40, ns, "mine")  # neither the token nor a key
    assert "unauthorized" in message and "neither this server's token nor one of its scoped keys" in message


def test_an_existing_workspace_with_another_config_is_a_conflict_for_a_key_too(server, admin, environment):
    ns = unique("pc")
    admin.workspace(ns, "proj", persistent=False)
    key = admin.mint(ns, ["exec", "files"], workspace="proj")
    message, _ = refusal(environment, server, key, ns, "proj", persistent=True)
    assert "config_conflict" in message and "persistent" in message


def test_a_key_without_exec_fails_the_command_with_the_scope_named(server, admin, environment):
    ns = unique("pe")
    admin.workspace(ns, "proj")
    key = admin.mint(ns, ["files"], workspace="proj")
    env = open_env(environment, server, key, ns, "proj")
    try:
        with pytest.raises(environment.EnvironmentConnectionError) as err:
            env._wait_for_process(env._run_bash("echo never"))
        assert "forbidden" in str(err.value) and "running a command needs exec" in str(err.value)
        assert err.value.retry_hint == environment.CREDENTIAL_HINT
    finally:
        env.cleanup()


# --- the client's key, listing and audit calls ---------------------------------------------------------------------


def test_client_keys_listing_and_audit(server, admin):
    ns = unique("pl")
    admin.workspace(ns, "a")
    admin.workspace(ns, "b")
    minted = admin.client.mint_key(ns, ["exec"], workspace="a", expires_in=600, label="lister")
    admin.keys.append(minted["id"])
    assert key_id_of(minted["key"]) == minted["id"] and minted["expires_at"] is not None
    assert [k["id"] for k in admin.client.list_keys(ns)] == [minted["id"]]
    with Client(server.url, minted["key"]) as as_key:
        assert [w["workspace"] for w in as_key.iter_workspaces()] == ["a"]
        with pytest.raises(ApiError) as err:
            as_key.list_keys()
        assert err.value.status == 403 and err.value.code == "forbidden"
    pages = [admin.client.list_workspaces(ns, limit=1)]
    pages.append(admin.client.list_workspaces(ns, limit=1, after=pages[0]["next"]))
    assert [p["workspaces"][0]["workspace"] for p in pages] == ["a", "b"] and pages[1]["next"] is None
    assert [w["workspace"] for w in admin.client.iter_workspaces(ns, page=1)] == ["a", "b"]
    first = admin.client.list_audit(ns, limit=1)
    older = admin.client.list_audit(ns, before=first["next"], limit=1)
    assert first["records"][0]["seq"] > older["records"][0]["seq"]
    revoked = admin.client.revoke_key(minted["id"])
    assert revoked["id"] == minted["id"] and "key" not in revoked
    with pytest.raises(ApiError) as err:
        admin.client.revoke_key(minted["id"])
    assert err.value.code == "key_not_found"


def test_key_ids():
    assert key_id_of(SECRET) == "0123456789abcdef"
    assert key_id_of("t" * 40) is None and key_id_of(SECRET + "x") is None
    assert check_key_id("0123456789abcdef") == "0123456789abcdef"
    for bad in ("0123456789ABCDEF", "0123", "../keys", SECRET):
        with pytest.raises(ValueError):
            check_key_id(bad)
