"""`flarebox hermes install` (the real CLI entry point) on a temp HERMES_HOME: copies only the plugin's files, merges
config.yaml without losing the user's settings, is idempotent, and writes .env (0600) only when asked."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from .conftest import REPO

USER_CONFIG = """\
model:
  default: some/model
plugins:
  enabled: [other-plugin]
terminal:
  backend: local
  timeout: 240
"""


def flarebox(*args, env=None):
    script = Path(sys.executable).with_name("flarebox")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "standalone.cli"]
    return subprocess.run(command + list(args), capture_output=True, text=True, env=env, cwd=REPO, timeout=60)


def test_install_merges_config_and_is_idempotent(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(USER_CONFIG)
    done = flarebox("hermes", "install", "--hermes-home", str(home))
    assert done.returncode == 0, done.stderr
    plugin = home / "plugins" / "cloudflare-sandbox"
    names = sorted(p.name for p in plugin.iterdir())
    assert "plugin.yaml" in names and "__init__.py" in names and "client.py" in names
    assert all(n.endswith(".py") or n == "plugin.yaml" for n in names)  # no __pycache__, no stray files
    config = yaml.safe_load((home / "config.yaml").read_text())
    assert config["model"] == {"default": "some/model"}
    assert config["plugins"]["enabled"] == ["other-plugin", "cloudflare-sandbox"]
    assert config["terminal"] == {
        "backend": "cloudflare_sandbox",
        "timeout": 240,
        "cwd": "/workspace",
        "container_persistent": True,
    }
    assert (home / "config.yaml.before-flarebox").read_text() == USER_CONFIG
    assert not (home / ".env").exists()  # credentials only when asked
    again = flarebox("hermes", "install", "--hermes-home", str(home))
    assert again.returncode == 0 and "already up to date" in again.stdout
    assert yaml.safe_load((home / "config.yaml").read_text()) == config


def test_plugin_yaml_version_matches_the_package():
    from flarebox_hermes import __version__

    manifest = yaml.safe_load((REPO / "plugin" / "plugin.yaml").read_text())
    assert manifest["version"] == __version__
    assert manifest["name"] == "cloudflare-sandbox" and manifest["kind"] == "backend"
    assert manifest["requires_hermes"] == ">=0.20.6"


def test_env_file_written_only_with_flags_and_private(tmp_path):
    home, data = tmp_path / "home", tmp_path / "data"
    data.mkdir()
    token = "T" * 48
    (data / "token").write_text(token + "\n")
    home.mkdir()
    (home / ".env").write_text("OPENAI_API_KEY=keep-me\nHERMES_CF_ENDPOINT=https://old.example\n")
    env = {k: v for k, v in os.environ.items() if k != "HERMES_HOME"}
    done = flarebox("hermes", "install", "--hermes-home", str(home), "--token-from-data-dir", str(data), env=env)
    assert done.returncode == 0, done.stderr
    assert token not in done.stdout + done.stderr
    lines = (home / ".env").read_text().splitlines()
    assert lines == ["OPENAI_API_KEY=keep-me", "HERMES_CF_ENDPOINT=https://old.example", f"HERMES_CF_TOKEN={token}"]
    assert stat.S_IMODE((home / ".env").stat().st_mode) == 0o600
    fresh = tmp_path / "fresh"
    done = flarebox("hermes", "install", "--hermes-home", str(fresh), "--token-from-data-dir", str(data), env=env)
    assert "HERMES_CF_ENDPOINT=http://127.0.0.1:8787" in (fresh / ".env").read_text().splitlines()
    done = flarebox("hermes", "install", "--hermes-home", str(home), "--endpoint", "http://127.0.0.1:9999", env=env)
    assert "HERMES_CF_ENDPOINT=http://127.0.0.1:9999" in (home / ".env").read_text().splitlines()
    bad = flarebox("hermes", "install", "--hermes-home", str(home), "--endpoint", "http://example.com", env=env)
    assert bad.returncode == 2 and "https" in bad.stderr


def test_missing_token_is_reported(tmp_path):
    done = flarebox("hermes", "install", "--hermes-home", str(tmp_path / "h"), "--token-from-data-dir", str(tmp_path))
    assert done.returncode == 2 and "no token" in done.stderr
