"""The supervisor's fast frame encoder must produce exactly the protocol's output events."""

from hypothesis import given
from hypothesis import strategies as st

from flarebox_supervisor.stream import encode_frames
from protocol.events import decode_line, encode_event, output_event
from protocol.limits import MAX_OUTPUT_FRAME_CHARS


@given(
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=3 * MAX_OUTPUT_FRAME_CHARS // 1000),
    st.integers(min_value=0, max_value=10**9),
)
def test_fast_frames_equal_protocol_events(text, offset):
    expected = b"".join(
        encode_event(output_event(text[i : i + MAX_OUTPUT_FRAME_CHARS], offset + i))
        for i in range(0, len(text), MAX_OUTPUT_FRAME_CHARS)
    )
    assert encode_frames(text, offset) == expected


def test_frames_split_at_the_frame_size():
    text = '"\\\n\x00é😀' * (MAX_OUTPUT_FRAME_CHARS // 3)
    lines = encode_frames(text, 7).splitlines()
    events = [decode_line(line) for line in lines]
    assert all(len(e["data"]) <= MAX_OUTPUT_FRAME_CHARS for e in events)
    assert "".join(e["data"] for e in events) == text
    assert [e["offset"] for e in events] == [7 + i * MAX_OUTPUT_FRAME_CHARS for i in range(len(events))]
