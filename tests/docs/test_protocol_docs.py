"""docs/protocol.md and docs/openapi.yaml say what src/protocol says.

A code, limit, event type, phase, container state or exit reason added to src/protocol without being documented in
both files fails here; so does a route dropped from either document, or a schema that rejects what the code emits.
"""

import ast
import json
import re
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi

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
    started_event,
    status_event,
)
from protocol import events as ev

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
            path = (W if url.group(1) == "W" else "") + url.group(2).replace("$RID", "{request_id}")
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
    snapshot = {"id": "snap-1", "created_at": "2026-11-29T09:00:00.000Z", "size": 10}
    emitted = [heartbeat_event(), output_event("héllo ✓\n", 0), output_event("x" * 16384, 7)]
    emitted += [status_event(phase) for phase in ev.STATUS_PHASES] + [status_event("restoring", "from snap-1")]
    emitted += [started_event(RID, state) for state in ev.CONTAINER_STATES]
    emitted += [started_event(RID, "restored", snapshot)]
    emitted += [
        exit_event(code, reason, 12)
        for reason, code in (("exited", 0), ("exited", 255), ("timeout", 124), ("cancelled", 130), ("signal", 137))
    ]
    for event in emitted:
        schema.validate(json.loads(ev.encode_event(event)))


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
    kinds = {"error": "Error", "state": "Status", "command": "ExecRequest"}
    checked = set()
    for block in blocks:
        kind = next(kinds[key] for key in kinds if key in block)
        schema_validator(spec, kind).validate(block)
        checked.add(kind)
    assert checked == set(kinds.values())
