"""The output pipe's own edges (flarebox_supervisor/output.py): how its ends are made, a wake-up with nothing to
read, a read error, code points split across reads, and one read as large as the pipe."""

import asyncio
import errno
import fcntl
import os
import subprocess
import sys

import pytest

from flarebox_supervisor import output
from flarebox_supervisor.journal import Journal
from flarebox_supervisor.output import OutputPipe, make_pipe

F_GETPIPE_SZ = 1032


def test_the_read_end_is_non_blocking_and_neither_end_leaks_into_a_child():
    read_fd, write_fd = make_pipe()
    try:
        assert not os.get_blocking(read_fd)
        assert os.get_blocking(write_fd)  # the command's stdout: a child writing to it must block, not fail
        for fd in (read_fd, write_fd):
            assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_the_pipe_is_enlarged_to_a_mebibyte():
    read_fd, write_fd = make_pipe()
    try:
        size = fcntl.fcntl(read_fd, F_GETPIPE_SZ)
    finally:
        os.close(read_fd)
        os.close(write_fd)
    limit = int(open("/proc/sys/fs/pipe-max-size").read())
    if os.geteuid() != 0 and limit < 1024 * 1024:
        pytest.skip("this user may not enlarge pipes to 1 MiB")
    assert size == 1024 * 1024


async def test_a_wake_up_with_nothing_to_read_changes_nothing(monkeypatch):
    read_fd, write_fd = make_pipe()
    journal = Journal(max_chars=100)
    pipe = OutputPipe(read_fd, journal, on_limit=lambda: None)
    real_readv = os.readv
    spurious = []

    def readv(fd, buffers):
        if not spurious:
            spurious.append(fd)
            raise BlockingIOError(errno.EAGAIN, "nothing yet")
        return real_readv(fd, buffers)

    monkeypatch.setattr(output.os, "readv", readv)
    failures = []
    pipe._loop.set_exception_handler(lambda loop, context: failures.append(context))
    os.write(write_fd, b"first")
    await asyncio.sleep(0.05)
    assert spurious and not pipe.eof.is_set()  # the spurious wake-up is not an end...
    assert failures == []  # ...nor an error in the reader
    os.write(write_fd, b" second")
    os.close(write_fd)
    await asyncio.wait_for(pipe.eof.wait(), 1.0)
    assert journal.read(0, 100) == "first second"


async def test_a_read_error_ends_the_pipe_like_eof(monkeypatch):
    read_fd, write_fd = make_pipe()
    journal = Journal(max_chars=100)
    pipe = OutputPipe(read_fd, journal, on_limit=lambda: None)
    real_readv = os.readv
    calls = []

    def readv(fd, buffers):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.EIO, "input/output error")
        return real_readv(fd, buffers)

    monkeypatch.setattr(output.os, "readv", readv)
    os.write(write_fd, "ok é".encode()[:-1])  # ends inside a code point
    await asyncio.sleep(0.05)
    os.write(write_fd, b"more")
    await asyncio.wait_for(pipe.eof.wait(), 1.0)
    assert journal.read(0, 100) == "ok \ufffd"  # the cut code point is flushed as a replacement, not lost
    with pytest.raises(OSError):
        os.fstat(read_fd)  # closed (nothing else opened a descriptor in between)
    os.close(write_fd)


async def test_a_code_point_split_across_reads_arrives_whole():
    read_fd, write_fd = make_pipe()
    journal = Journal(max_chars=100)
    pipe = OutputPipe(read_fd, journal, on_limit=lambda: None)
    data = "a€b".encode()
    for part in (data[:2], data[2:3], data[3:]):
        os.write(write_fd, part)
        await asyncio.sleep(0.02)  # one read per part
    os.close(write_fd)
    await asyncio.wait_for(pipe.eof.wait(), 1.0)
    assert journal.read(0, 100) == "a€b"


async def test_a_read_as_large_as_the_pipe_is_taken_whole():
    read_fd, write_fd = make_pipe()
    size = fcntl.fcntl(read_fd, F_GETPIPE_SZ)
    journal = Journal(max_chars=size + 10)
    pipe = OutputPipe(read_fd, journal, on_limit=lambda: None)
    payload = bytes(ord("a") + i % 26 for i in range(size))
    pipe._loop.remove_reader(read_fd)  # fill the pipe before the first read...
    written = 0
    while written < size:
        written += os.write(write_fd, payload[written:])
    pipe._loop.add_reader(read_fd, pipe._on_readable)  # ...so one read can take it all
    await asyncio.sleep(0.05)
    assert journal.read(0, size + 10) == payload.decode()
    os.close(write_fd)
    await asyncio.wait_for(pipe.eof.wait(), 1.0)


async def test_empty_text_never_reaches_the_journal():
    appended = []

    class Recording(Journal):
        def append(self, text):
            appended.append(text)
            return super().append(text)

    read_fd, write_fd = make_pipe()
    pipe = OutputPipe(read_fd, Recording(max_chars=10), on_limit=lambda: None)
    os.write(write_fd, b"\xe2")  # decodes to nothing until the rest arrives
    await asyncio.sleep(0.05)
    assert appended == []
    os.close(write_fd)
    await asyncio.wait_for(pipe.eof.wait(), 1.0)
    assert appended == ["\ufffd"]


def test_the_shared_read_buffer_is_not_resident_until_reads_fill_it():
    """An idle supervisor does not hold the 1 MiB read buffer (a zero-filled bytearray would be resident)."""
    script = (
        "import asyncio, codecs, fcntl, mmap\n"
        "import flarebox_supervisor.journal\n"
        "def rss():\n"
        "    return int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])\n"
        "before = rss()\n"
        "import flarebox_supervisor.output\n"
        "print(rss() - before)\n"
    )
    grown_kib = int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout)
    assert grown_kib < 512
