"""Validation of `POST /v1/keys` bodies (protocol/keys.py): every malformed field is 400 with its code."""

import pytest

from protocol import limits
from protocol.errors import ProtocolError
from protocol.keys import KeyRequest, parse_key_request, split_key, validate_key_id


def test_a_full_request_is_normalised():
    req = parse_key_request(
        {"namespace": "ns", "workspace": "ws", "scopes": ["files", "exec", "files"], "expires_in": 60, "label": "ci"}
    )
    assert req == KeyRequest("ns", "ws", ("exec", "files"), 60, "ci")


def test_defaults():
    assert parse_key_request({"namespace": "ns", "scopes": ["exec"]}) == KeyRequest("ns", None, ("exec",), None, "")


@pytest.mark.parametrize(
    "body,code",
    [
        ({"scopes": ["exec"]}, "invalid_field"),
        ({"namespace": "NS", "scopes": ["exec"]}, "invalid_name"),
        ({"namespace": "ns", "workspace": "a/b", "scopes": ["exec"]}, "invalid_name"),
        ({"namespace": "ns", "workspace": 3, "scopes": ["exec"]}, "invalid_name"),
        ({"namespace": "ns"}, "invalid_field"),
        ({"namespace": "ns", "scopes": []}, "invalid_field"),
        ({"namespace": "ns", "scopes": "exec"}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec", 1]}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["root"]}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["EXEC"]}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec"], "expires_in": 0}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec"], "expires_in": -5}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec"], "expires_in": 1.5}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec"], "expires_in": True}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec"], "expires_in": "60"}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec"], "expires_in": limits.MAX_KEY_EXPIRES_IN_SECONDS + 1}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec"], "label": "x" * (limits.MAX_KEY_LABEL_CHARS + 1)}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec"], "label": "line\nbreak"}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec"], "label": 7}, "invalid_field"),
        ({"namespace": "ns", "scopes": ["exec"], "admin": True}, "unknown_field"),
    ],
)
def test_bad_bodies(body, code):
    with pytest.raises(ProtocolError) as err:
        parse_key_request(body)
    assert err.value.code == code


def test_the_longest_expiry_and_label_are_accepted():
    req = parse_key_request(
        {
            "namespace": "ns",
            "scopes": ["exec"],
            "expires_in": limits.MAX_KEY_EXPIRES_IN_SECONDS,
            "label": "é" * limits.MAX_KEY_LABEL_CHARS,
        }
    )
    assert req.expires_in == limits.MAX_KEY_EXPIRES_IN_SECONDS


def test_key_shapes():
    key = "fbk_0123456789abcdef_" + "a" * 32
    assert split_key(key) == ("0123456789abcdef", "a" * 32)
    for bad in (key + "a", key[:-1], " " + key, key.replace("fbk_", "fbx_"), key.upper()):
        assert split_key(bad) is None
    assert validate_key_id("0123456789abcdef") == "0123456789abcdef"
    with pytest.raises(ProtocolError) as err:
        validate_key_id("0123")
    assert err.value.code == "key_not_found"


@pytest.mark.parametrize("scope", ["exec", "files", "snapshots", "manage", "proxy"])
def test_each_documented_scope_is_accepted(scope):
    assert parse_key_request({"namespace": "ns", "scopes": [scope]}).scopes == (scope,)


def test_the_shortest_expiry_and_a_null_label():
    req = parse_key_request({"namespace": "ns", "scopes": ["exec"], "expires_in": 1, "label": None})
    assert (req.expires_in, req.label) == (1, "")


def test_an_unknown_scope_is_named_first_in_order_and_cut_at_64_characters():
    with pytest.raises(ProtocolError) as err:
        parse_key_request({"namespace": "ns", "scopes": ["zz", "aa"]})
    assert "'aa'" in err.value.message and "'zz'" not in err.value.message
    with pytest.raises(ProtocolError) as err:
        parse_key_request({"namespace": "ns", "scopes": ["q" * 100]})
    assert f"'{'q' * 64}'" in err.value.message


def test_a_key_request_is_frozen():
    import dataclasses

    req = parse_key_request({"namespace": "ns", "scopes": ["exec"]})
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.scopes = ("manage",)  # type: ignore[misc]
