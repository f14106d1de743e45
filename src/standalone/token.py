"""The server's SANDBOX_API_TOKEN: from the environment, else generated once into <data-dir>/token (mode 0600).

The token is shown at most once, when it is generated and only on a terminal; otherwise (and afterwards) only where
it is stored. It never goes to a log.
"""

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from protocol import limits

TOKEN_FILE = "token"


@dataclass(frozen=True)
class ServerToken:
    value: str
    source: str  # "env" | "generated" | "file"
    path: Path | None = None

    @property
    def usable(self) -> bool:
        return len(self.value) >= limits.MIN_TOKEN_CHARS


def token_path(data_dir: Path) -> Path:
    return Path(data_dir) / TOKEN_FILE


def read_local_token(data_dir: Path) -> str | None:
    try:
        value = token_path(data_dir).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return value or None


def load_or_create_token(data_dir: Path, environ: dict | None = None) -> ServerToken:
    environ = os.environ if environ is None else environ
    from_env = environ.get("SANDBOX_API_TOKEN")
    if from_env is not None and from_env != "":
        return ServerToken(from_env, "env")
    path = token_path(data_dir)
    existing = read_local_token(data_dir)
    if existing:
        return ServerToken(existing, "file", path)
    value = secrets.token_urlsafe(48)
    write_private(path, value)
    return ServerToken(value, "generated", path)


def write_private(path: Path, text: str) -> None:
    """Write a one-line secret file (the token, the secrets key): mode 0600 from the start (O_EXCL on a temporary
    name, then renamed into place), so it is never readable by others, not even for a moment, nor ever half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (text + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def token_notice(token: ServerToken, base_url: str, *, terminal: bool = True) -> str:
    """What `flarebox serve` prints about the token. Includes the token only right after generating it, and only
    when `terminal` (stdout is a terminal): output redirected to a log file gets where it is stored instead."""
    if token.source == "generated" and not terminal:
        return (
            f"Generated an API token and stored it in {token.path} (mode 0600); not shown, because this output is "
            f"not a terminal. Read it with: cat {token.path}\n"
        )
    if token.source == "generated":
        return (
            f"Generated an API token and stored it in {token.path} (mode 0600). It is shown only this once:\n\n"
            f"    {token.value}\n\n"
            f"Try it:\n"
            f'    curl -H "Authorization: Bearer $(cat {token.path})" {base_url}/v1/health\n'
        )
    if token.source == "file":
        return f"API token: stored in {token.path} (not shown).\n"
    if not token.usable:
        return (
            f"SANDBOX_API_TOKEN is shorter than {limits.MIN_TOKEN_CHARS} characters: every request will be refused "
            "with 503 not_configured.\n"
        )
    return "API token: from SANDBOX_API_TOKEN (not shown).\n"
