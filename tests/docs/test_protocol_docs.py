"""docs/protocol.md and docs/openapi.yaml say what src/protocol says.

A code, limit, event type, phase, container state or exit reason added to src/protocol without being documented in
both files fails here; so does a route dropped from either document, or a schema that rejects what the code emits.
Routes, the scope each one needs and whether it is audited are read from src/worker/routes.py; settings from
src/durable/settings.py; key shapes and scopes from src/protocol/keys.py.
"""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi

from directory.directory import Directory
from durable.ports import BackupInfo, Response, SnapshotInfo
from durable.settings import SETTING_VARS, Settings
from flarebox_supervisor import filetree, processes, treeops
from protocol import (
    ERRORS,
    LIMITS,
    ProtocolError,
    error_body,
    error_event,
    exit_event,
    heartbeat_event,
    limits,
    output_event,
    parse_exec_request,
    parse_workspace_config,
    pty,
    started_event,
    status_event,
)
from protocol import events as ev
from protocol.files import ENTRY_TYPES, SIGNALS, parse_mkdir_request, parse_move_request, parse_signal_request
from protocol.keys import KEY_ID_PATTERN, KEY_PATTERN, SCOPES, parse_key_request
from protocol.snapshots import parse_fork_source, parse_restore_request, parse_snapshot_patch, parse_snapshot_request
from standalone.storage import SqliteStorage
from worker.authorize import ADMIN_ONLY, ANY_SCOPE
from worker.edge import Edge
from worker.request import EdgeRequest
from worker.routes import DEPLOYMENT_ROUTES, WORKSPACE_ROUTES, DeploymentEndpoint, Endpoint

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_MD = ROOT / "docs" / "protocol.md"
OPENAPI = ROOT / "docs" / "openapi.yaml"
W = "/v1/workspaces/{namespace}/{workspace}"
RID = "0123456789abcdef0123456789abcdef"
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")

# The routes of protocol v1 as first designed (the team's starting design, ../shared/DESIGN.md §3, outside this
# repository; docs/protocol.md is the normative text). "…" there stands for W.
DESIGN_ROUTES = {
    ("GET", "/v1/health"),
    ("PUT", W),
    ("GET", W),
    ("DELETE", W),
    ("POST", W + "/exec"),
    ("GET", W + "/exec/{request_id}"),
    ("POST", W + "/exec/{request_id}/cancel"),
    ("GET", W + "/files"),
    ("PUT", W + "/files"),
    ("POST", W + "/snapshot"),
    ("GET", W + "/snapshots"),
    ("POST", W + "/stop"),
}


@pytest.fixture(scope="module")
def spec() -> dict:
    return yaml.safe_load(OPENAPI.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def doc() -> str:
    return PROTOCOL_MD.read_text(encoding="utf-8")


def schema_validator(spec: dict, name: str) -> Draft202012Validator:
    """A JSON Schema 2020-12 validator for one component schema; its $refs resolve inside the spec's components."""
    root = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": spec["components"],
        "$ref": f"#/components/schemas/{name}",
    }
    return Draft202012Validator(root)


def section(doc: str, heading_start: str) -> str:
    """The text of the `## ` section whose heading starts with heading_start, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(heading_start)}.*?$(.*?)(?=^## |\Z)", doc, re.M | re.S)
    assert match, f"protocol.md has no section '## {heading_start}'"
    return match.group(1)


def table_rows(text: str) -> list[list[str]]:
    """Cells of every markdown table row in text (header and separator rows included); `\\|` is not a separator."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("|") and line.endswith("|"):
            cells = re.split(r"(?<!\\)\|", line[1:-1])
            rows.append([cell.strip() for cell in cells])
    return rows


def fenced_blocks(doc: str) -> list[tuple[str, str]]:
    """(language, text) of every fenced code block, indented ones (inside list items) included."""
    blocks, lang, lines = [], None, []
    for line in doc.splitlines():
        fence = re.fullmatch(r" *```(\w*)", line)
        if fence and lang is None:
            lang, lines = fence.group(1), []
        elif fence:
            blocks.append((lang, "\n".join(line.strip() for line in lines)))
            lang = None
        elif lang is not None:
            lines.append(line)
    assert lang is None, "an unclosed code fence in protocol.md"
    return blocks


def code_cell(cell: str) -> str | None:
    match = re.fullmatch(r"`([^`]+)`", cell)
    return match.group(1) if match else None


def operations(spec: dict) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in spec["paths"].items() for method in item if method in HTTP_METHODS}


def route_template(spec: dict, path: str) -> str:
    """The OpenAPI path a curl example's path stands for: itself when the spec has it, else the one template it
    fills in — a service or secret name, a port, and `{path}` (the proxied rest of the path, any number of
    segments, possibly none)."""
    if path in spec["paths"]:
        return path
    matches = []
    for template in spec["paths"]:
        parts = re.split(r"(\{[a-z_]+\})", template)
        pattern = "".join(
            ".*" if part == "{path}" else "[^/]+" if part.startswith("{") else re.escape(part) for part in parts
        )
        if re.fullmatch(pattern, path):
            matches.append(template)
    assert len(matches) <= 1, f"{path} fills in several routes: {matches}"
    return matches[0] if matches else path


def code_routes() -> dict[tuple[str, str], Endpoint | DeploymentEndpoint]:
    """(method, OpenAPI path) → endpoint, for every route of src/worker/routes.py."""
    routes: dict[tuple[str, str], Endpoint | DeploymentEndpoint] = {}
    for rest, methods in WORKSPACE_ROUTES.items():
        path = W + "".join("/" + ("{request_id}" if seg == "{id}" else seg) for seg in rest)
        routes.update({(method, path): endpoint for method, endpoint in methods.items()})
    for segments, methods in DEPLOYMENT_ROUTES.items():
        path = "/v1" + "".join("/" + ("{key_id}" if seg == "{key}" else seg) for seg in segments)
        routes.update({(method, path): endpoint for method, endpoint in methods.items()})
    return routes


def doc_route(span: str) -> tuple[str, str] | None:
    """`POST W/exec` or `DELETE /v1/keys/{key_id}` (a code span of protocol.md) as (method, OpenAPI path). The port
    proxies also take HEAD, PATCH and OPTIONS."""
    match = re.fullmatch(r"(GET|HEAD|PUT|POST|PATCH|DELETE|OPTIONS) (W|/v1)(\S*)", span)
    if not match:
        return None
    return match.group(1), (W if match.group(2) == "W" else "/v1") + match.group(3)


def documented_codes(spec: dict, method: str, path: str, status: str) -> set[str]:
    response = spec["paths"][path][method.lower()]["responses"].get(status)
    if response is None:
        return set()
    described = spec["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]["description"]
    return set(re.findall(r"`([a-z_]+)`", described)) & set(ERRORS)


# --- the OpenAPI document itself --------------------------------------------------------------------------------


def test_openapi_is_valid_openapi_3_1(spec):
    assert spec["openapi"].startswith("3.1")
    validate_openapi(spec)


def test_server_and_global_bearer_auth(spec):
    assert {"url": "http://127.0.0.1:8787"}.items() <= spec["servers"][0].items()
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {
        **spec["components"]["securitySchemes"]["bearerAuth"],
        "type": "http",
        "scheme": "bearer",
    }
    assert spec["security"] == [{"bearerAuth": []}]
    for path, item in spec["paths"].items():
        for method in item:
            if method in HTTP_METHODS:
                # an operation-level `security` would override the global one (e.g. [] = no auth)
                assert "security" not in item[method], f"{method.upper()} {path} overrides the bearer auth"


# --- error codes ------------------------------------------------------------------------------------------------


def test_error_code_enum_is_exactly_protocol_errors(spec):
    enum = spec["components"]["schemas"]["ErrorCode"]["enum"]
    assert len(enum) == len(set(enum)), "duplicate codes in the ErrorCode enum"
    assert set(enum) == set(ERRORS), f"missing: {set(ERRORS) - set(enum)}, extra: {set(enum) - set(ERRORS)}"


def test_every_error_code_is_in_the_doc_table_with_its_status(doc):
    documented = {}
    for cells in table_rows(section(doc, "10. Error codes")):
        code = code_cell(cells[0])
        if code and len(cells) >= 4:
            assert code not in documented, f"{code} appears twice in the error table"
            assert cells[2] and cells[3], f"{code} needs a meaning and what to do next"
            documented[code] = int(cells[1])
    assert documented == {code: status for code, (status, _) in ERRORS.items()}


def test_error_bodies_and_stream_errors_match_the_schemas(spec):
    body_schema = schema_validator(spec, "Error")
    event_schema = schema_validator(spec, "ExecEvent")
    for code in ERRORS:
        body_schema.validate(error_body(code))
        event_schema.validate(error_event(code))
    # strict: an unknown code or an extra field is not a protocol error body
    assert not body_schema.is_valid({"error": {"code": "no_such_code", "message": "x"}})
    assert not body_schema.is_valid({"error": {"code": "internal_error", "message": "x", "detail": 1}})
    assert not body_schema.is_valid({**error_body("internal_error"), "extra": True})


def test_stream_error_codes_in_the_doc_are_real_codes(doc):
    text = section(doc, "7. The exec stream")
    table = text[text.index("The codes that appear in streams") :].split("\n###")[0]
    named = {code for cells in table_rows(table) for code in re.findall(r"`([a-z_]+)`", cells[0])}
    assert named and named <= set(ERRORS), named - set(ERRORS)


def test_every_operation_answers_401_and_503_with_the_error_schema(spec):
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method not in HTTP_METHODS:
                continue
            responses = op["responses"]
            for status in ("400", "401", "431", "500", "503"):
                assert status in responses, f"{method.upper()} {path} does not document {status}"
            for status, response in responses.items():
                if not status.startswith(("4", "5")):
                    continue
                ref = response["$ref"]
                content = spec["components"]["responses"][ref.rsplit("/", 1)[1]]["content"]
                assert content == {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


def test_every_error_status_in_the_table_has_a_shared_response(spec):
    statuses = {str(status) for status, _ in ERRORS.values()}
    used = {
        status
        for item in spec["paths"].values()
        for op in item.values()
        if isinstance(op, dict)
        for status in op.get("responses", {})
    }
    # 404 not_found and 405 method_not_allowed are answers to routes that do not exist, so no operation lists them
    assert statuses - used <= {"405"}, statuses - used


# --- limits -----------------------------------------------------------------------------------------------------


def test_x_flarebox_limits_equal_protocol_limits(spec):
    documented = spec["x-flarebox-limits"]
    assert documented == LIMITS
    for name, value in LIMITS.items():
        assert type(documented[name]) is type(value), f"{name}: {documented[name]!r} is not {value!r}"


def test_every_limit_is_in_the_doc_table_with_its_value(doc):
    documented = {}
    for cells in table_rows(section(doc, "11. Limits")):
        name, value = code_cell(cells[0]), code_cell(cells[1]) if len(cells) > 1 else None
        if name and value:
            assert cells[2], f"{name} needs a meaning"
            documented[name] = ast.literal_eval(value)
    assert documented == LIMITS
    for name, value in LIMITS.items():
        assert type(documented[name]) is type(value), name


# --- routes -----------------------------------------------------------------------------------------------------


def test_design_routes_exist_in_openapi(spec):
    assert DESIGN_ROUTES <= operations(spec), DESIGN_ROUTES - operations(spec)


def test_openapi_operations_are_exactly_the_routes_of_the_code(spec):
    """WORKSPACE_ROUTES and DEPLOYMENT_ROUTES (keys, the workspace list, the audit log, health) against the paths."""
    assert operations(spec) == set(code_routes()), operations(spec) ^ set(code_routes())


def test_design_md_routes_exist_in_openapi(spec):
    """If the architecture document sits beside the repository (as in the team's checkout), read §3 from it too."""
    design = ROOT.parent / "shared" / "DESIGN.md"
    if not design.exists():
        pytest.skip("DESIGN.md is not beside the repository")
    outline = section(design.read_text(encoding="utf-8"), "3. Protocol v1")
    routes = set()
    for method, path in re.findall(r"^(GET|PUT|POST|DELETE)\s+(\S+)", outline, re.M):
        path = path.split("?")[0].replace("…", W)
        routes.add((method, path))
    assert routes and routes <= operations(spec), routes - operations(spec)


def test_doc_route_table_matches_openapi(doc, spec):
    glance = re.search(r"^### 6\.0 .*?$(.*?)(?=^### )", doc, re.M | re.S).group(1)
    routes = set()
    for cells in table_rows(glance):
        method, path = code_cell(cells[0]), code_cell(cells[1]) if len(cells) > 1 else None
        if method and path:
            routes.add((method, path.split("?")[0]))
    assert routes == operations(spec)


def test_parameters_and_schemas_carry_the_protocol_patterns(spec):
    schemas = spec["components"]["schemas"]
    params = spec["components"]["parameters"]
    assert schemas["Name"]["pattern"] == limits.NAME_PATTERN
    assert schemas["RequestId"]["pattern"] == limits.REQUEST_ID_PATTERN
    assert schemas["InstanceType"]["enum"] == list(limits.INSTANCE_TYPES)
    env = schemas["ExecRequest"]["properties"]["env"]["anyOf"][0]
    assert env["propertyNames"]["pattern"] == limits.ENV_NAME_PATTERN
    assert env["maxProperties"] == limits.MAX_ENV_VARS
    for path, item in spec["paths"].items():
        declared = {p["$ref"].rsplit("/", 1)[1] for p in item.get("parameters", [])}
        for name, component in (("namespace", "Namespace"), ("workspace", "Workspace"), ("request_id", "RequestId")):
            assert (f"{{{name}}}" in path) == (component in declared), f"{path}: {name}"
    assert params["Namespace"]["schema"] == {"$ref": "#/components/schemas/Name"}
    assert params["RequestId"]["schema"] == {"$ref": "#/components/schemas/RequestId"}
    for path, item in spec["paths"].items():
        declared = {p["$ref"].rsplit("/", 1)[1] for p in item.get("parameters", [])}
        assert ("{key_id}" in path) == ("KeyId" in declared), path
    assert params["KeyId"]["schema"] == {"$ref": "#/components/schemas/KeyId"}
    assert schemas["KeyId"]["pattern"] == KEY_ID_PATTERN
    assert schemas["MintedKey"]["properties"]["key"]["pattern"] == f"^{KEY_PATTERN}$"
    assert schemas["Scope"]["enum"] == list(SCOPES)
    assert schemas["KeyLabel"]["maxLength"] == limits.MAX_KEY_LABEL_CHARS
    expires = schemas["KeyRequest"]["properties"]["expires_in"]["anyOf"][0]
    assert (expires["minimum"], expires["maximum"]) == (1, limits.MAX_KEY_EXPIRES_IN_SECONDS)
    assert (params["Limit"]["schema"]["minimum"], params["Limit"]["schema"]["maximum"]) == (1, limits.MAX_PAGE_RECORDS)
    # the minted key is the key object plus `key`
    key, minted = schemas["Key"], schemas["MintedKey"]
    assert minted["properties"] == {**key["properties"], "key": minted["properties"]["key"]}
    assert minted["required"] == [*key["required"], "key"]


def test_every_curl_example_route_exists_and_every_route_has_one(doc, spec):
    seen = set()
    for lang, block in fenced_blocks(doc):
        if lang != "sh":
            continue
        for command in block.replace("\\\n", " ").splitlines():
            if not command.lstrip().startswith("curl "):
                continue
            url = re.search(r'"\$(W|FLAREBOX_URL)([^"?]*)', command)
            assert url, f"curl example without $W or $FLAREBOX_URL: {command}"
            path = (W if url.group(1) == "W" else "") + url.group(2)
            path = path.replace("$RID", "{request_id}").replace("$KEY_ID", "{key_id}")
            path = route_template(spec, path)
            explicit = re.search(r"-X (\w+)", command)
            sends_body = re.search(r"(^| )(-d|--data-binary|--data) ", command) and " -G " not in command
            method = explicit.group(1) if explicit else ("POST" if sends_body else "GET")
            assert (method, path) in operations(spec), f"no such route: {method} {path} in {command}"
            seen.add((method, path))
    assert seen == operations(spec), operations(spec) - seen


# --- request bodies ---------------------------------------------------------------------------------------------


def test_json_request_bodies_are_closed(spec):
    for path, item in spec["paths"].items():
        for method, op in item.items():
            content = op.get("requestBody", {}).get("content", {}) if method in HTTP_METHODS else {}
            if "application/json" in content:
                ref = content["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
                assert spec["components"]["schemas"][ref]["additionalProperties"] is False, f"{method} {path}"
    file_put = spec["paths"][W + "/files"]["put"]["requestBody"]
    assert list(file_put["content"]) == ["application/octet-stream"]


GOOD_EXEC = [
    {"request_id": RID, "command": "echo hi"},
    {
        "request_id": RID,
        "command": "cat",
        "timeout": 0.5,
        "stdin": "a\n",
        "login": True,
        "cwd": "/workspace/a b",
        "env": {},
    },
    {"request_id": RID, "command": "", "timeout": None, "stdin": None, "cwd": None, "env": None},
    {"request_id": RID, "command": "env", "timeout": 900, "env": {"_X1": "ü"}},
]
BAD_EXEC = [
    {"request_id": RID, "command": "x", "shell": "zsh"},
    {"request_id": RID.upper(), "command": "x"},
    {"request_id": RID[:-1], "command": "x"},
    {"command": "x"},
    {"request_id": RID},
    {"request_id": RID, "command": "a\x00b"},
    {"request_id": RID, "command": 5},
    {"request_id": RID, "command": "x", "timeout": 0},
    {"request_id": RID, "command": "x", "timeout": 901},
    {"request_id": RID, "command": "x", "timeout": True},
    {"request_id": RID, "command": "x", "timeout": "10"},
    {"request_id": RID, "command": "x", "login": None},
    {"request_id": RID, "command": "x", "cwd": "relative"},
    {"request_id": RID, "command": "x", "env": {"1BAD": "v"}},
    {"request_id": RID, "command": "x", "env": {"A": 1}},
    {"request_id": RID, "command": "x", "env": {"A": "a\x00"}},
    {"request_id": RID, "command": "x", "stdin": 3},
]


@pytest.mark.parametrize("body", GOOD_EXEC)
def test_exec_requests_the_code_accepts_match_the_schema(spec, body):
    schema = schema_validator(spec, "ExecRequest")
    schema.validate(body)
    schema.validate(parse_exec_request(body).to_json())


@pytest.mark.parametrize("body", BAD_EXEC)
def test_exec_requests_the_code_rejects_the_schema_rejects(spec, body):
    with pytest.raises(ProtocolError):
        parse_exec_request(body)
    assert not schema_validator(spec, "ExecRequest").is_valid(body)


@pytest.mark.parametrize(
    "body, ok",
    [
        ({}, True),
        ({"image": "hermes", "instance": "standard-4", "persistent": False, "cwd": "/workspace/p"}, True),
        ({"instance": None}, True),
        ({"instance": "huge"}, False),
        ({"image": "bad image"}, False),
        ({"persistent": "yes"}, False),
        ({"cwd": "workspace"}, False),
        ({"size": 3}, False),
    ],
)
def test_workspace_configs_agree_with_the_schema(spec, body, ok):
    schema = schema_validator(spec, "WorkspaceConfigRequest")
    assert schema.is_valid(body) is ok
    if ok:
        parse_workspace_config(body)
    else:
        with pytest.raises(ProtocolError):
            parse_workspace_config(body)


# --- events -----------------------------------------------------------------------------------------------------


def event_schemas(spec) -> dict[str, dict]:
    schemas = spec["components"]["schemas"]
    by_type = {}
    for ref in schemas["ExecEvent"]["oneOf"]:
        schema = schemas[ref["$ref"].rsplit("/", 1)[1]]
        by_type[schema["properties"]["type"]["const"]] = schema
    return by_type


def test_event_types_phases_states_and_reasons_match_protocol_events(spec):
    by_type = event_schemas(spec)
    assert set(by_type) == set(ev.EVENT_TYPES)
    assert set(spec["components"]["schemas"]["ExecEvent"]["discriminator"]["mapping"]) == set(ev.EVENT_TYPES)
    assert by_type["status"]["properties"]["phase"]["enum"] == list(ev.STATUS_PHASES)
    assert by_type["started"]["properties"]["container"]["enum"] == list(ev.CONTAINER_STATES)
    assert by_type["exit"]["properties"]["reason"]["enum"] == list(ev.EXIT_REASONS)
    assert by_type["error"]["properties"]["code"] == {"$ref": "#/components/schemas/ErrorCode"}
    assert by_type["output"]["properties"]["data"]["maxLength"] == LIMITS["MAX_OUTPUT_FRAME_CHARS"]


def test_events_the_code_emits_match_the_schema(spec):
    schema = schema_validator(spec, "ExecEvent")
    standalone = SnapshotInfo("s-1764406800123-9f2c1a", 10, 1_764_406_800_123).to_wire()  # expires_at: null
    cloudflare = SnapshotInfo("snap-1", 0, 1_764_406_800_123, 1_764_406_800_123 + 30 * 86_400_000).to_wire()
    emitted = [heartbeat_event(), output_event("héllo ✓\n", 0), output_event("x" * 16384, 7)]
    emitted += [status_event(phase) for phase in ev.STATUS_PHASES] + [status_event("restoring", "from snap-1")]
    emitted += [started_event(RID, state) for state in ev.CONTAINER_STATES]
    emitted += [started_event(RID, "restored", snapshot) for snapshot in (standalone, cloudflare)]
    labelled = SnapshotInfo("s-1764406800123-9f2c1a", 10, 1_764_406_800_123, label="before-migration", kept=True)
    backup = BackupInfo("b-1764406800123-9f2c1a", 73_400_320, 1_764_406_800_123, "ab" * 32).to_wire()
    emitted += [started_event(RID, "restored", labelled.to_wire()), started_event(RID, "restored", None, backup)]
    emitted += [
        exit_event(code, reason, 12)
        for reason, code in (("exited", 0), ("exited", 255), ("timeout", 124), ("cancelled", 130), ("signal", 137))
    ]
    for event in emitted:
        schema.validate(json.loads(ev.encode_event(event)))


def test_snapshot_objects_the_code_answers_match_the_schema(spec):
    standalone = SnapshotInfo("s-1764406800123-9f2c1a", 10, 1_764_406_800_123).to_wire()
    cloudflare = SnapshotInfo("snap-1", 0, 1_764_406_800_123, 1_764_406_800_123 + 30 * 86_400_000).to_wire()
    assert standalone["expires_at"] is None and cloudflare["expires_at"] == "2025-12-29T09:00:00.123Z"
    for snap in (standalone, cloudflare):
        schema_validator(spec, "Snapshot").validate(snap)
    schema_validator(spec, "SnapshotList").validate({"snapshots": [cloudflare, standalone]})
    without = {k: v for k, v in standalone.items() if k != "expires_at"}
    assert not schema_validator(spec, "Snapshot").is_valid(without)  # always there, null when it never expires
    labelled = SnapshotInfo("s-1764406800123-9f2c1a", 10, 1_764_406_800_123, label="before-migration ✓", kept=True)
    schema_validator(spec, "Snapshot").validate(labelled.to_wire())
    for field in ("label", "kept"):
        assert not schema_validator(spec, "Snapshot").is_valid({k: v for k, v in standalone.items() if k != field})
    backup = BackupInfo("b-1764406800123-9f2c1a", 73_400_320, 1_764_406_800_123, "ab" * 32).to_wire()
    schema_validator(spec, "Backup").validate(backup)
    schema_validator(spec, "BackupList").validate({"backups": [backup]})
    schema_validator(spec, "ImportResult").validate({"files": 3, "bytes": 120, "snapshot": labelled.to_wire()})
    restored = {"snapshot": labelled.to_wire(), "safety_snapshot": None, "state": "stopped"}
    schema_validator(spec, "RestoreResult").validate(restored)
    from_backup = {"backup": backup, "safety_snapshot": standalone, "state": "stopped"}
    schema_validator(spec, "RestoreResult").validate(from_backup)
    assert not schema_validator(spec, "RestoreResult").is_valid({**restored, "backup": backup})


# (schema, the code's parser, body, accepted?) for the snapshot routes' bodies and a fork's `from`
SNAPSHOT_BODIES = [
    ("SnapshotRequest", parse_snapshot_request, {}, True),
    ("SnapshotRequest", parse_snapshot_request, {"label": "before-migration", "keep": True}, True),
    ("SnapshotRequest", parse_snapshot_request, {"label": None, "keep": False}, True),
    ("SnapshotRequest", parse_snapshot_request, {"label": "x" * 100}, True),
    ("SnapshotRequest", parse_snapshot_request, {"label": "x" * 101}, False),
    ("SnapshotRequest", parse_snapshot_request, {"label": ""}, False),
    ("SnapshotRequest", parse_snapshot_request, {"label": "two\nlines"}, False),
    ("SnapshotRequest", parse_snapshot_request, {"label": 5}, False),
    ("SnapshotRequest", parse_snapshot_request, {"keep": "yes"}, False),
    ("SnapshotRequest", parse_snapshot_request, {"pin": True}, False),
    ("SnapshotPatch", parse_snapshot_patch, {"label": None}, True),
    ("SnapshotPatch", parse_snapshot_patch, {"keep": False}, True),
    ("SnapshotPatch", parse_snapshot_patch, {"label": "done", "keep": True}, True),
    ("SnapshotPatch", parse_snapshot_patch, {}, False),
    ("SnapshotPatch", parse_snapshot_patch, {"keep": None}, False),
    ("SnapshotPatch", parse_snapshot_patch, {"label": "tab\there"}, False),
    ("RestoreRequest", parse_restore_request, {"snapshot": "latest"}, True),
    ("RestoreRequest", parse_restore_request, {"snapshot": "s-1764406800123-9f2c1a", "discard_changes": True}, True),
    ("RestoreRequest", parse_restore_request, {"backup": "b-1764406800123-9f2c1a"}, True),
    ("RestoreRequest", parse_restore_request, {}, False),
    ("RestoreRequest", parse_restore_request, {"discard_changes": True}, False),
    ("RestoreRequest", parse_restore_request, {"snapshot": "latest", "backup": "b-1764406800123-9f2c1a"}, False),
    ("RestoreRequest", parse_restore_request, {"snapshot": "../etc"}, False),
    ("RestoreRequest", parse_restore_request, {"snapshot": ""}, False),
    ("RestoreRequest", parse_restore_request, {"backup": "b-1"}, False),
    ("RestoreRequest", parse_restore_request, {"snapshot": "latest", "discard_changes": "yes"}, False),
    ("RestoreRequest", parse_restore_request, {"snapshot": "latest", "force": True}, False),
    ("ForkSource", parse_fork_source, {"namespace": "personal", "workspace": "demo"}, True),
    ("ForkSource", parse_fork_source, {"namespace": "personal", "workspace": "demo", "snapshot": "latest"}, True),
    ("ForkSource", parse_fork_source, {"namespace": "personal", "workspace": "demo", "snapshot": None}, True),
    ("ForkSource", parse_fork_source, {"namespace": "personal"}, False),
    ("ForkSource", parse_fork_source, {"namespace": "Bad", "workspace": "demo"}, False),
    ("ForkSource", parse_fork_source, {"namespace": "personal", "workspace": "demo", "snapshot": "a b"}, False),
    ("ForkSource", parse_fork_source, {"namespace": "personal", "workspace": "demo", "image": "hermes"}, False),
]


@pytest.mark.parametrize("name, parse, body, ok", SNAPSHOT_BODIES)
def test_snapshot_route_bodies_agree_with_the_schemas(spec, name, parse, body, ok):
    assert schema_validator(spec, name).is_valid(body) is ok
    if ok:
        parse(dict(body))
    else:
        with pytest.raises(ProtocolError):
            parse(dict(body))


@pytest.mark.parametrize(
    "event",
    [
        {"type": "nonsense"},
        {"type": "heartbeat", "extra": 1},
        {"type": "status", "phase": "booting"},
        {"type": "started", "request_id": RID, "container": "reused", "snapshot": None},
        {"type": "output", "data": "", "offset": 0},
        {"type": "output", "data": "x", "offset": -1},
        {"type": "exit", "exit_code": 0, "reason": "finished", "duration_ms": 1},
        {"type": "exit", "exit_code": 0, "reason": "exited"},
        {"type": "error", "code": "oops", "message": "x"},
    ],
)
def test_the_event_schema_is_strict(spec, event):
    assert not schema_validator(spec, "ExecEvent").is_valid(event)


def test_doc_event_examples_are_valid_streams(doc, spec):
    schema = schema_validator(spec, "ExecEvent")
    streams = [
        [json.loads(line) for line in block.splitlines()]
        for lang, block in fenced_blocks(doc)
        if lang == "" and block.startswith('{"type":')
    ]
    assert len(streams) >= 2
    for events in streams:
        offset = 0
        for event in events:
            schema.validate(event)
            if event["type"] == "output":
                assert event["offset"] == offset, f"offsets in the example are not contiguous: {event}"
                offset += len(event["data"])
        assert ev.is_terminal(events[-1]), "an example stream ends with its terminal event"


def test_doc_json_examples_match_their_schemas(doc, spec):
    blocks = [json.loads(block) for lang, block in fenced_blocks(doc) if lang == "json"]
    # the first field an example has names its schema (an audit record has `command` too: `seq` comes first)
    kinds = {
        "error": "Error",
        "seq": "AuditRecord",
        "key": "MintedKey",
        "scopes": "KeyRequest",
        "state": "Status",
        "command": "ExecRequest",
        "mtime": "FileEntry",
    }
    checked = set()
    for block in blocks:
        kind = next(kinds[key] for key in kinds if key in block)
        schema_validator(spec, kind).validate(block)
        checked.add(kind)
    assert checked == set(kinds.values())


# --- authorization, scoped keys and the audit log ----------------------------------------------------------------

NEEDS = {"any credential": ANY_SCOPE, "any scope": ANY_SCOPE, "the deployment token only": ADMIN_ONLY}


def test_the_scope_table_is_what_each_route_needs(doc):
    """§3.2 names, for every route, the scope a key needs (or "any", or the deployment token only): routes.py's."""
    text = section(doc, "3. Authentication")
    table = text[text.index("### 3.2") :].split("\n### ")[0]
    documented: dict[tuple[str, str], Any] = {}
    for cells in table_rows(table):
        routes = [doc_route(span) for span in re.findall(r"`([^`]+)`", cells[0])]
        if not routes or None in routes:
            continue
        scopes = re.findall(r"`([a-z]+)`", cells[1])
        words = [words for words in NEEDS if cells[1].startswith(words)]
        assert len(words) + len(scopes) == 1, f"one need per row: {cells}"
        for route in routes:
            assert route not in documented, f"{route} appears twice in the scope table"
            documented[route] = scopes[0] if scopes else NEEDS[words[0]]
    assert documented == {route: endpoint.need for route, endpoint in code_routes().items()}


def test_the_documented_scopes_are_the_scopes_of_the_code(doc):
    text = section(doc, "3. Authentication")
    named = set(re.findall(r"^\| [^|]+ \| `([a-z]+)`", text, re.M)) | {"proxy"}
    assert named == set(SCOPES)
    assert "`proxy`" in text  # the reserved scope is explained


def test_the_audited_routes_are_the_documented_ones(doc, spec):
    text = section(doc, "6. Routes")
    recorded = text[text.index("**What is recorded.**") :].split("\n\n")[0]
    documented = {route for span in re.findall(r"`([^`]+)`", recorded) if (route := doc_route(span))}
    audited = {route for route, endpoint in code_routes().items() if endpoint.audited}
    assert documented == audited
    # an audit record's `operation`: the workspace operation's name, or the deployment handler's
    names = {
        e.name if isinstance(e, DeploymentEndpoint) else e.operation.name for e in code_routes().values() if e.audited
    }
    enum = spec["components"]["schemas"]["AuditRecord"]["properties"]["operation"]["enum"]
    assert len(enum) == len(set(enum)) and set(enum) == names


def test_every_operation_documents_the_credential_codes(spec):
    """Access and the credential can refuse anything; a key can be refused everywhere but health; a key is checked
    by the directory on every route."""
    for method, path in operations(spec):
        assert {"unauthorized", "access_denied"} <= documented_codes(spec, method, path, "401"), (method, path)
        assert {"not_configured", "directory_unavailable"} <= documented_codes(spec, method, path, "503"), path
        assert "storage_full" in documented_codes(spec, method, path, "507"), (method, path)
        forbidden = "forbidden" in documented_codes(spec, method, path, "403")
        assert forbidden == ((method, path) != ("GET", "/v1/health")), (method, path)
    assert "quota_exceeded" in documented_codes(spec, "PUT", W, "403")
    assert "quota_exceeded" in documented_codes(spec, "POST", "/v1/keys", "403")
    assert "key_not_found" in documented_codes(spec, "DELETE", "/v1/keys/{key_id}", "404")
    for path in (W + "/files",):
        for method in ("GET", "PUT"):
            assert {"forbidden", "permission_denied"} <= documented_codes(spec, method, path, "403")


GOOD_KEY_REQUESTS = [
    {"namespace": "ns", "scopes": ["exec"]},
    {"namespace": "ns", "workspace": "ws", "scopes": list(SCOPES), "expires_in": 86400, "label": "ci runner ✓"},
    {"namespace": "ns", "workspace": None, "scopes": ["files", "files"], "expires_in": None, "label": None},
    {"namespace": "ns", "scopes": ["manage"], "expires_in": limits.MAX_KEY_EXPIRES_IN_SECONDS},
    {"namespace": "ns", "scopes": ["snapshots"], "expires_in": 1, "label": "x" * limits.MAX_KEY_LABEL_CHARS},
]
BAD_KEY_REQUESTS = [
    {"scopes": ["exec"]},
    {"namespace": "ns"},
    {"namespace": "ns", "scopes": []},
    {"namespace": "ns", "scopes": "exec"},
    {"namespace": "ns", "scopes": ["root"]},
    {"namespace": "ns", "scopes": [1]},
    {"namespace": "Bad", "scopes": ["exec"]},
    {"namespace": None, "scopes": ["exec"]},
    {"namespace": "ns", "workspace": "", "scopes": ["exec"]},
    {"namespace": "ns", "scopes": ["exec"], "expires_in": 0},
    {"namespace": "ns", "scopes": ["exec"], "expires_in": limits.MAX_KEY_EXPIRES_IN_SECONDS + 1},
    {"namespace": "ns", "scopes": ["exec"], "expires_in": True},
    {"namespace": "ns", "scopes": ["exec"], "expires_in": "60"},
    {"namespace": "ns", "scopes": ["exec"], "label": "x" * (limits.MAX_KEY_LABEL_CHARS + 1)},
    {"namespace": "ns", "scopes": ["exec"], "label": "two\nlines"},
    {"namespace": "ns", "scopes": ["exec"], "label": 5},
    {"namespace": "ns", "scopes": ["exec"], "admin": True},
]


@pytest.mark.parametrize("body", GOOD_KEY_REQUESTS)
def test_key_requests_the_code_accepts_match_the_schema(spec, body):
    schema_validator(spec, "KeyRequest").validate(body)
    parse_key_request(body)


@pytest.mark.parametrize("body", BAD_KEY_REQUESTS)
def test_key_requests_the_code_rejects_the_schema_rejects(spec, body):
    with pytest.raises(ProtocolError):
        parse_key_request(body)
    assert not schema_validator(spec, "KeyRequest").is_valid(body)


# --- the file tree, terminals and processes -----------------------------------------------------------------------


def test_the_tree_terminal_and_process_parameters_carry_the_protocol_limits(spec):
    schemas, params = spec["components"]["schemas"], spec["components"]["parameters"]

    def bounds(name: str) -> tuple:
        schema = params[name]["schema"]
        return schema["minimum"], schema["maximum"], schema.get("default")

    assert bounds("ListDepth") == (1, limits.MAX_LIST_DEPTH, 1)
    assert bounds("ListLimit") == (1, limits.MAX_LIST_ENTRIES, limits.DEFAULT_LIST_ENTRIES)
    assert bounds("PtyCols") == (1, limits.MAX_PTY_SIZE, limits.DEFAULT_PTY_COLS)
    assert bounds("PtyRows") == (1, limits.MAX_PTY_SIZE, limits.DEFAULT_PTY_ROWS)
    assert bounds("Pid") == (1, limits.MAX_PID, None)
    assert schemas["SessionId"]["pattern"] == f"^{pty._SESSION_ID.pattern}$"
    assert schemas["Signal"]["enum"] == list(SIGNALS)
    assert schemas["FileEntry"]["properties"]["type"]["enum"] == list(ENTRY_TYPES)
    assert schemas["ListedProcess"]["properties"]["state"]["enum"] == [*processes.STATES.values(), "unknown"]
    assert schemas["FileList"]["properties"]["entries"]["maxItems"] == limits.MAX_LIST_ENTRIES
    assert schemas["ProcessList"]["properties"]["processes"]["maxItems"] == processes.MAX_PROCESSES


# (schema, the code's parser, body, accepted?) for the bodies of move, mkdir and signal
TREE_BODIES = [
    ("MoveRequest", parse_move_request, {"from": "/workspace/a", "to": "/workspace/b"}, True),
    ("MoveRequest", parse_move_request, {"from": "/workspace/a", "to": "/workspace/b ✓", "overwrite": True}, True),
    ("MoveRequest", parse_move_request, {"from": "/workspace/a"}, False),
    ("MoveRequest", parse_move_request, {"from": "workspace/a", "to": "/b"}, False),
    ("MoveRequest", parse_move_request, {"from": "/a", "to": "/b\x00"}, False),
    ("MoveRequest", parse_move_request, {"from": "/a", "to": "/b", "overwrite": None}, False),
    ("MoveRequest", parse_move_request, {"from": "/a", "to": "/b", "force": True}, False),
    ("MkdirRequest", parse_mkdir_request, {"path": "/workspace/d"}, True),
    ("MkdirRequest", parse_mkdir_request, {"path": "/workspace/d", "parents": True, "mode": "0700"}, True),
    ("MkdirRequest", parse_mkdir_request, {"path": "/workspace/d", "parents": False, "mode": "755"}, True),
    ("MkdirRequest", parse_mkdir_request, {"path": "/workspace/d", "mode": None}, True),
    ("MkdirRequest", parse_mkdir_request, {}, False),
    ("MkdirRequest", parse_mkdir_request, {"path": "d"}, False),
    ("MkdirRequest", parse_mkdir_request, {"path": "/d", "mode": "0800"}, False),
    ("MkdirRequest", parse_mkdir_request, {"path": "/d", "mode": "00755"}, False),
    ("MkdirRequest", parse_mkdir_request, {"path": "/d", "mode": ""}, False),
    ("MkdirRequest", parse_mkdir_request, {"path": "/d", "mode": 493}, False),
    ("MkdirRequest", parse_mkdir_request, {"path": "/d", "parents": "yes"}, False),
    ("MkdirRequest", parse_mkdir_request, {"path": "/d", "owner": "root"}, False),
    ("SignalRequest", parse_signal_request, {"signal": "TERM"}, True),
    ("SignalRequest", parse_signal_request, {"signal": "KILL", "group": True}, True),
    ("SignalRequest", parse_signal_request, {}, False),
    ("SignalRequest", parse_signal_request, {"signal": "SIGTERM"}, False),
    ("SignalRequest", parse_signal_request, {"signal": "USR1"}, False),
    ("SignalRequest", parse_signal_request, {"signal": 15}, False),
    ("SignalRequest", parse_signal_request, {"signal": "TERM", "group": None}, False),
    ("SignalRequest", parse_signal_request, {"signal": "TERM", "pid": 1}, False),
]


@pytest.mark.parametrize("name, parse, body, ok", TREE_BODIES)
def test_tree_and_signal_bodies_agree_with_the_schemas(spec, name, parse, body, ok):
    assert schema_validator(spec, name).is_valid(body) is ok
    if ok:
        parse(dict(body))
    else:
        with pytest.raises(ProtocolError):
            parse(dict(body))


def test_the_entries_and_pages_the_supervisor_answers_match_the_schemas(spec, tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "f").write_text("hi")
    (tmp_path / "d" / "f").chmod(0o4755)
    (tmp_path / "d" / "link").symlink_to("f")
    (tmp_path / "d" / "dangling").symlink_to("/nowhere/at/all")
    os.mkfifo(tmp_path / "d" / "fifo")
    entry = schema_validator(spec, "FileEntry")
    for name in ("d", "d/f", "d/link", "d/dangling", "d/fifo", "d/sub"):
        entry.validate(treeops.stat_entry(str(tmp_path / name))[0]["entry"])
    entry.validate(treeops.stat_entry("/")[0]["entry"])
    page = schema_validator(spec, "FileList")
    seen, cursor = [], None
    while True:
        result, fd = treeops.list_page(str(tmp_path), 3, 2, cursor)
        body = json.loads(filetree._page_body(str(tmp_path), fd, result["cursor"]))
        page.validate(body)
        seen += [e["name"] for e in body["entries"]]
        cursor = body["cursor"]
        if cursor is None:
            break
    assert seen == ["d", "dangling", "f", "fifo", "link", "sub"]
    # strict: a symlink names its target and nothing else does; modes are four octal digits
    described = treeops.stat_entry(str(tmp_path / "d" / "link"))[0]["entry"]
    assert not entry.is_valid({k: v for k, v in described.items() if k != "target"})
    assert not entry.is_valid({**treeops.stat_entry(str(tmp_path / "d"))[0]["entry"], "target": "x"})
    assert not entry.is_valid({**described, "mode": "755"})
    for answer, name in (
        ({"path": "/workspace/x", "deleted": True}, "FileDeleted"),
        ({"from": "/workspace/a", "to": "/workspace/b"}, "Moved"),
        ({"path": "/workspace/d", "created": True}, "MkdirResult"),
        ({"path": "/workspace/d", "created": False}, "MkdirResult"),
        ({"path": "/workspace/data", "files": 3, "directories": 1, "symlinks": 0, "bytes": 12}, "ArchiveWritten"),
    ):
        schema_validator(spec, name).validate(answer)


def test_the_process_list_and_a_signal_the_supervisor_answers_match_the_schemas(spec):
    # a process of this user in a session of its own: listed (the caller's own session is the supervisor's)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        listed = processes.list_processes(os.getuid(), "sandbox", {child.pid: "0" * 32})
        answer = {"commands": [], "processes": listed.entries, "truncated": listed.truncated}
        schema_validator(spec, "ProcessList").validate(answer)
        mine = next(p for p in listed.entries if p["pid"] == child.pid)
        assert mine["request_id"] == "0" * 32 and mine["state"] in ("sleeping", "running")
        assert os.getpid() not in {p["pid"] for p in listed.entries}
        sent, _ = processes.signal_process(child.pid, "TERM", False)
        schema_validator(spec, "Signalled").validate(sent)
        assert child.wait(10) == -15
    finally:
        child.kill()
        child.wait()


# --- what the edge answers on the new routes, against the schemas -----------------------------------------------

TOKEN = "d" * 40
STATUS = {
    "namespace": "ns",
    "workspace": "ws",
    "state": "created",
    "config": {"image": "hermes", "instance": "standard-1", "persistent": True, "cwd": "/workspace"},
    "running": False,
    "busy": False,
    "last_snapshot": None,
    "created_at": "2026-11-29T08:00:00.000Z",
    "last_activity_at": "2026-11-29T08:00:00.000Z",
    "booted": False,
}


class _Clock:
    def now_ms(self) -> int:
        return 1_800_000_000_000


class _Body:
    def __init__(self, data: bytes = b""):
        self.data = data
        self.stream = object()

    async def read(self, limit: int) -> bytes:
        return self.data


class _Workspace:
    """Answers as a workspace object would: status objects, a written file, a deleted workspace — or, for the names
    in `gone`, workspace_not_found (an ephemeral workspace that forgot itself)."""

    def __init__(self, workspaces: "_Workspaces", namespace: str, workspace: str):
        self.workspaces, self.namespace, self.workspace = workspaces, namespace, workspace

    async def call(self, op: str, args: Any, body: Any = None) -> Response:
        if (self.namespace, self.workspace) in self.workspaces.gone:
            return Response.error(ProtocolError("workspace_not_found"))
        status = {**STATUS, "namespace": self.namespace, "workspace": self.workspace}
        if op == "put_config":
            return Response.json(201, status)
        if op == "write_file":
            return Response.json(200, {"path": args.path, "size": args.length})
        if op in ("delete", "stop"):
            return Response.json(200, {"deleted": True})
        if op == "exec":
            return Response(200, b'{"type":"exit","exit_code":0,"reason":"exited","duration_ms":1}\n')
        return Response.json(200, status)


class _Workspaces:
    def __init__(self):
        self.gone: set[tuple[str, str]] = set()

    def get(self, namespace: str, workspace: str) -> _Workspace:
        return _Workspace(self, namespace, workspace)


async def _send(edge: Edge, method: str, path: str, query: str = "", credential: str = TOKEN, body=None, **headers):
    request_headers = {"authorization": f"Bearer {credential}", **headers}
    if body is not None:
        data = json.dumps(body).encode()
        request_headers.update({"content-type": "application/json", "content-length": str(len(data))})
    response = await edge.handle(
        EdgeRequest(method, path, query, request_headers, _Body(data if body is not None else b""))
    )
    return response.status, json.loads(response.body) if response.body else None, response.headers


async def test_the_edge_answers_on_key_list_and_audit_routes_match_the_schemas(spec, tmp_path):
    storage = SqliteStorage(tmp_path / "directory.sqlite3")
    workspaces = _Workspaces()
    edge = Edge(
        token=TOKEN,
        settings=Settings(),
        workspaces=workspaces,
        directory=Directory(storage, _Clock(), Settings()),
        version="0.0.0",
    )
    try:
        request = {"namespace": "ns", "scopes": ["exec", "files"], "label": "ci", "expires_in": 60}
        status, minted, headers = await _send(edge, "POST", "/v1/keys", body=request)
        assert (status, headers["cache-control"]) == (201, "no-store")
        schema_validator(spec, "MintedKey").validate(minted)
        key = minted["key"]
        status, one, _ = await _send(
            edge, "POST", "/v1/keys", body={"namespace": "ns", "workspace": "a", "scopes": ["manage"]}
        )
        schema_validator(spec, "MintedKey").validate(one)

        # workspaces, one of which forgets itself; requests of every audited kind, by the token and by the key
        for ws in ("a", "b", "gone"):
            assert (await _send(edge, "PUT", f"/v1/workspaces/ns/{ws}", body={}))[0] == 201
        command = {"request_id": "0" * 32, "command": f"deploy --token {TOKEN} --key {key}"}
        assert (await _send(edge, "POST", "/v1/workspaces/ns/a/exec", credential=key, body=command))[0] == 200
        upload = await edge.handle(
            EdgeRequest(
                "PUT",
                "/v1/workspaces/ns/a/files",
                "path=/workspace/x",
                {"authorization": f"Bearer {key}", "content-length": "3"},
                _Body(b"abc"),
            )
        )
        assert upload.status == 200
        assert (await _send(edge, "POST", "/v1/workspaces/ns/a/stop", credential=key))[0] == 403
        # the file tree, a directory upload, a signal and a terminal: audited with what _detail_of keeps
        tree = "/v1/workspaces/ns/a/files"
        assert (await _send(edge, "DELETE", tree, "path=/workspace/x&recursive=true", credential=key))[0] == 200
        moved = {"from": "/workspace/x", "to": f"/workspace/{TOKEN}"}
        assert (await _send(edge, "POST", tree + "/move", body=moved, credential=key))[0] == 200
        assert (await _send(edge, "POST", tree + "/mkdir", body={"path": "/workspace/d", "parents": True}))[0] == 200
        archive = EdgeRequest(
            "PUT", tree + "/archive", "path=/workspace/d", {"authorization": f"Bearer {TOKEN}"}, _Body(b"")
        )
        assert (await edge.handle(archive)).status == 200
        signal = {"signal": "TERM", "group": True}
        assert (await _send(edge, "POST", "/v1/workspaces/ns/a/processes/42/signal", body=signal))[0] == 200
        terminal = EdgeRequest(
            "GET", "/v1/workspaces/ns/a/pty", f"session={RID}", {"authorization": f"Bearer {key}"}, socket=object()
        )
        assert (await edge.handle(terminal)).status == 200
        assert (await _send(edge, "GET", "/v1/workspaces/ns/a/pty", credential=key))[1]["error"]["code"] == (
            "websocket_required"
        )
        workspaces.gone.add(("ns", "gone"))

        status, listing, _ = await _send(edge, "GET", "/v1/workspaces", "limit=2")
        assert status == 200
        schema_validator(spec, "WorkspaceList").validate(listing)
        assert [w["workspace"] for w in listing["workspaces"]] == ["a", "b"] and listing["next"] == "ns/b"
        status, rest, _ = await _send(edge, "GET", "/v1/workspaces", "after=ns/b")
        assert (status, rest) == (200, {"workspaces": [], "next": None})  # dropped from the index, left out
        assert (await _send(edge, "GET", "/v1/workspaces", credential=key))[1]["workspaces"] == listing["workspaces"]

        status, keys, _ = await _send(edge, "GET", "/v1/keys", "namespace=ns")
        schema_validator(spec, "KeyList").validate(keys)
        assert [k["id"] for k in keys["keys"]] == sorted([minted["id"], one["id"]])  # minted in the same ms: by id
        status, revoked, _ = await _send(edge, "DELETE", f"/v1/keys/{one['id']}")
        assert status == 200
        schema_validator(spec, "Revoked").validate(revoked)
        assert (await _send(edge, "DELETE", f"/v1/keys/{one['id']}"))[1]["error"]["code"] == "key_not_found"

        status, page, _ = await _send(edge, "GET", "/v1/audit", "limit=1000")
        assert status == 200
        schema_validator(spec, "AuditPage").validate(page)
        operations_seen = {r["operation"] for r in page["records"]}
        assert {"mint_key", "revoke_key", "put_config", "exec", "write_file", "stop"} <= operations_seen
        details = {
            (r["operation"], r["status"]): {
                k: v for k, v in r.items() if k in ("path", "to", "recursive", "pid", "signal", "group", "session")
            }
            for r in page["records"]
        }
        assert details[("delete_file", 200)] == {"path": "/workspace/x", "recursive": True}
        assert details[("move_file", 200)] == {"path": "/workspace/x", "to": "/workspace/[redacted]"}
        assert details[("make_dir", 200)] == details[("put_archive", 200)] == {"path": "/workspace/d"}
        assert details[("signal_process", 200)] == {"pid": 42, "signal": "TERM", "group": True}
        assert details[("pty", 200)] == {"session": RID} and details[("pty", 426)] == {}
        text = json.dumps(page)
        assert TOKEN not in text and key not in text and "[redacted]" in text
        assert (await _send(edge, "GET", "/v1/audit", credential=key))[1]["error"]["code"] == "forbidden"
    finally:
        storage.close()


# --- settings ---------------------------------------------------------------------------------------------------


def _setting_value(value: Any) -> str | None:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(value)
    return None if value is None else str(value)


def test_every_setting_is_in_the_doc_table_with_its_default(doc):
    documented = {}
    for cells in table_rows(section(doc, "12. Deployment settings")):
        name = code_cell(cells[0])
        if name and len(cells) >= 3:
            assert cells[2], f"{name} needs a meaning"
            default = re.match(r"`([^`]*)`", cells[1])
            documented[name] = default.group(1) if default else None
    # the two secrets (wrangler secret put), not vars of Settings: the token, and the key that seals workspace secrets
    assert set(documented) == {"SANDBOX_API_TOKEN", "SECRETS_KEY", *SETTING_VARS}
    defaults = Settings.from_vars({})
    for name in SETTING_VARS:
        assert documented[name] == _setting_value(getattr(defaults, name.lower())), name
