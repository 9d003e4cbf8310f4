"""Bounds on the size of one answer, checked before the engine does any work.

An answer grows with the product of prompts, choices, echoed prompt tokens, generated
tokens and logprob alternatives: 8 prompts of 2,000 tokens, `n: 128`, `echo` and
`logprobs: 5` asked for a 328 MB answer. Each factor alone is modest, so the product is
what is bounded, and the 400 names the field that multiplies it most.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_server.api.http.errors import APIError

# Token positions times (1 + alternatives) carrying logprobs in one answer (about 30
# bytes of JSON each).
MAX_LOGPROB_ENTRIES = 500_000
# Text of one answer (echoed prompts plus generated tokens at their longest).
MAX_RESPONSE_TEXT_BYTES = 64 << 20
# Answers holding more token entries than this are built and serialised off the event
# loop (a few milliseconds of work and up).
OFF_LOOP_ENTRIES = 2_000


@dataclass(frozen=True)
class AnswerShape:
    """What one request asks the answer to hold."""

    prompts: int
    choices: int  # per prompt (candidates, for best_of)
    echoed_tokens: int  # over all prompts, 0 without echo
    echoed_bytes: int  # over all prompts, 0 without echo
    max_tokens: int  # per choice, at most
    alternatives: int | None  # logprobs: top alternatives per token; None: no logprobs

    def token_entries(self) -> int:
        return self.choices * (self.echoed_tokens + self.prompts * self.max_tokens)

    def logprob_entries(self) -> int:
        if self.alternatives is None:
            return 0
        return self.token_entries() * (1 + self.alternatives)

    def text_bytes(self, max_token_bytes: int) -> int:
        return self.choices * (self.echoed_bytes
                               + self.prompts * self.max_tokens * max_token_bytes)


def check_answer_size(shape: AnswerShape, max_token_bytes: int, *, choices_param: str = "n",
                      logprobs_param: str = "logprobs", echo: bool = False) -> None:
    """A 400 naming the field that multiplies the answer most, when it would pass a bound."""
    entries = shape.logprob_entries()
    if entries > MAX_LOGPROB_ENTRIES:
        param = (choices_param if shape.choices > 1
                 else "echo" if echo and shape.echoed_tokens > shape.max_tokens
                 else logprobs_param)
        raise _too_large(param, (
            f"The answer would hold {entries:,} logprob entries ({shape.prompts} prompts x "
            f"{shape.choices} choices x up to {shape.token_entries() // shape.choices:,} "
            f"tokens x {1 + (shape.alternatives or 0)} logprobs each); at most "
            f"{MAX_LOGPROB_ENTRIES:,} are answered. Lower `{param}`."))
    text = shape.text_bytes(max_token_bytes)
    if text > MAX_RESPONSE_TEXT_BYTES:
        param = (choices_param if shape.choices > 1
                 else "echo" if echo and shape.echoed_bytes else "max_tokens")
        raise _too_large(param, (
            f"The answer could hold {text / 2**20:,.0f} MiB of text ({shape.prompts} prompts "
            f"x {shape.choices} choices); at most {MAX_RESPONSE_TEXT_BYTES >> 20} MiB are "
            f"answered. Lower `{param}`."))


def _too_large(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="response_too_large")
