"""Feed a command's stdin from the event loop while its output is being read, so neither side can deadlock."""

import asyncio
import os


class StdinFeeder:
    def __init__(self, pipe, text: str):
        self._file = pipe
        self._fd = pipe.fileno()
        self._data = memoryview(text.encode("utf-8"))
        self._loop = asyncio.get_running_loop()
        self._closed = False
        if not self._data:
            self.close()
            return
        os.set_blocking(self._fd, False)
        self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        try:
            written = os.write(self._fd, self._data[: 1024 * 1024])
        except BlockingIOError:
            return
        except OSError:  # EPIPE: the command stopped reading; the rest of stdin is dropped like with a shell pipe
            self.close()
            return
        self._data = self._data[written:]
        if not self._data:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.remove_writer(self._fd)
        except (ValueError, OSError):
            pass
        self._file.close()
