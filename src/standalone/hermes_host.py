"""`flarebox hermes host WS`: a workspace that runs Hermes' own OpenAI-compatible API server (the API-server platform
of its gateway) as the service `hermes`, reachable by any OpenAI client at <server>/v1/proxy/v1 with a proxy key.

What it does, against a running Flarebox server (the same server and token as every client command):
1. creates the workspace (persistent, image `hermes-agent`: container/Dockerfile with HERMES_PACKAGE installs Hermes at
   /opt/hermes; standalone, IMAGE_BINDS binds a host virtualenv there), or checks that it already is one;
2. stores the model provider's key as a secret, read from an environment variable, never from the command line;
3. writes Hermes' config.yaml (the model and its endpoint) into /home/sandbox/.hermes;
4. stores a fresh random API_SERVER_KEY as a secret and puts the service: `hermes gateway run` under Hermes' own
   Python, with both secrets in its environment and `bearer_secret: API_SERVER_KEY`;
5. waits until it is running, mints a `proxy` key bound to it and prints the two lines to paste into an OpenAI
   client: `base_url=…` and `api_key=…`.

Why the bearer secret: Hermes refuses to start its API server without API_SERVER_KEY (16+ characters, checked even
on a loopback bind) and then wants it as `Authorization: Bearer` on every request, while the Flarebox proxy never
forwards the caller's Authorization (the proxy key must not enter the container). With `bearer_secret` the proxy
adds the service's own key instead, so the only holders of API_SERVER_KEY are the workspace's secret store and
Hermes; the user never sees it. Each run makes a new one (the service is replaced in the same run).

Why 0.0.0.0 by default: on Cloudflare the proxy reaches the port through the container's network interface, not its
loopback, so a loopback-only Hermes would be unreachable there; a standalone sandbox has no inbound path from outside
(its own network namespace, with no port forwarded into it), so the wider bind exposes nothing more. Hermes still
checks its key on every request. `--listen-host 127.0.0.1` is for a runtime that reaches services over loopback.
"""

import argparse
import json
import os
import re
import secrets
import sys
import time
from urllib.parse import urlsplit

SERVICE = "hermes"
DEFAULT_IMAGE = "hermes-agent"
DEFAULT_PORT = 8642  # Hermes' own default for its API server
HERMES_PYTHON = "/opt/hermes/bin/python"  # the hermes-agent image's (container/Dockerfile, built with HERMES_PACKAGE)
HERMES_HOME = "/home/sandbox/.hermes"  # Hermes' default ~/.hermes for the sandbox user: kept in snapshots
CONFIG_PATH = f"{HERMES_HOME}/config.yaml"
# -P: no cwd on sys.path (HERMES_HOME holds files Hermes' tools write); --external-supervisor: a restart or update
# Hermes asks for exits back to Flarebox's supervisor, which starts it again (restart "always")
HERMES_COMMAND = f"exec {HERMES_PYTHON} -P -m hermes_cli.main gateway run --external-supervisor"
API_KEY_SECRET = "API_SERVER_KEY"  # Hermes reads its API server's key from this variable
DEFAULT_LISTEN_HOST = "0.0.0.0"  # see the module docstring: the proxy reaches it from outside the loopback
DEFAULT_PROVIDER_URL = "https://openrouter.ai/api/v1"
DEFAULT_KEY_ENV = "OPENROUTER_API_KEY"
# Hermes sends an openrouter.ai endpoint only OPENROUTER_API_KEY, whatever config.yaml's key_env says
OPENROUTER_KEY_ENV = "OPENROUTER_API_KEY"
ALLOW_PATHS = ["/v1"]  # the OpenAI-compatible surface: chat completions, responses, models, runs
HEALTH_PATH = "/health"  # Hermes answers it without the key once its API server listens
READY_SECONDS = 120.0
POLL_SECONDS = 0.5
SECRET_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")  # protocol/limits.py SECRET_NAME_PATTERN
SERVICE_ENV = {"HERMES_HOME": HERMES_HOME, "PYTHONUNBUFFERED": "1"}

ERROR_EXIT = 125  # as the other client commands (standalone/cli.py): flarebox's own failure
API_ERROR_EXIT = 1  # the server refused


class HostError(Exception):
    """A failure to report as one line (exit `code`)."""

    def __init__(self, message: str, code: int = API_ERROR_EXIT):
        super().__init__(message)
        self.code = code


# --- the command -----------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    from standalone.cli import _add_connection_options, _Parser

    p = _Parser(  # usage errors exit 125, as every flarebox command's
        prog="flarebox hermes host",
        description="Run Hermes' OpenAI-compatible API server in a workspace and print the base_url and api_key "
        "an OpenAI client needs to talk to it through this server.",
    )
    _add_connection_options(p, top=True)
    p.add_argument("workspace", metavar="WS", help="the workspace (created persistent if missing)")
    p.add_argument("--model", "-m", required=True, help="the model Hermes asks the provider for")
    p.add_argument(
        "--provider-url",
        default=DEFAULT_PROVIDER_URL,
        metavar="URL",
        help=f"the provider's OpenAI-compatible base URL (default {DEFAULT_PROVIDER_URL})",
    )
    key = p.add_mutually_exclusive_group()
    key.add_argument(
        "--provider-key-from-env",
        metavar="VAR",
        default=DEFAULT_KEY_ENV,
        help=f"read the provider's API key from this environment variable (default {DEFAULT_KEY_ENV}); it is "
        "stored as a workspace secret and handed only to the service",
    )
    key.add_argument("--no-provider-key", action="store_true", help="the endpoint takes no key")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the service's port (default {DEFAULT_PORT})")
    p.add_argument("--image", default=DEFAULT_IMAGE, help=f"the workspace image (default {DEFAULT_IMAGE})")
    p.add_argument(
        "--listen-host",
        default=DEFAULT_LISTEN_HOST,
        metavar="ADDR",
        help=f"the address Hermes listens on inside the workspace (default {DEFAULT_LISTEN_HOST}: Cloudflare reaches "
        "a container's port through its network interface, not its loopback)",
    )
    p.add_argument("--no-wait", action="store_true", help="do not wait until the service is running")
    return p


def secret_name(provider_url: str, key_env: str) -> str:
    """The secret (= environment variable in the service) holding the key: the variable it was read from, except
    for OpenRouter, whose key Hermes reads from OPENROUTER_API_KEY only."""
    host = (urlsplit(provider_url).hostname or "").lower()
    return OPENROUTER_KEY_ENV if host == "openrouter.ai" or host.endswith(".openrouter.ai") else key_env


def hermes_config(model: str, provider_url: str, key_env: str | None) -> bytes:
    """config.yaml for Hermes: a `custom` OpenAI-compatible provider. JSON strings are YAML scalars as they are."""
    lines = [
        "# Written by `flarebox hermes host` (and rewritten each time it runs): the model Hermes' API server uses.",
        "model:",
        "  provider: custom",
        f"  default: {json.dumps(model)}",
        f"  base_url: {json.dumps(provider_url)}",
    ]
    if key_env is not None:
        lines.append(f"  key_env: {key_env}")
    return ("\n".join(lines) + "\n").encode()


def service_spec(port: int, secret: str | None, listen_host: str) -> dict:
    """The body of PUT …/services/hermes: Hermes' gateway itself, its API server on `listen_host`:`port`, and the
    proxy adding `Authorization: Bearer <API_SERVER_KEY>` to every request (the secret API_KEY_SECRET)."""
    return {
        "command": HERMES_COMMAND,
        "port": port,
        "cwd": HERMES_HOME,
        "env": {**SERVICE_ENV, "API_SERVER_HOST": listen_host, "API_SERVER_PORT": str(port)},
        "secrets": [API_KEY_SECRET, *([secret] if secret else [])],
        "bearer_secret": API_KEY_SECRET,
        "health": {"path": HEALTH_PATH},
        "allow_paths": list(ALLOW_PATHS),
        "restart": "always",
    }


def check_args(args, environ) -> tuple[str | None, str | None]:
    """(secret name, key) from the arguments and the environment; raises HostError (exit 125) on bad input."""
    if not 1 <= args.port <= 65535:
        raise HostError(f"--port {args.port}: give a port from 1 to 65535", ERROR_EXIT)
    url = urlsplit(args.provider_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise HostError(
            f"--provider-url {args.provider_url!r}: give an http(s) URL such as {DEFAULT_PROVIDER_URL}", ERROR_EXIT
        )
    if not args.listen_host or any(c.isspace() or not c.isprintable() for c in args.listen_host):
        raise HostError(f"--listen-host {args.listen_host!r}: give an address such as 0.0.0.0 or 127.0.0.1", ERROR_EXIT)
    if not args.model.strip() or any(c in args.model for c in "\r\n\x00"):
        raise HostError("--model: give a model name such as anthropic/claude-sonnet-4", ERROR_EXIT)
    if args.no_provider_key:
        return None, None
    var = args.provider_key_from_env
    if not SECRET_NAME.fullmatch(var) or var.startswith("API_SERVER_") or var in SERVICE_ENV:
        raise HostError(
            f"--provider-key-from-env {var!r}: give an upper-case variable name such as {DEFAULT_KEY_ENV} "
            "(not one the service sets itself)",
            ERROR_EXIT,
        )
    key = environ.get(var, "").strip()
    if not key:
        raise HostError(
            f"{var} is not set: export the provider's API key as {var} (it is read from the environment, never "
            "from the command line), name another variable with --provider-key-from-env, or pass --no-provider-key",
            ERROR_EXIT,
        )
    return secret_name(args.provider_url, var), key


def ensure_workspace(client, ns: str, ws: str, image: str) -> None:
    from flarebox_hermes.client import ApiError

    try:
        status = client.get_workspace(ns, ws)
    except ApiError as err:
        if err.code != "workspace_not_found":
            raise
        client.put_workspace(ns, ws, {"image": image, "persistent": True})
        _say(f"created workspace {ns}/{ws} (image {image})")
        return
    config = status.get("config") or {}
    if config.get("image") != image:
        raise HostError(
            f"workspace {ns}/{ws} exists with image {config.get('image')!r}, not {image!r}: use another workspace, "
            "or --image if that image has Hermes at /opt/hermes"
        )
    if config.get("persistent") is False:
        raise HostError(f"workspace {ns}/{ws} is ephemeral: a hosted Hermes needs a persistent workspace")


def wait_running(client, ns: str, ws: str, timeout: float = READY_SECONDS, clock=time.monotonic, sleep=time.sleep):
    """Poll GET …/services until `hermes` runs; HostError if it failed, or is still not running after `timeout`."""
    deadline = clock() + timeout
    while True:
        services = client.list_services(ns, ws)
        mine = next((s for s in services if s.get("name") == SERVICE), None)
        state = mine.get("state") if mine else None
        if state == "running":
            return mine
        if state in ("failed", "stopped"):
            last = mine.get("last_exit") or {}
            raise HostError(
                f"service {SERVICE} is {state} (last exit: code {last.get('code')}, signal {last.get('signal')}); "
                f"its output: GET /v1/workspaces/{ns}/{ws}/services/{SERVICE}/logs"
            )
        if clock() >= deadline:
            raise HostError(
                f"service {SERVICE} is still {state or 'missing'} after {timeout:.0f} s; its output: "
                f"GET /v1/workspaces/{ns}/{ws}/services/{SERVICE}/logs"
            )
        sleep(POLL_SECONDS)


def host(client, args, secret: str | None, key: str | None) -> tuple[str, str]:
    """Configure the workspace (the provider's key as the secret `secret`) and mint the proxy key; returns
    (base_url, api_key)."""
    ns, ws = args.namespace, args.workspace
    ensure_workspace(client, ns, ws, args.image)
    if secret is not None:
        client.put_secret(ns, ws, secret, key)
    client.write_file(ns, ws, CONFIG_PATH, hermes_config(args.model, args.provider_url, secret), mode=0o644)
    # a new key each run, just before the service is replaced with it: only the secret store and Hermes hold it
    client.put_secret(ns, ws, API_KEY_SECRET, secrets.token_urlsafe(32))
    client.put_service(ns, ws, SERVICE, service_spec(args.port, secret, args.listen_host))
    if not args.no_wait:
        _say(f"waiting for service {SERVICE} in {ns}/{ws} to run …")
        wait_running(client, ns, ws)
    minted = client.mint_key(ns, ["proxy"], workspace=ws, service=SERVICE, label=f"hermes host {ws}")
    _say(f"minted proxy key {minted.get('id')} (revoke it with `flarebox keys rm {minted.get('id')}`)")
    return f"{client.endpoint}/v1/proxy/v1", minted["key"]


def main(argv: list[str], top=None, environ=None) -> int:
    """`flarebox hermes host …`; `top` holds connection options given before `hermes` (flarebox --endpoint X …)."""
    from flarebox_hermes.client import ApiError, Client, FlareboxError, TransportError
    from standalone.cli import _default_namespace, resolve_target
    from standalone.cli_support import ConfigError, credential_hint

    environ = os.environ if environ is None else environ
    args = parser().parse_args(argv)
    for name in ("endpoint", "token_file", "namespace"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(top, name, None))
    if args.namespace is None:
        args.namespace = _default_namespace()
    token = endpoint = ""
    try:
        secret, key = check_args(args, environ)  # first: a missing key is said before any request is made
        endpoint, token, _ = resolve_target(args, environ)
        with Client(endpoint, token) as client:
            base_url, api_key = host(client, args, secret, key)
    except HostError as err:
        _say(str(err))
        return err.code
    except (ConfigError, ValueError) as err:
        _say(str(err))
        return ERROR_EXIT
    except ApiError as err:
        hint = " (does this server have services and secrets? update it)" if err.code == "not_found" else ""
        _say(f"{err.code}: {err.message}{hint}{credential_hint(err, token)}")
        return API_ERROR_EXIT
    except TransportError as err:
        _say(f"cannot reach {endpoint}: {err.reason or err}" if not err.connected else f"{endpoint}: {err}")
        return ERROR_EXIT
    except FlareboxError as err:
        _say(str(err))
        return ERROR_EXIT
    print(f"base_url={base_url}")
    print(f"api_key={api_key}")
    return 0


def _say(message: str) -> None:
    print(f"flarebox: {message}", file=sys.stderr, flush=True)
