"""Control tokens' texts taken out of what a caller is shown.

A request whose answer is parsed (tool calls, reasoning) asks the engine for its text with
control tokens rendered (`render_control`): a model's call markers are often control tokens
(`<|python_tag|>`, `[TOOL_CALLS]`, DeepSeek's tool-call tokens), which the parsers must see.
What they report as content or reasoning must not show those texts, nor any other control
token the model wrote (`<|start_header_id|>`, reserved tokens): the caller sees the text a
request without parsing gets.
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from collections.abc import Collection, Sequence
from typing import Any

from edge_server.engine.backend.vocab import Vocab
from edge_server.engine.chat_template import literal_pattern


class ControlTexts:
    """A vocabulary's control-token texts, as one pattern and the set of their starts."""

    def __init__(self, texts: Collection[str]) -> None:
        self.pattern: re.Pattern[str] | None = literal_pattern(texts)
        self.starts = frozenset(text[:k] for text in texts for k in range(1, len(text)))
        self.longest = max((len(text) for text in texts), default=0)

    def hider(self, kinds: tuple[type, ...]) -> HiddenControls | None:
        """A filter of the events of these kinds (dataclasses with a `text`)."""
        return HiddenControls(self, kinds) if self.pattern is not None else None


_BY_VOCAB: weakref.WeakKeyDictionary[Vocab, ControlTexts] = weakref.WeakKeyDictionary()


def control_texts(vocab: Vocab) -> ControlTexts:
    """Built once per loaded model (Gemma has thousands of control tokens)."""
    table = _BY_VOCAB.get(vocab)
    if table is None:
        table = _BY_VOCAB[vocab] = ControlTexts(vocab.control_texts)
    return table


class ControlTextFilter:
    """One stream of text with control-token texts removed. A tail that may begin one is
    held until the next piece tells (a stop string being matched can split a token's text
    over two deltas)."""

    def __init__(self, table: ControlTexts) -> None:
        assert table.pattern is not None
        self._pattern = table.pattern
        self._table = table
        self._held = ""

    def push(self, text: str) -> str:
        if not text:
            return ""
        text = self._pattern.sub("", self._held + text)
        hold = self._partial_len(text)
        self._held = text[len(text) - hold:] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _partial_len(self, text: str) -> int:
        starts = self._table.starts
        for k in range(min(self._table.longest - 1, len(text)), 0, -1):
            if text[-k:] in starts:
                return k
        return 0


class HiddenControls:
    """One choice's text events with control-token texts taken out: each kind of text
    (content, reasoning) a stream of its own; other events (calls) pass unchanged, after
    what was held of the text before them."""

    def __init__(self, table: ControlTexts, kinds: tuple[type, ...]) -> None:
        self._filters = {kind: ControlTextFilter(table) for kind in kinds}

    def shown(self, events: Sequence[Any], *, final: bool = False) -> list[Any]:
        """What of `events` is shown now; `final`: the answer ended."""
        out: list[Any] = []
        for event in events:
            kind = type(event)
            out += self._flushed(but=kind)  # keeps the order of what was held
            text_filter = self._filters.get(kind)
            if text_filter is None:
                out.append(event)
            elif shown := text_filter.push(event.text):
                out.append(dataclasses.replace(event, text=shown))
        if final:
            out += self._flushed(but=None)
        return out

    def _flushed(self, but: type | None) -> list[Any]:
        return [kind(held) for kind, text_filter in self._filters.items()
                if kind is not but and (held := text_filter.flush())]
