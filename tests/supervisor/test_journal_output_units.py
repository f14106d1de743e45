"""The journal and the output pipe on their own (no supervisor process): followers are woken by every append,
reads are capped, and a pipe's EOF ends it at once and closes its descriptor."""

import asyncio
import os

import pytest

from flarebox_supervisor.journal import Journal
from flarebox_supervisor.output import OutputPipe, make_pipe


async def test_an_append_wakes_a_waiting_follower_at_once():
    journal = Journal(max_chars=100)
    woken = journal.changed()
    assert not woken.is_set()
    journal.append("abc")
    assert woken.is_set()  # set by the append itself, not by a timer
    again = journal.changed()
    assert again is not woken and not again.is_set()  # the next append sets a fresh event
    journal.append("d")
    assert again.is_set()


async def test_a_follower_in_another_task_wakes_within_a_bound():
    journal = Journal(max_chars=100)

    async def follow():
        event = journal.changed()
        await asyncio.wait_for(event.wait(), 1.0)  # far below the 10 s heartbeat
        return journal.read(0, 100)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.01)
    journal.append("hello")
    assert await task == "hello"


async def test_finish_wakes_followers_once():
    journal = Journal(max_chars=10)
    event = journal.changed()
    journal.finish({"type": "exit", "exit_code": 0})
    assert event.is_set() and journal.terminal == {"type": "exit", "exit_code": 0}
    later = journal.changed()
    journal.finish({"type": "exit", "exit_code": 1})  # a second terminal event is ignored
    assert not later.is_set() and journal.terminal["exit_code"] == 0


def test_append_keeps_at_most_max_chars():
    journal = Journal(max_chars=5)
    assert journal.append("abc") == 3
    assert journal.append("defg") == 2
    assert journal.append("h") == 0
    assert journal.size == 5 and journal.read(0, 100) == "abcde"


@pytest.mark.parametrize(
    "offset,max_chars,expected",
    [
        (0, 1, "a"),
        (0, 3, "abc"),  # exactly the first chunk
        (0, 4, "abcd"),  # across a chunk boundary, the second chunk split
        (1, 4, "bcde"),
        (2, 100, "cdefghij"),
        (3, 2, "de"),  # from a chunk's start
        (4, 5, "efghi"),
        (9, 5, "j"),
        (10, 5, ""),
        (0, 0, ""),
    ],
)
def test_read_returns_at_most_max_chars_from_the_offset(offset, max_chars, expected):
    journal = Journal(max_chars=100)
    for chunk in ("abc", "def", "g", "hij"):
        journal.append(chunk)
    assert journal.read(offset, max_chars) == expected


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


async def test_eof_ends_the_pipe_at_once_and_closes_its_descriptor():
    read_fd, write_fd = make_pipe()
    journal = Journal(max_chars=100)
    pipe = OutputPipe(read_fd, journal, on_limit=lambda: None)
    os.write(write_fd, "héllo ".encode() + b"\xe2\x82")  # ends inside a code point
    os.close(write_fd)
    await asyncio.wait_for(pipe.eof.wait(), 1.0)  # no drain timer here: only EOF can end it
    assert journal.read(0, 100) == "héllo \ufffd"  # the cut code point is replaced at EOF, not lost
    pipe.close()  # a second close is harmless


async def test_eof_closes_the_read_descriptor():
    read_fd, write_fd = make_pipe()
    inode = os.fstat(read_fd).st_ino
    pipe = OutputPipe(read_fd, Journal(max_chars=10), on_limit=lambda: None)
    os.close(write_fd)
    await asyncio.wait_for(pipe.eof.wait(), 1.0)
    # the number may be reused by now, but not for this pipe
    assert not _fd_open(read_fd) or os.fstat(read_fd).st_ino != inode


async def test_output_over_the_limit_is_reported_once_and_the_pipe_is_still_drained():
    read_fd, write_fd = make_pipe()
    journal = Journal(max_chars=4)
    hits = []
    pipe = OutputPipe(read_fd, journal, on_limit=lambda: hits.append(1))
    os.write(write_fd, b"abcdefgh")
    await asyncio.sleep(0.05)
    os.write(write_fd, b"ijkl")
    os.close(write_fd)
    await asyncio.wait_for(pipe.eof.wait(), 1.0)
    assert journal.read(0, 100) == "abcd" and hits == [1] and pipe.over_limit


@pytest.mark.parametrize("fill", [0, 5])
async def test_an_append_that_stores_nothing_is_no_change(fill):
    journal = Journal(max_chars=5)
    journal.append("x" * fill)
    event = journal.changed()
    assert journal.append("") == 0
    if fill == 5:
        assert journal.append("more") == 0  # the journal is full
    assert not event.is_set() and journal.changed() is event  # followers are not woken for nothing
    assert journal.size == fill and journal.read(0, 100) == "x" * fill


@pytest.mark.parametrize("offset", [0, 1, 7])
def test_reading_an_empty_journal_or_past_its_end_gives_nothing(offset):
    journal = Journal(max_chars=10)
    assert journal.read(offset, 5) == ""
    journal.append("abc")
    assert journal.read(3 + offset, 5) == ""


def test_finish_records_when_the_command_ended():
    import time

    journal = Journal(max_chars=10)
    assert journal.ended_at is None
    before = time.monotonic()
    journal.finish({"type": "exit", "exit_code": 0})
    assert before <= journal.ended_at <= time.monotonic()


def test_the_last_code_point_of_room_is_stored():
    journal = Journal(max_chars=4)
    assert journal.append("abc") == 3
    assert journal.append("de") == 1  # one code point of room left: it is used
    assert journal.read(0, 10) == "abcd" and journal.append("f") == 0


async def test_every_read_records_when_output_last_arrived():
    read_fd, write_fd = make_pipe()
    pipe = OutputPipe(read_fd, Journal(max_chars=100), on_limit=lambda: None)
    created = pipe.last_read
    await asyncio.sleep(0.05)
    os.write(write_fd, b"late output")
    for _ in range(100):
        await asyncio.sleep(0.01)
        if pipe.last_read > created:
            break
    assert pipe.last_read >= created + 0.05  # the drain timer measures silence from here
    os.close(write_fd)
    await asyncio.wait_for(pipe.eof.wait(), 1.0)
