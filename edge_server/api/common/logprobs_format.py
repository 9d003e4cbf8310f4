"""Engine token logprobs in the two OpenAI response shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edge_server.engine.backend.vocab import Vocab
from edge_server.engine.sampling.logprobs import TokenLogprob


def _text(vocab: Vocab, token: int) -> str:
    return vocab.pieces[token].decode("utf-8", errors="replace")


def completion_logprobs(
    tokens: list[int], scores: Sequence[TokenLogprob | None], vocab: Vocab, start_offset: int
) -> dict[str, Any]:
    """{tokens, token_logprobs, top_logprobs, text_offset}; a token scored None (the first
    echoed prompt token) has no logprob."""
    texts = [_text(vocab, t) for t in tokens]
    offsets = []
    offset = start_offset
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": texts,
        "token_logprobs": [None if s is None else s.logprob for s in scores],
        "top_logprobs": [
            None if s is None else {_text(vocab, t): lp for t, lp in s.top} for s in scores
        ],
        "text_offset": offsets,
    }


def chat_logprobs(entries: list[TokenLogprob], vocab: Vocab) -> dict[str, Any]:
    def item(token: int, logprob: float) -> dict[str, Any]:
        raw = vocab.pieces[token]  # bytes: a token may hold part of a character
        return {
            "token": _text(vocab, token),
            "logprob": logprob,
            "bytes": list(raw),
        }

    return {
        "content": [
            {**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
            for e in entries
        ]
    }
