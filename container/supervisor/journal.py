"""One command's output journal: code points with offsets, a terminal event, and followers waiting for more.

The exec stream and every reattach are followers of the same journal, so a replay from offset N yields exactly
what the live stream carried from N on. Text is stored as the chunks the pipe produced; frames are cut when sent.
"""

import asyncio
import bisect
import time


def read_span(chunks: list[str], starts: list[int], offset: int, max_chars: int, first_chunk: int = 0) -> str:
    """At most `max_chars` code points from `offset` of text kept as `chunks` (each starting at the offset in
    `starts`, from `first_chunk` on); `offset` must lie inside them."""
    index = bisect.bisect_right(starts, offset, lo=first_chunk) - 1
    pieces, taken = [], 0
    piece = chunks[index][offset - starts[index] :]
    while True:
        piece = piece[: max_chars - taken]
        pieces.append(piece)
        taken += len(piece)
        index += 1
        if taken >= max_chars or index >= len(chunks):
            return "".join(pieces)
        piece = chunks[index]


class Journal:
    first = 0  # offset of the first code point kept: a command's journal keeps everything (cf. servicelog.py)

    def __init__(self, max_chars: int):
        self.max_chars = max_chars
        self._chunks: list[str] = []
        self._starts: list[int] = []  # offset of each chunk's first code point
        self.size = 0  # code points stored
        self.terminal: dict | None = None
        self.ended_at: float | None = None  # time.monotonic() when the terminal event was set
        self._changed = asyncio.Event()

    def append(self, text: str) -> int:
        """Store up to the output limit; returns how many code points were accepted."""
        room = self.max_chars - self.size
        if room <= 0 or not text:
            return 0
        if len(text) > room:
            text = text[:room]
        self._starts.append(self.size)
        self._chunks.append(text)
        self.size += len(text)
        self._notify()
        return len(text)

    def finish(self, event: dict) -> None:
        if self.terminal is None:
            self.terminal = event
            self.ended_at = time.monotonic()
            self._notify()

    def read(self, offset: int, max_chars: int) -> str:
        """The stored text from `offset`, at most `max_chars` code points (a chunk is split if needed)."""
        if offset >= self.size:
            return ""
        return read_span(self._chunks, self._starts, offset, max_chars)

    def changed(self) -> asyncio.Event:
        """The event the next append or finish sets; take it before checking state to miss nothing."""
        return self._changed

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()
