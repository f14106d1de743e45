"""A service's log: the newest code points of its output (and the supervisor's notes) with absolute offsets.

Unlike a command's journal, which stops storing at the output limit, this is a ring: a service runs for days, so the
oldest text goes first. Offsets count every code point since the service was first started under its name, so a
follower that resumes from an offset sees the same text it would have seen live, or starts at the first kept one
when its offset has been dropped. The `terminal` event is set while the service can produce no more output
(failed, stopped, deleted) and cleared when it is started again. It follows the Journal interface that
stream.follow reads (size, first, read, changed, terminal).
"""

import asyncio

from flarebox_supervisor.journal import read_span

# Dropped chunks are removed from the front of the lists in batches (a list's del [:n] is O(len)).
_COMPACT_CHUNKS = 1024


class ServiceLog:
    def __init__(self, max_chars: int):
        self.max_chars = max_chars
        self._chunks: list[str] = []
        self._starts: list[int] = []  # absolute offset of each chunk's first code point
        self._head = 0  # index of the first chunk still kept
        self.first = 0  # offset of the first code point kept
        self.size = 0  # offset just past the last code point (everything ever appended)
        self.terminal: dict | None = None
        self._line_start = True
        self._changed = asyncio.Event()

    def append(self, text: str) -> int:
        if not text:
            return 0
        count = len(text)
        start = self.size
        self.size += count
        if count > self.max_chars:
            text = text[-self.max_chars :]
            start = self.size - self.max_chars
        self._chunks.append(text)
        self._starts.append(start)
        self._line_start = text.endswith("\n")
        self._trim()
        self._notify()
        return count  # everything is accepted: old text makes room

    def note(self, line: str) -> None:
        """A line of the supervisor's own ("[flarebox] ..."), on a line of its own even after a partial line."""
        self.append(("" if self._line_start else "\n") + "[flarebox] " + line + "\n")

    def _trim(self) -> None:
        # Whole chunks are dropped once they lie entirely before the window; the first kept chunk may start before
        # it (it is not copied to cut it, `first` marks where reading may start), so at most one chunk more is held.
        self.first = max(self.first, self.size - self.max_chars)
        while self._head < len(self._chunks) - 1 and self._starts[self._head + 1] <= self.first:
            self._head += 1
        if self._head >= _COMPACT_CHUNKS and self._head * 2 >= len(self._chunks):
            del self._chunks[: self._head]
            del self._starts[: self._head]
            self._head = 0

    def read(self, offset: int, max_chars: int) -> str:
        """The kept text from `offset` (or from the first kept code point), at most `max_chars` code points."""
        offset = max(offset, self.first)
        if offset >= self.size or max_chars <= 0:
            return ""
        return read_span(self._chunks, self._starts, offset, max_chars, self._head)

    def finish(self, event: dict) -> None:
        self.terminal = event
        self._notify()

    def reopen(self) -> None:
        self.terminal = None

    def changed(self) -> asyncio.Event:
        """The event the next append or finish sets; take it before checking state to miss nothing."""
        return self._changed

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()
