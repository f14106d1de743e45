"""The workspace's services, secrets and port proxy against the port doubles (durable/services.py, the proxy
handler of durable/workspace.py): definitions outlive containers, secrets are sealed and opened only into what
names them, and a proxied request is work in flight until its last byte."""

import asyncio
import base64
import json

import pytest
from test_workspace import IDLE, Env, body, code
from workspace_doubles import Reply

from durable import operations
from protocol.services import parse_service

pytestmark = pytest.mark.timeout(30)

SECRET = "sk-" + "v" * 40


@pytest.fixture
def env():
    return Env()


async def put_service(env, name="web", **spec):
    spec = {"command": "serve", "port": 3000, **spec}
    return await env.call("put_service", {"name": name, "spec": parse_service(spec).to_json()})


async def proxy(env, path="/", port=3000, service=None, headers=None):
    args = operations.ProxyArgs("GET", path, "", headers or {"accept": "*/*"}, port=port, service=service)
    return await env.ws.call("proxy", args, None)


async def chunks(*parts):
    for part in parts:
        yield part


class Gate:
    """A proxied answer's body that ends when the test says so."""

    def __init__(self):
        self.release = asyncio.Event()

    def __aiter__(self):
        return self._chunks()

    async def _chunks(self):
        yield b"first"
        await self.release.wait()
        yield b"last"


async def test_a_definition_is_stored_asleep_and_started_at_the_next_boot(env):
    await env.put()
    resp = await put_service(env, health={"path": "/health"})
    assert resp.status == 201 and body(resp)["state"] == "stopped" and env.container.starts == []
    assert (await put_service(env, health={"path": "/health"})).status == 200  # the same name again: replaced
    await env.run("echo boot")
    assert env.container.services["web"]["command"] == "serve"
    assert env.container.services["web"]["cwd"] == "/workspace" and env.container.services["web"]["port"] == 3000
    listed = body(await env.call("list_services"))["services"]
    assert [(s["name"], s["state"], s["pid"]) for s in listed] == [("web", "running", 7)]


async def test_a_definition_put_while_running_starts_at_once_and_delete_stops_it(env):
    await env.put()
    await env.run("echo boot")
    assert body(await put_service(env))["state"] == "running" and "web" in env.container.services
    assert body(await env.call("delete_service", {"name": "web"})) == {"name": "web", "deleted": True}
    assert env.container.services == {}
    assert code(await env.call("delete_service", {"name": "web"})) == (404, "service_not_found")


async def test_ports_are_one_service_each_and_named_secrets_must_exist(env):
    await env.put()
    await put_service(env, "a", port=3000)
    assert code(await put_service(env, "b", port=3000)) == (400, "invalid_port")
    assert code(await put_service(env, "b", port=3001, secrets=["NOPE"])) == (404, "secret_not_found")
    assert (await put_service(env, "a", port=3000, command="other")).status == 200  # its own port is fine


async def test_a_secret_is_sealed_at_rest_and_opened_only_into_what_names_it(env):
    await env.put()
    resp = await env.call("put_secret", {"name": "API_KEY", "value": SECRET})
    assert resp.status == 201 and SECRET not in resp.body.decode()
    stored = env.storage.sql("SELECT sealed FROM secrets")[0]["sealed"]
    assert SECRET.encode() not in base64.b64decode(stored)
    assert SECRET not in json.dumps(env.storage.sql("SELECT * FROM meta"))
    await put_service(env, "with", port=3000, secrets=["API_KEY"])
    await put_service(env, "without", port=3001)
    await env.run("echo boot")
    assert env.container.services["with"]["env"] == {"API_KEY": SECRET}
    assert env.container.services["without"]["env"] == {}
    listed = body(await env.call("list_secrets"))["secrets"]
    assert [s["name"] for s in listed] == ["API_KEY"] and SECRET not in json.dumps(listed)
    assert SECRET not in json.dumps(body(await env.call("list_services")))


async def test_an_exec_gets_the_secrets_it_names_and_the_supervisor_never_sees_the_names(env):
    """…and one naming a secret the workspace does not hold is refused before it runs."""
    await env.put()
    await env.call("put_secret", {"name": "API_KEY", "value": SECRET})
    request = {"request_id": "a" * 32, "command": "run", "env": {"A": "1"}, "secrets": ["API_KEY", "GONE"]}
    assert code(await env.call("exec", {"request": request})) == (404, "secret_not_found")
    assert env.container.starts == [] and env.ws.ledger.lookup("a" * 32) is None  # refused: it never ran
    resp = await env.call("exec", {"request": {**request, "secrets": ["API_KEY"]}})
    await env.clock.drain()
    assert resp.status == 200
    sent = env.container.execs[-1]
    assert sent["env"] == {"A": "1", "API_KEY": SECRET} and sent["secrets"] == []


async def test_a_sealed_value_opens_only_where_it_was_stored(env):
    await env.put()
    await env.call("put_secret", {"name": "A", "value": SECRET})
    sealed = env.storage.sql("SELECT sealed FROM secrets WHERE name = 'A'")[0]["sealed"]
    env.storage.sql("INSERT INTO secrets (name, sealed, updated_at_ms) VALUES ('B', ?, 0)", sealed)  # moved
    assert await env.ws.services.open_secrets(("A", "B")) == {"A": SECRET}


async def test_secrets_are_refused_without_a_key_and_deleted_by_name(env):
    await env.put()
    env.ws.services._cipher.available = False
    assert code(await env.call("put_secret", {"name": "A", "value": "x"})) == (503, "secrets_unavailable")
    env.ws.services._cipher.available = True
    await env.call("put_secret", {"name": "A", "value": "x"})
    assert body(await env.call("delete_secret", {"name": "A"})) == {"name": "A", "deleted": True}
    assert code(await env.call("delete_secret", {"name": "A"})) == (404, "secret_not_found")


async def test_the_proxy_wakes_the_workspace_and_refuses_paths_outside_allow_paths(env):
    await env.put()
    await put_service(env, allow_paths=["/public"])
    env.container.port_answers[3000] = Reply(200, chunks(b"hel", b"lo"), {"content-type": "text/plain"})
    assert code(await proxy(env, "/private")) == (403, "path_not_allowed") and env.container.starts == []
    resp = await proxy(env, "/public/a b")
    await env.clock.drain()
    assert resp.status == 200 and bytes(resp.body.data) == b"hello" and len(env.container.starts) == 1
    port, method, path, headers = env.container.port_calls[-1]
    assert (port, method, path, headers) == (3000, "GET", "/public/a%20b", {"accept": "*/*"})
    assert ("content-type", "text/plain") in resp.header_pairs


async def test_a_port_without_a_service_is_reached_as_is_and_nothing_listening_is_502(env):
    await env.put()
    env.container.port_answers[8000] = Reply(200, chunks(b"ok"))
    assert (await proxy(env, "/anything", port=8000)).status == 200
    assert code(await proxy(env, "/", port=8001)) == (502, "upstream_unavailable")


async def test_the_key_resolved_proxy_reaches_its_service_by_name(env):
    await env.put()
    await put_service(env, "chat", port=4000)
    env.container.port_answers[4000] = Reply(200, chunks(b"chat"))
    assert (await proxy(env, "/v1/models", port=None, service="chat")).status == 200
    assert env.container.port_calls[-1][0] == 4000
    assert code(await proxy(env, "/", port=None, service="gone")) == (404, "service_not_found")


async def test_a_proxied_answer_keeps_the_workspace_awake_until_its_last_byte(env):
    await env.put()
    gate = Gate()
    env.container.port_answers[3000] = Reply(200, gate)
    resp = await proxy(env, "/stream")
    await env.clock.advance(0)
    await env.fire_alarm_at_deadline()
    assert env.state == "running"  # a request is still flowing
    assert env.alarm.at_ms == env.clock.now_ms() + IDLE * 1000
    gate.release.set()
    await env.clock.drain()
    assert bytes(resp.body.data) == b"firstlast" and resp.body.closed
    await env.fire_alarm_at_deadline()
    assert env.state == "stopped"  # a running service alone keeps nothing awake


async def test_an_upstream_that_fails_midway_aborts_the_answer(env):
    from durable.ports import ContainerGone

    async def broken():
        yield b"partial"
        raise ContainerGone("gone")

    await env.put()
    env.container.port_answers[3000] = Reply(200, broken())
    resp = await proxy(env)
    await env.clock.drain()
    assert bytes(resp.body.data) == b"partial" and getattr(resp.body, "aborted", False)


async def test_deleting_the_workspace_forgets_its_services_and_secrets(env):
    await env.put()
    await put_service(env)
    await env.call("put_secret", {"name": "A", "value": SECRET})
    await env.call("delete", {})
    await env.put()
    assert body(await env.call("list_services")) == {"services": []}
    assert body(await env.call("list_secrets")) == {"secrets": []}


async def test_a_service_with_a_bearer_secret_gets_its_own_key_and_never_the_callers(env):
    await env.put()
    assert code(await put_service(env, bearer_secret="API_SERVER_KEY")) == (404, "secret_not_found")
    await env.call("put_secret", {"name": "API_SERVER_KEY", "value": SECRET})
    await put_service(env, bearer_secret="API_SERVER_KEY")
    env.container.port_answers[3000] = Reply(200, chunks(b"ok"))
    await proxy(env, "/v1/models")
    assert env.container.port_calls[-1][3] == {"accept": "*/*", "authorization": f"Bearer {SECRET}"}
    listed = body(await env.call("list_services"))["services"]
    assert listed[0]["bearer_secret"] == "API_SERVER_KEY" and SECRET not in json.dumps(listed)


async def test_a_proxied_request_during_a_save_waits_for_it_then_proceeds(env):
    await env.put()
    await env.run("echo boot")
    env.container.port_answers[3000] = Reply(200, chunks(b"after the save"))
    env.container.snapshot_gate = asyncio.Event()
    saving = asyncio.ensure_future(env.call("snapshot"))
    await env.clock.advance(0)
    assert env.state == "saving"
    proxied = asyncio.ensure_future(proxy(env, "/"))
    await env.clock.advance(0)
    assert not proxied.done() and env.container.port_calls == []  # it waits for the save...
    env.container.snapshot_gate.set()
    assert (await saving).status == 200
    resp = await proxied
    await env.clock.drain()
    assert resp.status == 200 and bytes(resp.body.data) == b"after the save"  # ...then proceeds
    assert len(env.container.starts) == 1  # on the same container
