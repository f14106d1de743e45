"""What the `flarebox` client commands share: their error kinds, how they speak on stderr, and creating a missing
workspace (exec and cp both do)."""

import sys


class UsageError(Exception):
    """The command line is wrong (exit 125)."""


class ConfigError(Exception):
    """Which server or token to use could not be worked out (exit 125)."""


class FileError(Exception):
    """cp: a file (local, or inside the workspace) could not be copied; the message names it (exit 1)."""


def say(message: str) -> None:
    print(f"flarebox: {message}", file=sys.stderr, flush=True)


def ensure_workspace(client, ns: str, ws: str, *, persistent: bool = True) -> None:
    """exec and an upload create a missing workspace with defaults, and say so."""
    from flarebox_hermes.client import ApiError

    try:
        client.get_workspace(ns, ws)
    except ApiError as err:
        if err.code != "workspace_not_found":
            raise
        client.put_workspace(ns, ws, {"persistent": persistent})
        say(f"created workspace {ns}/{ws}")
