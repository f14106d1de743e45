"""The plugin's HERMES_CF_* settings outside Hermes (plain environment): validation and workspace naming."""

import re

import pytest

from flarebox_hermes.config import ConfigError, load_settings, sandbox_cwd

TOKEN = "x" * 40
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


def test_minimal_settings(env):
    s = load_settings()
    assert s.endpoint == "https://flarebox.example.com" and s.token == TOKEN
    assert NAME.fullmatch(s.namespace) and s.namespace.startswith("hermes-")
    assert TOKEN not in repr(s)
    assert s.workspace_config(True) == {"persistent": True, "cwd": "/workspace"}


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("HERMES_CF_ENDPOINT", "http://flarebox.example.com", "https"),
        ("HERMES_CF_ENDPOINT", "", "not set"),
        ("HERMES_CF_TOKEN", "short", "at least 32"),
        ("HERMES_CF_TOKEN", "x" * 20 + " " + "x" * 20, "at least 32"),
        ("HERMES_CF_NAMESPACE", "Has Spaces", "HERMES_CF_NAMESPACE"),
        ("HERMES_CF_WORKSPACE", "../x", "HERMES_CF_WORKSPACE"),
        ("HERMES_CF_INSTANCE", "huge", "HERMES_CF_INSTANCE"),
        ("HERMES_CF_IMAGE", "a/b", "HERMES_CF_IMAGE"),
        ("HERMES_CF_ACCESS_CLIENT_ID", "only-id", "both"),
    ],
)
def test_bad_settings_name_the_variable(env, key, value, fragment):
    env.setenv(key, value)
    with pytest.raises(ConfigError, match=fragment):
        load_settings()


def test_workspace_names_hide_task_ids_and_paths(env):
    s = load_settings()
    task = "session:telegram:/home/alice/secret-project"
    persistent = s.persistent_workspace(task)
    assert NAME.fullmatch(persistent) and persistent == s.persistent_workspace(task)  # stable
    assert "alice" not in persistent and "secret" not in persistent
    assert persistent != s.persistent_workspace("default")
    first, second = s.ephemeral_workspace(task), s.ephemeral_workspace(task)
    assert first != second and NAME.fullmatch(first) and NAME.fullmatch(second)
    env.setenv("HERMES_CF_WORKSPACE", "my-project")
    env.setenv("HERMES_CF_INSTANCE", "standard-2")
    s = load_settings()
    assert s.persistent_workspace(task) == "my-project"
    assert s.workspace_config(False)["instance"] == "standard-2"


def test_namespace_depends_on_the_profile_home(env, tmp_path):
    first = load_settings().namespace
    env.setenv("HERMES_HOME", str(tmp_path / "other"))
    assert load_settings().namespace != first
    env.setenv("HERMES_CF_NAMESPACE", "personal")
    assert load_settings().namespace == "personal"


@pytest.mark.parametrize(
    "given,expected",
    [
        ("/root", "/workspace"),
        ("", "/workspace"),
        ("~", "/workspace"),
        ("rel/dir", "/workspace"),
        ("/workspace/app/", "/workspace/app"),
        ("/srv/x", "/srv/x"),
    ],
)
def test_sandbox_cwd(given, expected):
    assert sandbox_cwd(given) == expected
