"""Log-probabilities of tokens under the model's own distribution (raw logits).

Computed in numpy from llama.cpp's logits row only for requests that ask for them, so
the per-token hot path of every other request stays in C.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # most likely first


def token_logprob(logits: np.ndarray, token: int, top_n: int) -> TokenLogprob:
    peak = float(logits.max())
    log_norm = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
    top: list[tuple[int, float]] = []
    if top_n > 0:
        best = np.argpartition(logits, -top_n)[-top_n:]
        best = best[np.argsort(-logits[best], kind="stable")]
        top = [(int(t), float(logits[t]) - log_norm) for t in best]
    return TokenLogprob(token, float(logits[token]) - log_norm, top)
