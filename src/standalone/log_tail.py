"""A sandbox's stdout/stderr: a pipe the server drains, keeping only the last few KiB.

A host file would let the sandbox (through `pidfd_getfd` on its own pid 1) grow it without bound outside the
workspace. A pipe read by the event loop costs the host at most the pipe buffer and the kept tail, whatever the
sandbox writes; the tail only goes into error messages, marked as the sandbox's own words and made printable.
"""

import asyncio
import contextlib
import os

TAIL_BYTES = 8192
_READ_BYTES = 65536


class LogTail:
    def __init__(self, keep: int = TAIL_BYTES):
        self._keep = keep
        self._tail = bytearray()
        self._read_fd, self.write_fd = os.pipe()  # the write end goes to the launcher (and slirp4netns)
        os.set_blocking(self._read_fd, False)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start draining on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._read_fd, self._drain)

    def close_writer(self) -> None:
        """The children hold their copies; ours would keep the pipe from ever ending."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _drain(self) -> None:
        try:
            data = os.read(self._read_fd, _READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # every writer is gone
            self._stop_reading()
            return
        self._tail += data
        del self._tail[: -self._keep]

    def _stop_reading(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._read_fd)
            self._loop = None

    def text(self, limit: int = 600) -> str:
        raw = bytes(self._tail[-limit:]).decode("utf-8", "replace")
        shown = "".join(c if c.isprintable() or c in "\n\t" else "?" for c in raw).strip()
        return f"(sandbox output) {shown}" if shown else "(no output)"

    def close(self) -> None:
        self._stop_reading()
        self.close_writer()
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1
