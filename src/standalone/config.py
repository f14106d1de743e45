"""Settings for the standalone runtime: wrangler.jsonc's `vars` as defaults, environment variables override.

Both runtimes then agree on IDLE_SECONDS, ENABLE_INTERNET, instance types and the rest without a second config file.
"""

import json
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable.settings import SETTING_VARS, Settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def default_data_dir() -> Path:
    """Where `flarebox serve` keeps its data unless --data-dir says otherwise: $FLAREBOX_DATA_DIR, else
    ~/.local/share/flarebox. The client commands and `flarebox hermes install` read the local token from here."""
    env = os.environ.get("FLAREBOX_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "share" / "flarebox"


def strip_jsonc(text: str) -> str:
    """JSONC → JSON: drop // and /* */ comments and trailing commas, leaving string contents untouched."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            # copy a whole string literal, honouring escapes
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise ValueError("unterminated /* comment in JSONC")
            i = end + 2
        elif c == ",":
            # a comma followed (after whitespace/comments) by } or ] is a trailing comma: drop it
            j = i + 1
            while j < n:
                if text[j].isspace():
                    j += 1
                elif text.startswith("//", j):
                    nl = text.find("\n", j)
                    j = n if nl < 0 else nl
                elif text.startswith("/*", j):
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                else:
                    break
            if j >= n or text[j] not in "}]":
                out.append(c)
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def read_jsonc(path: Path) -> Any:
    return json.loads(strip_jsonc(path.read_text(encoding="utf-8")))


def wrangler_vars(path: Path | None = None) -> dict[str, str]:
    """The `vars` of wrangler.jsonc as strings ({} when the file does not exist)."""
    if path is None:
        # the checkout this code runs from (editable install), else the current directory
        candidates = [REPO_ROOT / "wrangler.jsonc", Path.cwd() / "wrangler.jsonc"]
        path = next((c for c in candidates if c.is_file()), candidates[0])
    if not path.is_file():
        return {}
    raw = read_jsonc(path).get("vars") or {}
    out = {}
    for key, value in raw.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            out[key] = ",".join(str(v) for v in value)
        else:
            out[key] = str(value)
    return out


def load_settings(environ: Mapping[str, str] | None = None, wrangler: Path | None = None) -> Settings:
    """Settings from wrangler.jsonc vars overridden by the environment. Raises ValueError naming a bad variable
    (IMAGE_BINDS too, though it is not part of Settings: a bad one stops the server at start, not at a boot)."""
    environ = os.environ if environ is None else environ
    merged = wrangler_vars(wrangler)
    for name in SETTING_VARS:
        if environ.get(name) not in (None, ""):
            merged[name] = environ[name]
    settings = Settings.from_vars(merged)
    image_binds(environ, settings.images)
    return settings


# --- IMAGE_BINDS: extra read-only binds per image (standalone only) --------------------------------------------------
# A standalone sandbox is the host's /usr plus the server's Python, whatever image a workspace names; this lets an
# image name mean "and this host directory too", e.g. a virtualenv with Hermes bound where the hermes-agent image of
# the hermes-agent image of container/Dockerfile installs it:  IMAGE_BINDS="hermes-agent=/srv/hermes-venv:/opt/hermes".
# An environment variable only (not a wrangler.jsonc var): host paths mean nothing to the Cloudflare deployment.

IMAGE_BINDS_VAR = "IMAGE_BINDS"
# Where a bind may not go, nor above: the sandbox's writable dirs, the kernel's, and the host system dirs every
# sandbox has (sandbox.py, bwrap.py). Covering one would hide or replace what the sandbox relies on.
RESERVED_SANDBOX_DIRS = (
    "/workspace",
    "/home",
    "/tmp",  # noqa: S108 - a path inside the sandbox, never opened here
    "/var",
    "/run",
    "/proc",
    "/dev",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
)
_IMAGE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # protocol/validate.py's image names


@dataclass(frozen=True)
class ImageBind:
    """One read-only bind: `source` on the host appears at `target` inside the sandboxes of one image."""

    source: str
    target: str


def _bind_path(path: str, what: str, entry: str) -> str:
    if not path.startswith("/") or os.path.normpath(path) != path or path.startswith("//") or ":" in path:
        raise ValueError(f"{IMAGE_BINDS_VAR}: {entry!r}: the {what} must be an absolute, normalised path (no : or ,)")
    return path


def parse_image_binds(value: str | None) -> dict[str, tuple[ImageBind, ...]]:
    """IMAGE_BINDS as {image: binds}: comma-separated `image=/host/path:/sandbox/path` entries, an image named as
    often as it has binds. Checks the shape only (pure); check_image_binds looks at the host. Raises ValueError."""
    binds: dict[str, list[ImageBind]] = {}
    for raw in (value or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        image, sep, paths = entry.partition("=")
        image = image.strip()
        source, colon, target = paths.strip().partition(":")
        if not sep or not colon or not _IMAGE_NAME.fullmatch(image):
            raise ValueError(f"{IMAGE_BINDS_VAR}: {entry!r} is not image=/host/path:/sandbox/path")
        bind = ImageBind(_bind_path(source, "host path", entry), _bind_path(target, "sandbox path", entry))
        if bind.target == "/" or any(
            bind.target == d or bind.target.startswith(d + "/") for d in RESERVED_SANDBOX_DIRS
        ):
            raise ValueError(
                f"{IMAGE_BINDS_VAR}: {entry!r}: {bind.target} would cover a directory every sandbox has "
                f"({', '.join(RESERVED_SANDBOX_DIRS)}); bind somewhere else, e.g. below /opt"
            )
        if any(other.target == bind.target for other in binds.get(image, ())):
            raise ValueError(f"{IMAGE_BINDS_VAR}: image {image} binds {bind.target} twice")
        binds.setdefault(image, []).append(bind)
    return {image: tuple(entries) for image, entries in binds.items()}


def check_image_binds(
    binds: Mapping[str, tuple[ImageBind, ...]],
    images: Collection[str],
    exists: Callable[[str], bool] = os.path.exists,
) -> None:
    """Every image bound is one a workspace may ask for (IMAGES), and every host path exists (now, at start)."""
    for image, entries in binds.items():
        if image not in images:
            raise ValueError(f"{IMAGE_BINDS_VAR}: image {image} is not in IMAGES ({', '.join(images)})")
        for bind in entries:
            if not exists(bind.source):
                raise ValueError(f"{IMAGE_BINDS_VAR}: {bind.source} (for image {image}) does not exist")


def image_binds(
    environ: Mapping[str, str] | None = None, images: Collection[str] | None = None
) -> dict[str, tuple[ImageBind, ...]]:
    """The environment's IMAGE_BINDS, parsed and checked ({} when unset). `images` defaults to the settings'."""
    environ = os.environ if environ is None else environ
    binds = parse_image_binds(environ.get(IMAGE_BINDS_VAR))
    if binds:
        check_image_binds(binds, load_settings(environ).images if images is None else images)
    return binds


# --- BACKUP_DIR: where backups go (standalone only) ------------------------------------------------------------------
# The directory of the backup store (backups.py), for example on another disk. Unset (or empty): no backup store,
# and the backup routes answer backups_unavailable. An environment variable only, like IMAGE_BINDS: a host path means
# nothing to the Cloudflare deployment, whose store is the BACKUPS R2 binding. It must be an absolute path; it is not
# created (a missing one is a disk that is not mounted: each backup then fails with backup_failed, saying so).

BACKUP_DIR_VAR = "BACKUP_DIR"


def backup_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The environment's BACKUP_DIR (None when unset or empty). Raises ValueError for a relative path."""
    environ = os.environ if environ is None else environ
    value = (environ.get(BACKUP_DIR_VAR) or "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise ValueError(f"{BACKUP_DIR_VAR}: {value!r} must be an absolute path")
    return path
