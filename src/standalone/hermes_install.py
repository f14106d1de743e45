"""`flarebox hermes install`: put the Hermes plugin into a Hermes profile and select it as the terminal backend.

It copies plugin/ to $HERMES_HOME/plugins/cloudflare-sandbox/, and sets in $HERMES_HOME/config.yaml:
plugins.enabled += cloudflare-sandbox, terminal.backend cloudflare_sandbox, terminal.cwd /workspace,
terminal.container_persistent true — every other setting is kept (the first change leaves a backup, since a YAML
round trip drops comments). Running it again changes nothing.

Credentials are written to $HERMES_HOME/.env (mode 0600) only when asked: --endpoint URL sets HERMES_CF_ENDPOINT,
--token-from-data-dir [DIR] copies the local `flarebox serve` token into HERMES_CF_TOKEN (it is never printed)
and, unless an endpoint is given or already set, points HERMES_CF_ENDPOINT at the local server.
--token-from-env VAR does the same with the token in the environment variable VAR (for a server whose token came
from SANDBOX_API_TOKEN, which leaves no token file).
Without them the user sets both in .env themselves, as for a Cloudflare deployment.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

PLUGIN_DIR_NAME = "cloudflare-sandbox"
BACKEND_NAME = "cloudflare_sandbox"
TERMINAL_SETTINGS = {"backend": BACKEND_NAME, "cwd": "/workspace", "container_persistent": True}
BACKUP_SUFFIX = ".before-flarebox"
LOCAL_ENDPOINT = "http://127.0.0.1:8787"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def token_problem(token: str) -> str | None:
    """Why `token` cannot be HERMES_CF_TOKEN in a Hermes .env, or None. The plugin's own rule (at least
    MIN_TOKEN_CHARS ASCII characters without spaces), and what Hermes' dotenv loader would change in an unquoted
    value: a leading quote starts a quoted value, and `${…}` is expanded even inside quotes."""
    from flarebox_hermes.config import MIN_TOKEN_CHARS

    if len(token) < MIN_TOKEN_CHARS or not token.isascii() or any(c.isspace() for c in token):
        return f"must be at least {MIN_TOKEN_CHARS} ASCII characters without spaces"
    if token[0] in "'\"" or "${" in token:
        return "cannot go into a Hermes .env as it is: Hermes would rewrite a leading quote or `${` when it reads it"
    return None


def plugin_source() -> Path:
    import flarebox_hermes

    return Path(flarebox_hermes.__file__).resolve().parent


def default_hermes_home() -> Path:
    return Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes").expanduser()


def install_plugin(home: Path) -> Path:
    """Copy the plugin's files (sources and manifest only) into place, replacing an older copy."""
    source = plugin_source()
    plugins = home / "plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    target = plugins / PLUGIN_DIR_NAME
    staging = Path(tempfile.mkdtemp(prefix=".flarebox-", dir=plugins))
    try:
        for item in sorted(source.iterdir()):
            if item.is_file() and (item.suffix == ".py" or item.name == "plugin.yaml"):
                shutil.copy2(item, staging / item.name)
        staging.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def update_config(home: Path) -> bool:
    """Merge our settings into config.yaml; returns whether anything changed."""
    import yaml

    path = home / "config.yaml"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    config = yaml.safe_load(text) if text.strip() else {}
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a YAML mapping; fix it by hand first")
    before = yaml.safe_dump(config, sort_keys=False)
    plugins = config.get("plugins")
    if not isinstance(plugins, dict):
        plugins = config["plugins"] = {}
    enabled = plugins.get("enabled")
    if not isinstance(enabled, list):
        enabled = plugins["enabled"] = []
    if PLUGIN_DIR_NAME not in enabled:
        enabled.append(PLUGIN_DIR_NAME)
    if PLUGIN_DIR_NAME in (plugins.get("disabled") or []):
        print(f"note: {PLUGIN_DIR_NAME} is listed in plugins.disabled in {path}; remove it there to load the plugin")
    terminal = config.get("terminal")
    if not isinstance(terminal, dict):
        terminal = config["terminal"] = {}
    terminal.update(TERMINAL_SETTINGS)
    after = yaml.safe_dump(config, sort_keys=False)
    if after == before and path.exists():
        return False
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    if path.exists() and not backup.exists():
        shutil.copy2(path, backup)
    _write_atomic(path, after, mode=None)
    return True


def read_env_keys(home: Path) -> set[str]:
    path = home / ".env"
    if not path.exists():
        return set()
    return {line.split("=", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines() if "=" in line}


def update_env_file(home: Path, values: dict[str, str]) -> None:
    """Set KEY=value lines in $HERMES_HOME/.env, keeping every other line; the file stays 0600."""
    path = home / ".env"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    remaining = dict(values)
    out = []
    for line in lines:
        key = line.split("=", 1)[0].strip()
        if key in remaining:
            out.append(f"{key}={remaining.pop(key)}")
        else:
            out.append(line)
    out.extend(f"{key}={value}" for key, value in remaining.items())
    _write_atomic(path, "\n".join(out) + "\n", mode=0o600)


def _write_atomic(path: Path, text: str, mode: int | None) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, mode if mode is not None else (path.stat().st_mode & 0o777 if path.exists() else 0o644))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flarebox hermes install", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hermes-home", type=Path, help="the Hermes profile home (default: $HERMES_HOME or ~/.hermes)")
    parser.add_argument("--endpoint", help="write HERMES_CF_ENDPOINT=URL into the profile's .env")
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--token-from-data-dir",
        nargs="?",
        const="",
        metavar="DIR",
        help="write the local `flarebox serve` token (from DIR, default its data dir) as HERMES_CF_TOKEN into .env",
    )
    token.add_argument(
        "--token-from-env",
        metavar="VAR",
        help="write the token in environment variable VAR (e.g. SANDBOX_API_TOKEN) as HERMES_CF_TOKEN into .env",
    )
    parser.add_argument("--no-config", action="store_true", help="only copy the plugin; leave config.yaml alone")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    home = (args.hermes_home or default_hermes_home()).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    env_values: dict[str, str] = {}
    if args.endpoint:
        from flarebox_hermes.client import check_endpoint

        try:
            env_values["HERMES_CF_ENDPOINT"] = check_endpoint(args.endpoint)
        except ValueError as exc:
            print(f"flarebox hermes install: --endpoint: {exc}", file=sys.stderr)
            return 2
    if args.token_from_data_dir is not None:
        from standalone.config import default_data_dir
        from standalone.token import read_local_token, token_path

        data_dir = Path(args.token_from_data_dir).expanduser() if args.token_from_data_dir else default_data_dir()
        token = read_local_token(data_dir)
        if not token:
            print(
                f"flarebox hermes install: no token at {token_path(data_dir)} (run `flarebox serve` once)",
                file=sys.stderr,
            )
            return 2
        problem = token_problem(token)
        if problem:
            print(f"flarebox hermes install: the token at {token_path(data_dir)} {problem}", file=sys.stderr)
            return 2
        env_values["HERMES_CF_TOKEN"] = token
    if args.token_from_env is not None:
        name = args.token_from_env
        if not ENV_NAME.fullmatch(name):
            print(f"flarebox hermes install: --token-from-env: {name!r} is not a variable name", file=sys.stderr)
            return 2
        token = os.environ.get(name, "")
        if not token:
            print(f"flarebox hermes install: --token-from-env: {name} is not set (or empty)", file=sys.stderr)
            return 2
        problem = token_problem(token)
        if problem:
            print(f"flarebox hermes install: --token-from-env: the value of {name} {problem}", file=sys.stderr)
            return 2
        env_values["HERMES_CF_TOKEN"] = token
    if "HERMES_CF_TOKEN" in env_values and "HERMES_CF_ENDPOINT" not in env_values:
        if "HERMES_CF_ENDPOINT" not in read_env_keys(home):
            env_values["HERMES_CF_ENDPOINT"] = LOCAL_ENDPOINT  # the token belongs to the local server
            if args.token_from_env is not None:
                print(f"HERMES_CF_ENDPOINT: {LOCAL_ENDPOINT}, the local server (pass --endpoint for another)")
    target = install_plugin(home)
    print(f"installed the plugin into {target}")
    if not args.no_config:
        try:
            changed = update_config(home)
        except ValueError as exc:
            print(f"flarebox hermes install: {exc}", file=sys.stderr)
            return 1
        state = "updated" if changed else "already up to date"
        print(f"{home / 'config.yaml'}: {state} (terminal.backend {BACKEND_NAME}, plugins.enabled {PLUGIN_DIR_NAME})")
    if env_values:
        update_env_file(home, env_values)
        print(f"{home / '.env'}: set {', '.join(sorted(env_values))} (mode 0600)")
    elif not args.no_config:
        print("next: set HERMES_CF_ENDPOINT and HERMES_CF_TOKEN in the profile's .env, then restart Hermes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
