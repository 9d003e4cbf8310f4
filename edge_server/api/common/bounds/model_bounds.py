"""Bounds from the model: every request field that sizes a buffer or a loop in llama.cpp
(a repeat window, top_k, a context size, an answer's length, token ids) is held here to
what the model and one sequence's context can use, before any work is queued.

A value past that is clamped where the clamp changes nothing a caller can observe (a
penalty window longer than the context looks back over the whole context all the same,
top_k past the vocabulary keeps all of it) or where the protocol's own server clamps
(Ollama's num_ctx); it is refused with a 400 naming the field where the value cannot mean
anything (a token id outside the vocabulary, more tokens than the context holds). The
docs/limits.md's "Bounds" table lists every field with its door and rule.

Why clamping matters: llama.cpp sizes buffers from these numbers on the engine thread.
`repeat_last_n: 2147483647` made llama_sampler_init_penalties allocate and zero 8 GiB
for one request, and an allocation failure there ends the whole process.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from edge_server.api.common.bounds.prompt_bounds import too_long
from edge_server.api.http.errors import invalid
from edge_server.engine import Engine


@dataclass(frozen=True)
class ModelBounds:
    """What one request can use of a loaded model."""

    n_ctx: int  # tokens one sequence holds (each choice has a KV stream of its own)
    n_vocab: int  # token ids run 0 .. n_vocab - 1

    @classmethod
    def of(cls, engine: Engine) -> ModelBounds:
        return cls(n_ctx=engine.n_ctx, n_vocab=engine.vocab.n_tokens)

    def repeat_window(self, value: int | None) -> int:
        """Tokens the repetition penalties look back over: -1 (or none given) the whole
        context, as llama-server reads it; 0 none; longer than the context, the whole
        context (no sequence holds more tokens to look back over)."""
        if value is None or value < 0:
            return self.n_ctx
        return min(value, self.n_ctx)

    def top_k(self, value: int) -> int:
        """0 (or below): off; more than the vocabulary keeps all of it."""
        return 0 if value <= 0 else min(value, self.n_vocab)

    def context(self, num_ctx: int | None) -> int:
        """A request's own context size (Ollama's num_ctx): at most one sequence's, as
        Ollama caps it at the model's."""
        return self.n_ctx if num_ctx is None else min(num_ctx, self.n_ctx)

    def answer_room(self, prompt_len: int, param: str, n_ctx: int | None = None) -> int:
        """Tokens an answer may take after a prompt of `prompt_len` in a context of
        `n_ctx` (one sequence's by default); a 400 naming `param` when none are left."""
        n_ctx = self.n_ctx if n_ctx is None else n_ctx
        room = n_ctx - prompt_len
        if room < 1:
            raise too_long(param, f"The prompt is {prompt_len} tokens, which does not fit "
                           f"the context of {n_ctx} tokens.")
        return room

    def check_token_id(self, token: int, param: str) -> None:
        if not 0 <= token < self.n_vocab:
            raise invalid(param, f"`{param}`: token id {token} is outside the vocabulary "
                          f"(0..{self.n_vocab - 1})")

    def check_token_ids(self, tokens: list[int], param: str) -> None:
        """A list of token ids a caller sent (a prompt, Ollama's `context`, /detokenize's
        `tokens`): no more than the context holds, each in the vocabulary."""
        if len(tokens) > self.n_ctx:
            raise too_long(param, f"`{param}` is {len(tokens)} tokens, which does not fit "
                           f"the context of {self.n_ctx} tokens.")
        self.check_vocabulary(tokens, param)

    def check_vocabulary(self, tokens: Iterable[int], param: str) -> None:
        for token in tokens:
            self.check_token_id(token, param)
