"""A hosted Hermes: `flarebox hermes host WS` runs Hermes' own OpenAI-compatible API server in a workspace, as the
service `hermes`, and prints the base_url and api_key an OpenAI client needs.

The end-to-end test runs the real thing: a real `flarebox serve` whose `hermes-agent` image is the pinned Hermes
stand-in bound into the sandbox (IMAGE_BINDS), the real Hermes API server as a service, a scripted model, and the
real `openai` client on the host completing chats through /v1/proxy/v1 with the proxy key the command printed. The
sandbox never reaches the host's loopback, so the model is a second service of the same workspace (`model`, port
9000) and Hermes is pointed at http://127.0.0.1:9000/v1.

Hermes insists on `Authorization: Bearer <API_SERVER_KEY>`; the command stores a random one as a secret and names
it the service's `bearer_secret`, so the proxy adds it to every request while the caller's own Authorization (the
proxy key) never crosses. The venv is conftest.py's `.venv-hermes-iot` (the stand-in plus aiohttp, which Hermes'
API-server platform imports), as the hermes-agent image of container/Dockerfile installs it.

The command itself is also tested against a scripted Flarebox server (no sandbox, no Hermes): which requests it
makes, in which order, what it prints, and its one-line errors.
"""

import json
import os
import re
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml
from e2e import exec_events, flarebox_command, output_of, serving

from standalone import hermes_host

KEY_SHAPE = re.compile(r"fbk_[0-9a-f]{16}_[A-Za-z0-9_-]{32}")
REPLY = "pong from the scripted model"
MODEL_PORT = 9000

# The scripted model: an OpenAI-compatible endpoint that answers every chat with REPLY (streamed when asked) and
# shows, at GET /_seen, every request it got (path and headers), so the test can tell which credentials reached it.
FAKE_MODEL = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, REPLY, SEEN = int(sys.argv[1]), sys.argv[2], []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/_seen":
            return self._json(200, SEEN)
        SEEN.append({"method": "GET", "path": self.path, "headers": dict(self.headers.items())})
        if self.path.rstrip("/").endswith("/models"):
            return self._json(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
        self._json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        SEEN.append({"method": "POST", "path": self.path, "headers": dict(self.headers.items()), "body": body})
        if not self.path.endswith("/chat/completions"):
            return self._json(404, {"error": {"message": "not found"}})
        base = {"id": "chatcmpl-scripted", "created": int(time.time()), "model": "scripted"}
        usage = {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
        if not body.get("stream"):
            message = {"role": "assistant", "content": REPLY}
            choice = {"index": 0, "finish_reason": "stop", "message": message}
            return self._json(200, {**base, "object": "chat.completion", "choices": [choice], "usage": usage})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        base["object"] = "chat.completion.chunk"

        def send(delta, finish=None, **extra):
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()

        send({"role": "assistant", "content": ""})
        for word in REPLY.split(" "):
            send({"content": word + " "})
        send({}, "stop", usage=usage)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, fmt, *args):
        sys.stderr.write("model: " + fmt % args + "\n")


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
"""


# --- the pieces -------------------------------------------------------------------------------------------------


def test_service_spec_runs_hermes_gateway_with_its_key_as_the_bearer_secret():
    spec = hermes_host.service_spec(8642, "OPENROUTER_API_KEY", "0.0.0.0")
    assert spec == {
        "command": "exec /opt/hermes/bin/python -P -m hermes_cli.main gateway run --external-supervisor",
        "port": 8642,
        "cwd": "/home/sandbox/.hermes",
        "env": {
            "HERMES_HOME": "/home/sandbox/.hermes",
            "PYTHONUNBUFFERED": "1",
            "API_SERVER_HOST": "0.0.0.0",
            "API_SERVER_PORT": "8642",
        },
        "secrets": ["API_SERVER_KEY", "OPENROUTER_API_KEY"],
        "bearer_secret": "API_SERVER_KEY",
        "health": {"path": "/health"},
        "allow_paths": ["/v1"],
        "restart": "always",
    }
    other = hermes_host.service_spec(9001, None, "127.0.0.1")
    assert other["secrets"] == ["API_SERVER_KEY"] and other["bearer_secret"] == "API_SERVER_KEY"
    assert other["env"]["API_SERVER_HOST"] == "127.0.0.1" and other["env"]["API_SERVER_PORT"] == "9001"


def test_service_spec_is_a_valid_service():
    from protocol.services import parse_service

    parsed = parse_service(hermes_host.service_spec(8642, "FAKE_KEY", "0.0.0.0"))
    assert parsed.bearer_secret == "API_SERVER_KEY" and parsed.secrets == ("API_SERVER_KEY", "FAKE_KEY")


def test_config_yaml_names_a_custom_provider():
    text = hermes_host.hermes_config('we"ird: model #1', "http://127.0.0.1:9000/v1", "FAKE_KEY").decode()
    assert yaml.safe_load(text) == {
        "model": {
            "provider": "custom",
            "default": 'we"ird: model #1',
            "base_url": "http://127.0.0.1:9000/v1",
            "key_env": "FAKE_KEY",
        }
    }
    assert "key_env" not in yaml.safe_load(hermes_host.hermes_config("m", "http://x/v1", None))["model"]


@pytest.mark.parametrize(
    ("url", "var", "secret"),
    [
        ("https://openrouter.ai/api/v1", "MY_KEY", "OPENROUTER_API_KEY"),  # the only variable Hermes reads for it
        ("https://eu.openrouter.ai/api/v1", "MY_KEY", "OPENROUTER_API_KEY"),
        ("https://api.openai.com/v1", "OPENAI_API_KEY", "OPENAI_API_KEY"),
        ("http://127.0.0.1:9000/v1", "FAKE_KEY", "FAKE_KEY"),
        ("https://notopenrouter.ai/v1", "MY_KEY", "MY_KEY"),
    ],
)
def test_secret_name(url, var, secret):
    assert hermes_host.secret_name(url, var) == secret


# --- the command, against a scripted Flarebox server --------------------------------------------------------------


class ScriptedFlarebox(ThreadingHTTPServer):
    """Answers the routes `hermes host` uses, as docs/protocol.md has them, and records every request."""

    def __init__(self, *, workspace: dict | None = None, service_state: str = "running"):
        super().__init__(("127.0.0.1", 0), _ScriptedHandler)
        self.workspace = workspace  # the status object of an existing workspace, or None
        self.service_state = service_state
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _ScriptedHandler(BaseHTTPRequestHandler):
    server: ScriptedFlarebox

    def log_message(self, fmt, *args):
        pass

    def _answer(self, status: int, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.requests.append((self.command, url.path, parse_qs(url.query), body))
        if self.headers.get("Authorization") != "Bearer deployment-token":
            return self._answer(401, {"error": {"code": "unauthorized", "message": "bad token"}})
        parts = url.path.split("/")[3:]  # after /v1/workspaces: ns, ws, rest…
        srv = self.server
        if url.path == "/v1/keys" and self.command == "POST":
            return self._answer(201, {"id": "0123456789abcdef", "key": "fbk_0123456789abcdef_" + "K" * 32})
        if len(parts) == 2 and self.command == "GET":
            if srv.workspace is None:
                return self._answer(404, {"error": {"code": "workspace_not_found", "message": "no such workspace"}})
            return self._answer(200, srv.workspace)
        if len(parts) == 2 and self.command == "PUT":
            srv.workspace = {"config": json.loads(body), "state": "created"}
            return self._answer(201, srv.workspace)
        if parts[2:] == ["files"]:
            return self._answer(200, {"path": parse_qs(url.query)["path"][0], "size": len(body)})
        if parts[2:3] == ["secrets"]:
            return self._answer(200, {"name": parts[3], "updated_at": "2026-12-01T00:00:00Z"})
        if parts[2:] == ["services", "hermes"]:
            return self._answer(200, {"name": "hermes", "state": "starting"})
        if parts[2:] == ["services"]:
            last = {"code": 1, "signal": None, "at": "2026-12-01T00:00:00Z"}
            return self._answer(200, {"services": [{"name": "hermes", "state": srv.service_state, "last_exit": last}]})
        return self._answer(404, {"error": {"code": "not_found", "message": "no such route"}})

    do_GET = do_PUT = do_POST = _handle


@pytest.fixture
def scripted():
    servers: list[ScriptedFlarebox] = []

    def start(**kwargs) -> ScriptedFlarebox:
        srv = ScriptedFlarebox(**kwargs)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


KEY_FROM_ENV = ("--provider-key-from-env", "FAKE_KEY")


def run_host(srv, capsys, *extra: str, env: dict | None = None, key=KEY_FROM_ENV) -> tuple[int, str, str]:
    """`hermes host ws1` in this process; a later --provider-key-from-env in `extra` wins over `key`."""
    environ = {"FLAREBOX_ENDPOINT": srv.url, "FLAREBOX_TOKEN": "deployment-token", "FAKE_KEY": "sk-provider-secret"}
    argv = ["ws1", "--namespace", "ns1", "--model", "fake-model", "--provider-url", "http://127.0.0.1:9000/v1"]
    argv += [*key, *extra]
    code = hermes_host.main(argv, environ={**environ, **(env or {})})
    out, err = capsys.readouterr()
    return code, out, err


def test_host_configures_the_workspace_then_prints_two_lines(scripted, capsys):
    srv = scripted()
    code, out, err = run_host(srv, capsys)
    assert code == 0, err
    assert out.splitlines() == [f"base_url={srv.url}/v1/proxy/v1", "api_key=fbk_0123456789abcdef_" + "K" * 32]
    assert "sk-provider-secret" not in out + err
    steps = [(method, path) for method, path, _, _ in srv.requests]
    w = "/v1/workspaces/ns1/ws1"
    assert steps == [
        ("GET", w),
        ("PUT", w),
        ("PUT", f"{w}/secrets/FAKE_KEY"),
        ("PUT", f"{w}/files"),
        ("PUT", f"{w}/secrets/API_SERVER_KEY"),  # just before the service that uses it
        ("PUT", f"{w}/services/hermes"),
        ("GET", f"{w}/services"),
        ("POST", "/v1/keys"),
    ]
    bodies = {(m, p, q.get("path", [""])[0]): b for m, p, q, b in srv.requests}
    assert json.loads(bodies["PUT", w, ""]) == {"image": "hermes-agent", "persistent": True}
    assert json.loads(bodies["PUT", f"{w}/secrets/FAKE_KEY", ""]) == {"value": "sk-provider-secret"}
    config = yaml.safe_load(bodies["PUT", f"{w}/files", "/home/sandbox/.hermes/config.yaml"])
    assert config["model"] == {
        "provider": "custom",
        "default": "fake-model",
        "base_url": "http://127.0.0.1:9000/v1",
        "key_env": "FAKE_KEY",
    }
    server_key = json.loads(bodies["PUT", f"{w}/secrets/API_SERVER_KEY", ""])["value"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", server_key)  # secrets.token_urlsafe(32): Hermes wants 16+ characters
    assert server_key not in out + err  # the user never needs it: the proxy adds it
    service = json.loads(bodies["PUT", f"{w}/services/hermes", ""])
    assert service == hermes_host.service_spec(8642, "FAKE_KEY", "0.0.0.0")
    for value in ("sk-provider-secret", server_key):  # the service names its secrets, never holds their values
        assert value not in json.dumps(service)
    key = json.loads(bodies["POST", "/v1/keys", ""])
    assert key == {
        "namespace": "ns1",
        "workspace": "ws1",
        "service": "hermes",
        "scopes": ["proxy"],
        "label": "hermes host ws1",
    }


def test_an_existing_workspace_of_the_image_is_reused(scripted, capsys):
    srv = scripted(workspace={"config": {"image": "hermes-agent", "persistent": True}})
    extra = ("--no-provider-key", "--port", "9100", "--listen-host", "127.0.0.1", "--no-wait")
    code, out, err = run_host(srv, capsys, *extra, key=())
    assert code == 0, err
    steps = [(method, path.rsplit("/", 1)[-1]) for method, path, _, _ in srv.requests]
    assert steps == [("GET", "ws1"), ("PUT", "files"), ("PUT", "API_SERVER_KEY"), ("PUT", "hermes"), ("POST", "keys")]
    service = json.loads(srv.requests[3][3])
    assert service == hermes_host.service_spec(9100, None, "127.0.0.1")


def test_each_run_stores_a_new_api_server_key(scripted, capsys):
    srv = scripted()
    for _ in range(2):
        assert run_host(srv, capsys)[0] == 0
    keys = [json.loads(b)["value"] for _, path, _, b in srv.requests if path.endswith("/secrets/API_SERVER_KEY")]
    assert len(keys) == 2 and keys[0] != keys[1]


@pytest.mark.parametrize(
    ("workspace", "message"),
    [
        ({"config": {"image": "hermes", "persistent": True}}, "exists with image 'hermes', not 'hermes-agent'"),
        ({"config": {"image": "hermes-agent", "persistent": False}}, "is ephemeral"),
    ],
)
def test_a_workspace_of_another_kind_is_refused(scripted, capsys, workspace, message):
    srv = scripted(workspace=workspace)
    code, out, err = run_host(srv, capsys)
    assert (code, out) == (1, "")
    assert message in err and len(err.splitlines()) == 1
    assert [m for m, *_ in srv.requests] == ["GET"]  # nothing was changed


def test_a_failed_service_is_reported_and_no_key_minted(scripted, capsys):
    srv = scripted(service_state="failed")
    code, out, err = run_host(srv, capsys)
    assert (code, out) == (1, "")
    assert "service hermes is failed (last exit: code 1" in err and "/services/hermes/logs" in err
    assert ("POST", "/v1/keys") not in [(m, p) for m, p, *_ in srv.requests]


@pytest.mark.parametrize(
    ("extra", "env", "message"),
    [
        ((), {"FAKE_KEY": ""}, "FAKE_KEY is not set"),
        (("--provider-key-from-env", "lower"), {"lower": "x"}, "give an upper-case variable name"),
        (("--provider-key-from-env", "API_SERVER_KEY"), {"API_SERVER_KEY": "x"}, "not one the service sets"),
        (("--provider-key-from-env", "HERMES_HOME"), {"HERMES_HOME": "x"}, "not one the service sets"),
        (("--port", "0"), {}, "give a port from 1 to 65535"),
        (("--listen-host", ""), {}, "give an address such as 0.0.0.0"),
        (("--listen-host", "0.0.0.0 x"), {}, "give an address such as 0.0.0.0"),
        (("--provider-url", "ftp://x"), {}, "give an http(s) URL"),
    ],
)
def test_bad_input_is_one_line_before_any_request(scripted, capsys, extra, env, message):
    srv = scripted()
    code, out, err = run_host(srv, capsys, *extra, env=env)
    assert (code, out) == (125, "")
    assert message in err and len(err.splitlines()) == 1
    assert srv.requests == []


def test_the_server_refusing_is_one_line(scripted, capsys):
    srv = scripted()
    code, out, err = run_host(srv, capsys, env={"FLAREBOX_TOKEN": "wrong"})
    assert (code, out) == (1, "")
    assert err.startswith("flarebox: unauthorized:") and len(err.splitlines()) == 1


def test_the_flarebox_command_has_it(scripted):
    srv = scripted()
    env = {**os.environ, "FLAREBOX_ENDPOINT": srv.url, "FLAREBOX_TOKEN": "deployment-token", "FAKE_KEY": "sk-x"}
    argv = ["hermes", "host", "ws1", "-n", "ns1", "-m", "m", "--provider-key-from-env", "FAKE_KEY"]
    done = subprocess.run(flarebox_command() + argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line.split("=", 1)[0] for line in done.stdout.splitlines()] == ["base_url", "api_key"]
    usage = subprocess.run(flarebox_command() + ["hermes", "host", "ws1"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 125 and "--model" in usage.stderr


# --- the real thing ---------------------------------------------------------------------------------------------

# Inside the workspace: GET Hermes' /v1/models on loopback with the key given (or none); prints the status
PROBE = (
    "import os, sys, urllib.error, urllib.request\n"
    "key = sys.argv[1]\n"
    "headers = {'Authorization': 'Bearer ' + os.environ[key]} if key else {}\n"
    "request = urllib.request.Request('http://127.0.0.1:8642/v1/models', headers=headers)\n"
    "try:\n"
    "    print(urllib.request.urlopen(request, timeout=30).status)\n"
    "except urllib.error.HTTPError as err:\n"
    "    print(err.code)\n"
)


def _wait_service(client: httpx.Client, path: str, name: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        answer = client.get(path)
        assert answer.status_code == 200, answer.text
        service = next((s for s in answer.json()["services"] if s["name"] == name), None)
        if service and service["state"] == "running":
            return service
        assert time.monotonic() < deadline, f"service {name} did not run: {service}"
        time.sleep(0.2)


@pytest.mark.slow
def test_openai_client_chats_with_hosted_hermes_through_the_proxy(hermes_iot):
    openai = pytest.importorskip("openai")  # the dev extra's; the host side of the chat is the real client
    venv = hermes_iot.parent.parent
    ns, ws = "t" + uuid.uuid4().hex[:12], "agent"
    provider_key = "sk-provider-" + uuid.uuid4().hex
    env = {"IMAGES": "hermes,hermes-agent", "IMAGE_BINDS": f"hermes-agent={venv}:/opt/hermes"}
    with serving(env) as srv, srv.client() as client:
        w = f"/v1/workspaces/{ns}/{ws}"
        # the scripted model: a second service of the same workspace (the sandbox has no route to the host)
        assert client.put(w, json={"image": "hermes-agent"}).status_code in (200, 201)
        answer = client.put(f"{w}/files", params={"path": "/workspace/model.py"}, content=FAKE_MODEL.encode())
        assert answer.status_code == 200, answer.text
        model = {
            "command": f"exec /opt/hermes/bin/python -P /workspace/model.py {MODEL_PORT} '{REPLY}'",
            "port": MODEL_PORT,
            "health": {"path": "/v1/models"},
            "restart": "always",
        }
        answer = client.put(f"{w}/services/model", json=model)
        assert answer.status_code in (200, 201), answer.text
        _wait_service(client, f"{w}/services", "model")

        started = time.monotonic()
        done = subprocess.run(
            flarebox_command()
            + ["hermes", "host", ws, "--namespace", ns, "--model", "scripted"]
            + ["--provider-url", f"http://127.0.0.1:{MODEL_PORT}/v1", "--provider-key-from-env", "FAKE_PROVIDER_KEY"],
            env={**srv.client_env(), "FAKE_PROVIDER_KEY": provider_key},
            capture_output=True,
            text=True,
            timeout=300,
        )
        ready_seconds = time.monotonic() - started
        assert done.returncode == 0, f"{done.stderr}\n{srv.output()}"
        lines = done.stdout.splitlines()
        assert len(lines) == 2 and lines[0] == f"base_url={srv.url}/v1/proxy/v1", done.stdout
        assert lines[1].startswith("api_key=") and KEY_SHAPE.fullmatch(lines[1][len("api_key=") :]), done.stdout
        base_url, api_key = lines[0][len("base_url=") :], lines[1][len("api_key=") :]
        assert provider_key not in done.stdout + done.stderr
        print(f"hermes host: service running and key minted in {ready_seconds:.1f} s")

        chat = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
        assert "hermes-agent" in [m.id for m in chat.models.list()]
        reply = chat.chat.completions.create(
            model="hermes-agent", messages=[{"role": "user", "content": "say the scripted words"}]
        )
        assert reply.choices[0].message.content == REPLY
        parts = [
            c.choices[0].delta.content or ""
            for c in chat.chat.completions.create(
                model="hermes-agent", messages=[{"role": "user", "content": "again, streamed"}], stream=True
            )
            if c.choices
        ]
        assert " ".join("".join(parts).split()) == REPLY and len(parts) > 1

        # what reached the model: Hermes' calls with the provider key, never the proxy key or the deployment token
        seen = client.get(f"{w}/ports/{MODEL_PORT}/_seen").json()
        chats = [r for r in seen if r["path"].endswith("/chat/completions")]
        assert chats and all(r["headers"].get("Authorization") == f"Bearer {provider_key}" for r in chats)
        assert any("say the scripted words" in json.dumps(r["body"]) for r in chats)
        for request in seen:
            assert api_key not in json.dumps(request) and srv.token not in json.dumps(request)

        # the proxy key opens that service's /v1 and nothing else; the secret's value is nowhere in the listings
        as_key = {"Authorization": f"Bearer {api_key}"}
        refused = httpx.get(f"{srv.url}/v1/proxy/health", headers=as_key, timeout=30)
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "path_not_allowed")
        assert httpx.get(f"{srv.url}{w}", headers=as_key, timeout=30).status_code == 403
        listings = [client.get(f"{w}/services").text, client.get(f"{w}/secrets").text]
        assert "FAKE_PROVIDER_KEY" in listings[1] and all(provider_key not in text for text in listings)

        # Hermes itself insists on its key: without it a request is refused, with it (what the proxy adds) it is let
        # in; the key is stored as the secret API_SERVER_KEY and is nowhere else the user or the model could see
        assert client.put(f"{w}/files", params={"path": "/workspace/probe.py"}, content=PROBE.encode()).is_success
        probe = "/opt/hermes/bin/python -P /workspace/probe.py"
        assert output_of(exec_events(client, ns, ws, f"{probe} ''")).strip() == "401"
        with_key = exec_events(client, ns, ws, f"{probe} API_SERVER_KEY", secrets=["API_SERVER_KEY"])
        assert output_of(with_key).strip() == "200"
        server_key = output_of(exec_events(client, ns, ws, 'printf %s "$API_SERVER_KEY"', secrets=["API_SERVER_KEY"]))
        assert len(server_key) == 43 and "API_SERVER_KEY" in listings[1]
        assert server_key not in done.stdout + done.stderr + json.dumps(seen) + "".join(listings) + srv.output()

        # stopped (saved) and woken by the next chat: Hermes starts again from its saved home (stale pid files and all)
        assert client.post(f"{w}/stop", timeout=120).status_code == 200
        again = chat.chat.completions.create(model="hermes-agent", messages=[{"role": "user", "content": "awake?"}])
        assert again.choices[0].message.content == REPLY
        assert provider_key not in srv.output() and server_key not in srv.output()
