"""Schemathesis fuzzing of every operation in docs/openapi.yaml against a real `flarebox serve`.

With the deployment token, and with scoped keys minted by the fixture (one for the fuzzer's whole namespace with
every scope a route uses, one for a single workspace with `exec` only), every answer must conform to the spec
(documented status, content type, headers and body; no 5xx; invalid input rejected), every error must carry a code the
spec documents for that status (a key's refusals: `forbidden`), and every exec/reattach stream line must be a valid
ExecEvent ending in exactly one terminal event (schemathesis has no NDJSON support, so that part is checked here).
With a wrong, missing, unknown or revoked credential every operation must answer 401 `unauthorized`.

The fuzzer's commands run in real bubblewrap sandboxes: it works in its own namespace, and exec timeouts are clamped
to a few seconds so a generated `yes` or `sleep` cannot hold the run.
"""

import json
import os
import re
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import schemathesis
import yaml
from e2e import rid, ws_url
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

SPEC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
NAMESPACE = "fuzz"
# The fuzzer's workspace names are steered onto these (and sometimes left random, which is 404 ground).
PERSISTENT, EPHEMERAL = "persist", "ephem"
DOOMED = "doomed"  # DELETE is steered here so the other two survive the run
# The scoped keys the fixture mints: (workspace or None for the whole namespace, scopes)
KEYS = {
    "namespace-key": (None, ["exec", "files", "snapshots", "manage", "proxy"]),
    "workspace-key": (PERSISTENT, ["exec"]),
}
EXEC_TIMEOUT_CAP = 3
# Examples per operation: small for CI; FUZZ_EXAMPLES=500 for a deeper local run.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "30"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]

pytestmark = [pytest.mark.timeout(240)]

schema = schemathesis.openapi.from_path(SPEC_PATH)


@cache
def spec() -> dict:
    return yaml.safe_load(SPEC_PATH.read_text())


def _resolve(node: dict) -> dict:
    while "$ref" in node:
        target = spec()
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


@cache
def documented_codes(path: str, method: str, status: int) -> frozenset[str]:
    """The error codes the spec names (in backticks) for this operation and status."""
    known = set(spec()["components"]["schemas"]["ErrorCode"]["enum"])
    response = _resolve(spec()["paths"][path][method.lower()]["responses"][str(status)])
    return frozenset(code for code in re.findall(r"`([a-z_]+)`", response.get("description", "")) if code in known)


@cache
def event_validator(name: str = "ExecEvent") -> jsonschema.Draft202012Validator:
    # the whole spec as the root, so the event schema's $refs resolve
    root = dict(spec())
    root["$ref"] = f"#/components/schemas/{name}"
    return jsonschema.Draft202012Validator(root)


def check_error_code(case, response) -> None:
    if response.status_code < 400 or not response.content:  # a HEAD answer has no body to read a code from
        return
    code = response.json()["error"]["code"]
    if case.method.upper() != case.operation.method.upper():
        # schemathesis probes methods the route lacks: protocol.md §4 answers those 405 method_not_allowed
        assert (response.status_code, code) == (405, "method_not_allowed"), (case.method, response.text)
        return
    allowed = documented_codes(case.operation.path, case.operation.method, response.status_code)
    where = f"{case.method} {case.operation.path} → {response.status_code}"
    assert code in allowed, f"{where} {code!r}; documented: {sorted(allowed)}"


def check_event_stream(case, response) -> None:
    if response.status_code != 200 or not response.headers.get("content-type", [""])[0].startswith(
        "application/x-ndjson"
    ):
        return
    if PROXIED.search(case.operation.path):
        return  # a service's own answer: its content is its business
    lines = [line for line in response.content.decode("utf-8").split("\n") if line]
    events = [json.loads(line) for line in lines]
    logs = case.operation.path.endswith("/logs")  # a service's log: output and heartbeats, then its end
    for event in events:
        errors = sorted(event_validator("ServiceLogEvent" if logs else "ExecEvent").iter_errors(event), key=str)
        assert not errors, f"invalid event {event}: {errors[0].message}"
    ends = ("service",) if logs else ("exit", "error")
    terminal = [i for i, e in enumerate(events) if e["type"] in ends]
    assert terminal == [len(events) - 1], f"the stream must end with exactly one terminal event: {events}"


# The two proxies: what answers is the service inside the workspace (nothing, in this run: 502 upstream_unavailable
# is the expected answer, not a server error of Flarebox's)
PROXIED = re.compile(r"^/v1/proxy/|/ports/")


def checks_for(case) -> list:
    return [c for c in CHECKS if c is not not_a_server_error] if PROXIED.search(case.operation.path) else CHECKS


# The routes whose `path` query parameter names a file or directory (steered onto the fixture's files)
FILE_ROUTES = ("/files", "/files/stat", "/files/archive")


def _valid_name(value) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", value) is not None


def steer(case) -> None:
    """Point valid names at the fuzzer's own workspaces and bound exec timeouts; invalid values stay invalid."""
    params = case.path_parameters or {}
    if _valid_name(params.get("namespace")):
        params["namespace"] = NAMESPACE
    workspace = params.get("workspace")
    if _valid_name(workspace):
        deleting = case.operation.method.upper() == "DELETE"
        choices = (DOOMED, workspace) if deleting else (PERSISTENT, EPHEMERAL, workspace)
        params["workspace"] = choices[len(workspace) % len(choices)]
    query = case.query if isinstance(case.query, dict) else {}
    if case.operation.path in ("/v1/workspaces", "/v1/audit") and _valid_name(query.get("namespace")):
        # half of the listings ask for the fuzzer's namespace: what a key reaches, not always a 403
        if len(query["namespace"]) % 2 == 0:
            query["namespace"] = NAMESPACE
    path = query.get("path")
    steerable = isinstance(path, str) and path.startswith("/") and "\0" not in path
    if case.operation.path.endswith(FILE_ROUTES) and steerable:
        if len(path) % 2 == 0:
            query["path"] = f"/workspace/f{len(path) % 5}"  # files the fixture wrote: reads that succeed
        elif len(path) % 3 == 0 and case.operation.method.upper() == "GET":
            query["path"] = "/workspace"  # a directory: listings and archives that succeed
    if case.operation.path.endswith("/exec") and isinstance(case.body, dict):
        if isinstance(case.body.get("request_id"), str) and re.fullmatch(r"[0-9a-f]{32}", case.body["request_id"]):
            case.body["request_id"] = rid()  # generated ids repeat (000…): mostly run, not duplicate_request
        timeout = case.body.get("timeout", None)
        if timeout is None or (
            isinstance(timeout, int | float) and not isinstance(timeout, bool) and EXEC_TIMEOUT_CAP < timeout <= 900
        ):
            case.body["timeout"] = EXEC_TIMEOUT_CAP


def ensure_workspace(client, case) -> None:
    """Re-create the steered workspace if an earlier case stopped (ephemeral) or deleted it; 409 means it exists."""
    params = case.path_parameters or {}
    if params.get("namespace") != NAMESPACE or params.get("workspace") not in (PERSISTENT, EPHEMERAL, DOOMED):
        return
    body = {"persistent": params["workspace"] != EPHEMERAL}
    assert client.put(ws_url(NAMESPACE, params["workspace"]), json=body).status_code in (200, 201, 409)


@pytest.fixture(scope="module")
def api(fuzz_server):
    with fuzz_server.client() as client:
        for name, persistent in ((PERSISTENT, True), (EPHEMERAL, False)):
            response = client.put(ws_url(NAMESPACE, name), json={"persistent": persistent})
            assert response.status_code in (200, 201), response.text
            for i in range(5):
                url = ws_url(NAMESPACE, name, "files")
                assert client.put(url, params={"path": f"/workspace/f{i}"}, content=b"x" * i).status_code == 200
        # boot the persistent one now so the fuzz run does not pay for it under its deadline
        body = {"request_id": rid(), "command": "true"}
        with client.stream("POST", ws_url(NAMESPACE, PERSISTENT, "exec"), json=body) as response:
            assert response.status_code == 200
            response.read()
    return fuzz_server


@pytest.fixture(scope="module")
def api_client(api):
    with api.client() as client:
        yield client


@pytest.fixture(scope="module")
def keys(api_client) -> dict[str, str]:
    """The scoped keys of KEYS, and a revoked one, minted with the deployment token."""
    minted = {}
    for name, (workspace, scopes) in {**KEYS, "revoked-key": (None, ["exec"])}.items():
        body = {"namespace": NAMESPACE, "workspace": workspace, "scopes": scopes, "label": f"fuzz {name}"}
        response = api_client.post("/v1/keys", json=body)
        assert response.status_code == 201, response.text
        minted[name] = response.json()["key"]
    revoked_id = minted["revoked-key"].split("_")[1]
    assert api_client.delete(f"/v1/keys/{revoked_id}").status_code == 200
    return minted


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_operations_conform_with_token(case, api, api_client):
    steer(case)
    ensure_workspace(api_client, case)
    headers = api.headers()
    response = case.call(base_url=api.url, headers=headers, timeout=60)
    case.validate_response(response, checks=checks_for(case), headers=headers)
    check_error_code(case, response)
    check_event_stream(case, response)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@pytest.mark.parametrize("key_name", sorted(KEYS))
def test_operations_conform_with_a_scoped_key(case, api, api_client, keys, key_name):
    """Within its reach a key gets the usual answers; outside it, or without the scope, 403 `forbidden` (which the
    spec documents for every operation but health); on the key routes always 403 (or 404 for a malformed id)."""
    steer(case)
    ensure_workspace(api_client, case)
    headers = {"Authorization": f"Bearer {keys[key_name]}"}
    response = case.call(base_url=api.url, headers=headers, timeout=60)
    case.validate_response(response, checks=checks_for(case), headers=headers)
    check_error_code(case, response)
    check_event_stream(case, response)
    sent_key = (
        response.request.headers.get("Authorization") == headers["Authorization"]
    )  # schemathesis drops it at times
    if sent_key and case.operation.path.startswith("/v1/keys") and case.method.upper() == case.operation.method.upper():
        assert response.status_code in (400, 403, 404), response.text  # keys never mint, list or revoke keys


UNKNOWN_KEY = "Bearer fbk_0123456789abcdef_" + "A" * 32  # the shape of a key, minted by no one


@schema.parametrize()
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-token", "Basic dXNlcjpwYXNz", UNKNOWN_KEY, "revoked-key"]
)
def test_operations_refuse_without_valid_token(case, api, keys, authorization):
    steer(case)
    if authorization == "revoked-key":
        authorization = f"Bearer {keys['revoked-key']}"
    headers = {"Authorization": authorization} if authorization else {}
    response = case.call(base_url=api.url, headers=headers, timeout=30)
    assert response.status_code == 401, (response.status_code, response.text)
    if case.method.upper() != "HEAD":  # a HEAD answer has no body
        assert response.json()["error"]["code"] == "unauthorized"
    case.validate_response(
        response,
        checks=[status_code_conformance, content_type_conformance, response_schema_conformance],
        headers=headers,
    )


def test_fuzzing_left_state_only_for_workspaces_that_exist(api, api_client):
    """Runs after the fuzz tests (file order): the many requests on unknown, deleted or invalid names left no state
    behind; every workspace directory belongs to a workspace that exists (one a fuzzed PUT created)."""
    namespaces = api.data_dir / "workspaces"
    for directory in namespaces.glob("*/*"):
        response = api_client.get(ws_url(directory.parent.name, directory.name))
        assert response.status_code == 200, (directory, response.text)
