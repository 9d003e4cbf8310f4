"""Requests at and past the memory bounds (one answer's size, /tokenize, /detokenize),
for tests/fuzz/test_fuzz.py and scripts/soak/fuzz.py; see `strategies` for the other cases."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from edge_testkit.fuzz.strategies import BOOLEAN, COMPLETIONS, MODEL, Case, dumps, valid_ids

TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"

# (prompts, tokens each, n, echo, logprobs) of completions at and past the bound on one
# answer's size (prompts x choices x echoed tokens x logprobs): the refused ones are
# refused at once, the others are light enough to answer within TIMEOUT_S.
ANSWER_SHAPES = [(8, 250, 128, True, 5), (128, 250, 128, True, 5), (4, 250, 128, True, 5),
                 (128, 250, 4, True, 5), (1, 250, 8, True, 5), (2, 250, 2, True, 5),
                 (16, 1, 2, True, 5), (1, 1, 16, False, None), (1, 250, 16, False, 5)]


@st.composite
def bound_cases(draw: st.DrawFn) -> Case:
    """Requests at and past the memory bounds: the size of one answer, /tokenize and
    /detokenize (bounded like prompts)."""
    first = draw(valid_ids)
    kind = draw(st.sampled_from(["answer", "tokenize", "detokenize"]))
    if kind == "answer":
        prompts, length, n, echo, logprobs = draw(st.sampled_from(ANSWER_SHAPES))
        ids = [(first + 7 * i) % 49152 for i in range(length)]
        body: dict[str, Any] = {"model": MODEL, "prompt": [ids] * prompts if prompts > 1
                                else ids, "n": n, "echo": echo, "stream": draw(BOOLEAN),
                                "max_tokens": draw(st.integers(1, 4))}
        if logprobs is not None:
            body["logprobs"] = logprobs
        return Case(COMPLETIONS, dumps(body).encode(), "bound-answer")
    if kind == "tokenize":
        unit = draw(st.sampled_from(["ab ", " 7", "\U0001f999", "<|im_end|>"]))
        size = draw(st.sampled_from([1, 100, 5000, 300_000, 3_000_000]))
        body = {"model": MODEL, "content": unit * size, "parse_special": draw(BOOLEAN)}
        return Case(TOKENIZE, dumps(body).encode("utf-8", "surrogatepass"), "bound-tokenize")
    count = draw(st.sampled_from([1, 255, 256, 257, 5000, 1_000_001]))
    body = {"model": MODEL, "tokens": [first] * count}
    return Case(DETOKENIZE, dumps(body).encode(), "bound-detokenize")
