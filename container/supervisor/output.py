"""The merged stdout+stderr pipe of one command, owned and read by the supervisor.

Reads are large (the pipe is enlarged to 1 MiB where allowed) and decoded incrementally as UTF-8 with
errors="replace", so a code point split across reads is never broken. The pipe is read until EOF even after the
exec stream has ended, so background jobs never block on a full pipe or die of SIGPIPE; text past the output limit
is discarded.
"""

import asyncio
import codecs
import fcntl
import mmap
import os
import time
from collections.abc import Callable

from flarebox_supervisor.journal import Journal

# (the kernel rounds a pipe's size up to a power of two of pages, and a smaller buffer only splits a read in two:
# no test can tell 1 MiB from a little less, so the size is not mutated)
_PIPE_SIZE = 1024 * 1024  # pragma: no mutate
# One read buffer for every pipe: reads happen in event-loop callbacks and are decoded at once, so they never overlap.
# Anonymous memory, not a bytearray (which is zero-filled, so resident at once): a page is only held once a read has
# filled it, so an idle sandbox does not carry the whole megabyte.
_BUFFER = mmap.mmap(-1, _PIPE_SIZE)
_VIEW = memoryview(_BUFFER)


def make_pipe() -> tuple[int, int]:
    """A (read, write) pipe; the read end is non-blocking and close-on-exec, the write end goes to the child."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(read_fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    except OSError:
        pass  # over /proc/sys/fs/pipe-max-size for this user: keep the default size
    os.set_blocking(read_fd, False)
    return read_fd, write_fd


class OutputPipe:
    def __init__(self, fd: int, journal: Journal, on_limit: Callable[[], None]):
        self._fd = fd
        self._journal = journal
        self._on_limit = on_limit
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.over_limit = False
        self.last_read = time.monotonic()
        self.eof = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            count = os.readv(self._fd, [_BUFFER])
        except BlockingIOError:
            return
        except OSError:
            count = 0
        if count:
            self.last_read = time.monotonic()
            self._push(self._decoder.decode(_VIEW[:count]))
        else:  # EOF (or a read error, which ends the pipe the same way)
            self._push(self._decoder.decode(b"", final=True))
            self.close()

    def _push(self, text: str) -> None:
        if not text:
            return
        accepted = self._journal.append(text)
        if accepted < len(text) and not self.over_limit:
            self.over_limit = True
            self._on_limit()

    def close(self) -> None:
        if not self.eof.is_set():
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self.eof.set()
