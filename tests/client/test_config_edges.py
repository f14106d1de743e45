"""The plugin's settings at their edges: empty and boundary-length tokens, secrets kept out of repr, today's
derived names pinned (a silent change would orphan every existing workspace), the profile-scoped secret lookup
that never falls back to os.environ, and every secret key stripped from Hermes' environment."""

import sys
import types

import pytest

from flarebox_hermes import config
from flarebox_hermes.config import ConfigError, load_settings

TOKEN = "x" * 40


@pytest.mark.parametrize("value", ["", "   ", "\t\n"])
def test_an_empty_token_is_a_config_error(env, value):
    env.setenv("HERMES_CF_TOKEN", value)
    with pytest.raises(ConfigError, match="HERMES_CF_TOKEN is not set"):
        load_settings()


@pytest.mark.parametrize("key", ["HERMES_CF_NAMESPACE", "HERMES_CF_WORKSPACE", "HERMES_CF_IMAGE", "HERMES_CF_INSTANCE"])
def test_an_empty_optional_setting_means_unset(env, key):
    default = load_settings()
    env.setenv(key, "  ")
    assert config.read_setting(key) is None
    assert load_settings() == default


def test_the_token_needs_at_least_32_characters(env):
    env.setenv("HERMES_CF_TOKEN", "y" * 31)
    with pytest.raises(ConfigError, match="at least 32"):
        load_settings()
    env.setenv("HERMES_CF_TOKEN", "y" * 32)
    assert load_settings().token == "y" * 32


def test_a_non_ascii_token_is_refused(env):
    env.setenv("HERMES_CF_TOKEN", "é" * 40)
    with pytest.raises(ConfigError, match="ASCII"):
        load_settings()


def test_repr_shows_no_secret(env):
    env.setenv("HERMES_CF_ACCESS_CLIENT_ID", "access-id-0123456789.access")
    env.setenv("HERMES_CF_ACCESS_CLIENT_SECRET", "access-secret-9876543210")
    s = load_settings()
    assert s.access_client_id == "access-id-0123456789.access"
    assert s.access_client_secret == "access-secret-9876543210"
    text = repr(s)
    assert TOKEN not in text and "access-id-0123456789" not in text and "access-secret-9876543210" not in text
    assert "flarebox.example.com" in text  # repr still says which server


@pytest.mark.parametrize(
    "home,namespace",
    [("/home/alice/.hermes", "hermes-23c228dc7cee"), ("/root/.hermes", "hermes-953b57936f16")],
)
def test_the_default_namespace_is_pinned(env, home, namespace):
    env.setenv("HERMES_HOME", home)
    assert load_settings().namespace == namespace


@pytest.mark.parametrize(
    "namespace,task,workspace",
    [
        ("personal", "default", "t-fc5258cf71aa31c8c1ef5e685b3ee7d2cd157e6b"),
        ("hermes-x", "session:telegram:1", "t-95eda10285026d8cac111d1b66dfddb7a7ba89d0"),
    ],
)
def test_the_persistent_workspace_name_is_pinned(env, namespace, task, workspace):
    env.setenv("HERMES_CF_NAMESPACE", namespace)
    s = load_settings()
    assert s.persistent_workspace(task) == workspace
    ephemeral = s.ephemeral_workspace(task)
    assert ephemeral.startswith("e-" + workspace[2:18] + "-") and len(ephemeral) == 2 + 16 + 1 + 32


def _install_secret_scope(monkeypatch, get_secret):
    agent = types.ModuleType("agent")
    scope = types.ModuleType("agent.secret_scope")
    scope.get_secret = get_secret
    agent.secret_scope = scope
    monkeypatch.setitem(sys.modules, "agent", agent)
    monkeypatch.setitem(sys.modules, "agent.secret_scope", scope)


class UnscopedSecretError(RuntimeError):
    pass


def test_an_unscoped_lookup_is_an_error_never_a_fallback_to_the_environment(env):
    def get_secret(name):
        raise UnscopedSecretError("no scope bound")

    _install_secret_scope(env, get_secret)
    # os.environ holds a complete, valid configuration: it must not be used
    with pytest.raises(ConfigError, match="HERMES_CF_ENDPOINT cannot be read.*UnscopedSecretError"):
        load_settings()
    with pytest.raises(ConfigError, match="no Hermes profile scope"):
        config.read_setting("HERMES_CF_TOKEN")


def test_inside_hermes_the_profile_scope_wins_over_the_environment(env):
    env.setenv("HERMES_CF_NAMESPACE", "from-environ")
    scoped = {"HERMES_CF_ENDPOINT": "https://scoped.example.com", "HERMES_CF_TOKEN": " " + "s" * 40 + " "}
    _install_secret_scope(env, lambda name: scoped.get(name))
    s = load_settings()
    assert s.endpoint == "https://scoped.example.com" and s.token == "s" * 40
    assert s.namespace.startswith("hermes-")  # the default: HERMES_CF_NAMESPACE is not in the scope
    assert config.read_setting("HERMES_CF_NAMESPACE") is None  # not in the scope: unset, whatever os.environ says


def test_every_secret_key_is_stripped():
    assert config.SECRET_KEYS == {
        "HERMES_CF_TOKEN",
        "HERMES_CF_ACCESS_CLIENT_ID",
        "HERMES_CF_ACCESS_CLIENT_SECRET",
        "SANDBOX_API_TOKEN",
    }


@pytest.mark.parametrize("instance", ["lite", "standard-1", "standard-2", "standard-3", "standard-4"])
def test_every_instance_type_is_accepted_and_sent(env, instance):
    env.setenv("HERMES_CF_INSTANCE", instance)
    env.setenv("HERMES_CF_IMAGE", "python")
    assert load_settings().workspace_config(True) == {
        "persistent": True,
        "cwd": "/workspace",
        "image": "python",
        "instance": instance,
    }
