"""What the `flarebox` client commands share: their error kinds, how they print answers and speak on stderr, what
to say when the server refuses the credential, and creating a missing workspace (exec and cp both do)."""

import json
import sys


class UsageError(Exception):
    """The command line is wrong (exit 125)."""


class ConfigError(Exception):
    """Which server or token to use could not be worked out (exit 125)."""


class FileError(Exception):
    """cp: a file (local, or inside the workspace) could not be copied; the message names it (exit 1)."""


def print_json(obj) -> None:
    """An answer on stdout, as the server sent it (indented, UTF-8 kept)."""
    print(json.dumps(obj, indent=2, ensure_ascii=False))


def say(message: str) -> None:
    print(f"flarebox: {message}", file=sys.stderr, flush=True)


def credential_hint(err, token: str) -> str:
    """What to add to a refusal of the credential: which scoped key it was, and where to look. The key's secret is
    never repeated, only its public id."""
    from flarebox_hermes.client import key_id_of

    key_id = key_id_of(token)
    if key_id is None:
        return ""
    if err.code == "forbidden":
        return (
            f" (the token is the scoped key {key_id}; `flarebox keys ls`, with the deployment token, shows the "
            "namespace, workspace and scopes it opens)"
        )
    if err.code == "unauthorized":
        return f" (the token is the scoped key {key_id}: it is revoked, expired, or not one of this server's keys)"
    return ""


def ensure_workspace(client, ns: str, ws: str, *, persistent: bool = True) -> None:
    """exec and an upload create a missing workspace with defaults, and say so. Reading a workspace's status is
    open to every key on it; creating one needs the `manage` scope."""
    from flarebox_hermes.client import ApiError

    try:
        client.get_workspace(ns, ws)
    except ApiError as err:
        if err.code != "workspace_not_found":
            raise
        try:
            client.put_workspace(ns, ws, {"persistent": persistent})
        except ApiError as refused:
            if refused.code != "forbidden":
                raise
            raise ApiError(
                refused.status,
                refused.code,
                f"workspace {ns}/{ws} does not exist, and creating it needs a key with the manage scope",
            ) from None
        say(f"created workspace {ns}/{ws}")
