"""Splits reasoning from the answer, for `separate_reasoning`: `<think>…</think>`, or
the markers of the model's family (`[THINK]…[/THINK]`, harmony's analysis channel, …;
tool_parsers.think_markers).

Works on streamed text: a tag split across deltas is held back until it is complete.
An opening that is prose rather than a tag (Apriel's "Here are my reasoning steps:"),
written by the template or by the model, is the reasoning's own first words: it stays
in the reasoning, as llama.cpp's parsers report it.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ReasoningSplitter:
    def __init__(
        self, *, starts_inside: bool = False, markers: tuple[str, str] = (OPEN, CLOSE)
    ) -> None:
        # Some templates open the think block in the prompt; the model then only closes it.
        self._inside = starts_inside
        self._open, self._close = markers
        self._pending = ""
        self._seen_content = False
        self._prose_opening = self._open[:1].isalpha()
        # Told with the first reasoning, where the prompt wrote the opening.
        self._opening_due = starts_inside and self._prose_opening

    def push(self, text: str) -> tuple[str, str]:
        """Returns (reasoning, content) that is now safe to emit."""
        self._pending += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._pending:
            tag = self._close if self._inside else self._open
            at = self._pending.find(tag)
            if at >= 0:
                self._emit(self._pending[:at], reasoning, content)
                self._pending = self._pending[at + len(tag) :]
                self._inside = not self._inside
                if self._inside and self._prose_opening:
                    reasoning.append(tag)
                continue
            hold = _partial_tail(self._pending, tag)
            self._emit(self._pending[: len(self._pending) - hold], reasoning, content)
            self._pending = self._pending[len(self._pending) - hold :]
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        self._emit(self._pending, reasoning, content)
        self._pending = ""
        return "".join(reasoning), "".join(content)

    def _emit(self, text: str, reasoning: list[str], content: list[str]) -> None:
        if not text:
            return
        if self._inside:
            if self._opening_due:
                reasoning.append(self._open)
                self._opening_due = False
            reasoning.append(text)
        else:
            # The answer usually starts after a blank line that closes the reasoning.
            if not self._seen_content:
                text = text.lstrip()
                if not text:
                    return
                self._seen_content = True
            content.append(text)


def _partial_tail(text: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
