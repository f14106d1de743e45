"""Property tests: the validators never crash on arbitrary input and never accept what the contract forbids."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import ProtocolError, limits, parse_exec_request, parse_json_object, validate_abs_path, validate_name

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=80))
def test_names_match_the_pattern_exactly(name):
    try:
        validate_name(name)
    except ProtocolError as err:
        assert err.code == "invalid_name"
        assert not re.fullmatch(limits.NAME_PATTERN, name)
    else:
        assert re.fullmatch(limits.NAME_PATTERN, name)
        assert "/" not in name and ".." != name and name.isascii()


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=200))
def test_paths_are_absolute_without_nul(path):
    try:
        validate_abs_path(path)
    except ProtocolError as err:
        assert err.code == "invalid_path"
    else:
        assert path.startswith("/") and "\x00" not in path
        assert len(path.encode("utf-8")) <= limits.MAX_PATH_BYTES


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["request_id", "command", "timeout", "stdin", "login", "cwd", "env", "x"]),
        json_values,
        max_size=7,
    )
)
def test_exec_bodies_fail_only_with_documented_codes(body):
    try:
        req = parse_exec_request(body)
    except ProtocolError as err:
        assert err.code in {
            "unknown_field",
            "invalid_field",
            "invalid_request_id",
            "invalid_timeout",
            "invalid_cwd",
            "command_too_large",
        }
    else:
        assert set(body) <= {"request_id", "command", "timeout", "stdin", "login", "cwd", "env"}
        assert 0 < req.timeout <= limits.MAX_TIMEOUT_SECONDS
        assert "\x00" not in req.command


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_json_bodies_never_crash(raw):
    try:
        assert isinstance(parse_json_object(raw), dict)
    except ProtocolError as err:
        assert err.code == "invalid_json"
