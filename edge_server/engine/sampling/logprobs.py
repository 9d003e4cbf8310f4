"""Log-probabilities of tokens under the model's own distribution (raw logits).

Computed in numpy from llama.cpp's logits rows only for requests that ask for them, so
the per-token hot path of every other request stays in C. float32 throughout: the
row's maximum is subtracted first, so the sum cannot overflow, and float64 would double
the cost on large vocabularies (262k tokens) for digits nobody reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Rows scored per numpy call: bounds the temporary to a few MB on large vocabularies.
_ROWS_PER_BLOCK = 8


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # most likely first


def _top(logits: np.ndarray, log_norm: float, top_n: int) -> list[tuple[int, float]]:
    if top_n <= 0:
        return []
    best = np.argpartition(logits, -top_n)[-top_n:]
    best = best[np.argsort(-logits[best], kind="stable")]
    return [(int(t), float(logits[t]) - log_norm) for t in best]


def _log_norms(block: np.ndarray) -> np.ndarray:
    peak = block.max(axis=1)
    return peak + np.log(np.exp(block - peak[:, None]).sum(axis=1))


def token_logprob(logits: np.ndarray, token: int, top_n: int) -> TokenLogprob:
    return score_rows(logits[None, :], [token], top_n)[0]


def score_rows(rows: np.ndarray, tokens: list[int], top_n: int) -> list[TokenLogprob]:
    """Row i's logprob of tokens[i] (and its top_n): a prompt scored a block at a time."""
    out: list[TokenLogprob] = []
    for start in range(0, len(tokens), _ROWS_PER_BLOCK):
        block = rows[start : start + _ROWS_PER_BLOCK]
        norms = _log_norms(block)
        for i, (logits, norm) in enumerate(zip(block, norms, strict=True)):
            token = tokens[start + i]
            norm = float(norm)
            out.append(TokenLogprob(token, float(logits[token]) - norm, _top(logits, norm, top_n)))
    return out
