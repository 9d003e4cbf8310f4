"""Turns a sequence's token pieces into text deltas, honouring stop strings.

Text is held back while it may still be a partial UTF-8 character or the start of a
stop string, so a client never sees text that a stop string later takes back.
"""

from __future__ import annotations

import codecs


class TextStream:
    def __init__(self, stop: list[str], *, include_stop: bool = False) -> None:
        self._stop = [s for s in stop if s]
        self._include_stop = include_stop
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self.stopped = False
        self.stop_word = ""  # the stop string that ended the text, once one did

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; returns the text now safe to emit."""
        self._pending += self._decoder.decode(piece)
        if not self._stop:
            out, self._pending = self._pending, ""
            return out
        hit = self._first_stop()
        if hit is not None:
            at, stop = hit
            out = self._pending[: at + len(stop)] if self._include_stop else self._pending[:at]
            self._pending = ""
            self.stopped = True
            self.stop_word = stop
            return out
        hold = self._partial_stop_len()
        if hold:
            out, self._pending = self._pending[:-hold], self._pending[-hold:]
        else:
            out, self._pending = self._pending, ""
        return out

    def finish(self) -> str:
        """Flush what was held back once generation ends without a stop string."""
        out = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return out

    def _first_stop(self) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stop:
            at = self._pending.find(stop)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        return best

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of pending text that starts some stop string."""
        longest = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:k]):
                    longest = k
                    break
        return longest


class IndentGuard:
    """llama-server's `n_indent` for code infill: a line after the first that starts
    indented less than `min_indent` ends the completion before its first visible
    character (the completion has left the block being filled in)."""

    def __init__(self, min_indent: int) -> None:
        self.min_indent = min_indent
        self._at_line_start = False  # the first line is never checked
        self._indent = 0

    def cut_at(self, text: str) -> int | None:
        """Where in `text` (the next emitted text) the completion must end, or None."""
        for i, ch in enumerate(text):
            if ch == "\n":
                self._at_line_start, self._indent = True, 0
            elif self._at_line_start and ch in " \t":
                self._indent += 1
            elif self._at_line_start:
                self._at_line_start = False
                if self._indent < self.min_indent:
                    return i
        return None
