"""A sandbox that stops right after its stream's terminal event (an idle stop, a kill) must not add a second
terminal event: the standalone relay ends normally once `exit`/`error` has passed, and still reports a stream that
broke before it (found by the soak in bench/bench_load.py: 'data after the terminal event')."""

import pytest

from durable.ports import ContainerGone
from protocol.events import encode_event, exit_event, output_event
from standalone.streams import QueueSink, ends_with_terminal

pytestmark = pytest.mark.timeout(10)


async def _body(chunks: list[bytes], then: Exception):
    for chunk in chunks:
        yield chunk
    raise then


async def _relay(chunks: list[bytes], then: Exception) -> bytes:
    sink = QueueSink(maxsize=1000)
    await sink.pipe_from(_body(chunks, then))
    await sink.close()
    return b"".join([chunk async for chunk in sink.readable])


@pytest.mark.parametrize(
    "gone", [ContainerGone("the sandbox stopped while answering: ReadError"), ConnectionResetError("reset")]
)
async def test_a_stream_broken_after_its_terminal_event_ends_normally(gone):
    end = encode_event(exit_event(0, "exited", 3))
    chunks = [encode_event(output_event("x" * 100, 0)), end[:10], end[10:]]  # the last line split over chunks
    assert await _relay(chunks, gone) == b"".join(chunks)


async def test_a_stream_broken_before_its_terminal_event_is_container_gone():
    chunks = [encode_event(output_event("partial", 0))]
    with pytest.raises(ContainerGone):
        await _relay(chunks, ConnectionResetError("reset"))
    with pytest.raises(ContainerGone):
        await _relay(chunks + [encode_event(exit_event(0, "exited", 1))[:-5]], ConnectionResetError("reset"))


def test_ends_with_terminal_needs_a_whole_exit_or_error_line():
    assert ends_with_terminal(b'{"type":"output","data":"a","offset":0}\n{"type":"error","code":"x","message":"m"}\n')
    assert not ends_with_terminal(b'{"type":"output","data":"{\\"type\\":\\"exit\\"}","offset":0}\n')
    assert not ends_with_terminal(b'{"type":"exit","exit_code":0')
    assert not ends_with_terminal(b"")
