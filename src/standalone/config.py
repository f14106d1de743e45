"""Settings for the standalone runtime: wrangler.jsonc's `vars` as defaults, environment variables override.

Both runtimes then agree on IDLE_SECONDS, ENABLE_INTERNET, instance types and the rest without a second config file.
"""

import json
import os
from collections.abc import Mapping
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
    """Settings from wrangler.jsonc vars overridden by the environment. Raises ValueError naming a bad variable."""
    environ = os.environ if environ is None else environ
    merged = wrangler_vars(wrangler)
    for name in SETTING_VARS:
        if environ.get(name) not in (None, ""):
            merged[name] = environ[name]
    return Settings.from_vars(merged)
