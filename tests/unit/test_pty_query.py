"""GET …/pty's query and control frames (protocol/pty.py), as the edge and the supervisor both read them."""

import pytest

from protocol.errors import ProtocolError
from protocol.pty import PtyRequest, parse_control_frame, parse_pty_query

SESSION = "0123456789abcdef" * 2


def test_defaults_and_a_resume_from_an_offset():
    assert parse_pty_query({}) == PtyRequest(None, 80, 24, None)
    assert parse_pty_query({"session": SESSION, "cols": "200", "rows": "50", "offset": "1234"}) == PtyRequest(
        SESSION, 200, 50, 1234
    )


@pytest.mark.parametrize(
    "query",
    [
        {"cols": "0"},
        {"rows": "1001"},
        {"cols": "abc"},
        {"cols": "+80"},
        {"session": "ABC"},
        {"session": SESSION[:-1]},
        {"offset": "10"},  # an offset resumes a session: alone it means nothing
        {"session": SESSION, "offset": "-1"},
        {"session": SESSION, "offset": "1e3"},
    ],
)
def test_a_bad_query_is_invalid_query(query):
    with pytest.raises(ProtocolError) as err:
        parse_pty_query(query)
    assert err.value.code == "invalid_query"


def test_the_one_control_frame_is_a_resize():
    assert parse_control_frame('{"type":"resize","cols":120,"rows":40}') == (120, 40)
    for text, code in [
        ("not json", "invalid_json"),
        ('{"type":"resize","cols":0,"rows":40}', "invalid_field"),
        ('{"type":"resize","cols":true,"rows":40}', "invalid_field"),
        ('{"type":"resize","cols":80,"rows":24,"extra":1}', "invalid_field"),
        ('{"type":"exit"}', "invalid_field"),
        ('{"type":"resize","cols":80,"rows":24}' + " " * 2000, "invalid_field"),
    ]:
        with pytest.raises(ProtocolError) as err:
            parse_control_frame(text)
        assert err.value.code == code, text
