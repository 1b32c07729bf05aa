"""Bounded capture of a command's output stream, decoded as UTF-8.

A command may print gigabytes; the sandbox must keep reading (or the command blocks on a
full pipe) while holding only a bounded amount in memory. ``BoundedOutput`` keeps the first
``limit_bytes // 2`` bytes (the head, decoded incrementally as they arrive) and the last
``limit_bytes - limit_bytes // 2`` bytes (the tail), counts everything in between, and
renders ``head + marker + tail`` at the end (docs/cases.md, C09).

Decoding rules (the sandbox contract in ``sandboxes/base.py``):

* invalid UTF-8 becomes U+FFFD, never an exception (``errors="replace"``);
* a multi-byte character split across reads arrives intact (the incremental decoder holds
  an incomplete sequence back until the next chunk);
* when bytes are dropped, the cut never splits a character: an incomplete sequence at the
  end of the head and continuation bytes at the start of the tail are dropped with the
  middle and counted in ``dropped_bytes``.
"""

from __future__ import annotations

import codecs
from collections import deque

_UTF8_MAX_CONTINUATION = 3


def truncation_marker(dropped_bytes: int) -> str:
    """The text put between head and tail, e.g. ``"\\n[... 199,934,464 bytes truncated ...]\\n"``."""
    return f"\n[... {dropped_bytes:,} bytes truncated ...]\n"


class BoundedOutput:
    """Head-and-tail capture of one byte stream with a hard memory bound.

    Memory held is at most ``limit_bytes`` plus one chunk as passed to ``feed``, whatever
    the stream's length.

    Args:
        limit_bytes: bytes of the stream to keep (head and tail together); ``0`` keeps
            nothing but still counts.

    Raises:
        ValueError: ``limit_bytes`` is negative.
    """

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes={limit_bytes} must be >= 0")
        self.limit_bytes = limit_bytes
        self._head_limit = limit_bytes // 2
        self._tail_limit = limit_bytes - self._head_limit
        self._head_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._head_parts: list[str] = []
        self._head_bytes = 0
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._total_bytes = 0
        self._finished: tuple[str, int] | None = None

    @property
    def total_bytes(self) -> int:
        """Bytes fed so far."""
        return self._total_bytes

    @property
    def held_bytes(self) -> int:
        """Raw bytes currently kept in memory (head bytes are counted once decoded)."""
        return self._head_bytes + self._tail_bytes

    def feed(self, data: bytes) -> None:
        """Add the next chunk of the stream.

        Raises:
            RuntimeError: called after ``finish``.
        """
        if self._finished is not None:
            raise RuntimeError("BoundedOutput.feed called after finish()")
        if not data:
            return
        self._total_bytes += len(data)
        view = memoryview(data)
        room = self._head_limit - self._head_bytes
        if room > 0:
            part = view[:room]
            self._head_parts.append(self._head_decoder.decode(part))
            self._head_bytes += len(part)
            view = view[len(part):]
        if len(view) == 0:
            return
        self._tail.append(bytes(view))
        self._tail_bytes += len(view)
        # Drop whole chunks from the left while the rest still covers the tail budget.
        while self._tail and self._tail_bytes - len(self._tail[0]) >= self._tail_limit:
            self._tail_bytes -= len(self._tail.popleft())

    def finish(self) -> tuple[str, int]:
        """Decode what was kept.

        Returns:
            ``(text, dropped_bytes)``: the whole stream decoded when nothing was dropped;
            otherwise ``head + truncation_marker(dropped_bytes) + tail``. Idempotent.
        """
        if self._finished is not None:
            return self._finished
        tail = b"".join(self._tail)
        self._tail.clear()
        dropped = self._total_bytes - self._head_bytes - len(tail)
        if len(tail) > self._tail_limit:
            dropped += len(tail) - self._tail_limit
            tail = tail[len(tail) - self._tail_limit:]
        if dropped == 0:
            # Contiguous: the tail continues the head's decoder (a character split at
            # the head boundary is completed here).
            text = "".join(self._head_parts) + self._head_decoder.decode(tail, final=True)
        else:
            pending, _ = self._head_decoder.getstate()
            dropped += len(pending)  # an incomplete character at the end of the head
            skip = 0
            while (
                skip < min(_UTF8_MAX_CONTINUATION, len(tail)) and 0x80 <= tail[skip] <= 0xBF
            ):
                skip += 1  # the rest of a character whose start was dropped
            dropped += skip
            tail_text = tail[skip:].decode("utf-8", errors="replace")
            text = "".join(self._head_parts) + truncation_marker(dropped) + tail_text
        self._head_parts = []
        self._tail_bytes = 0
        self._finished = (text, dropped)
        return self._finished
