"""Per-sequence sampler chains built in C from a request's sampling parameters."""

from __future__ import annotations

import ctypes
import secrets
from dataclasses import dataclass, field
from typing import Protocol

import llama_cpp as lc
import numpy as np

from edge_server.engine.backend.vocab import Vocab

# Temperatures below this sample greedily, the limit they tend to: dividing logits by
# them overflows float32 to infinities, whose softmax is NaN (llama.cpp's chain then
# draws an arbitrary token). Above it, logits up to 1e8 apart stay finite when divided.
MIN_TEMPERATURE = 1e-30
# Repetition penalties below this act as it does, their limit: a repeated token's
# positive logit, divided by it, already outweighs every other token. Smaller ones
# overflow float32 to infinities (below 1e-38 they are 0 as a float32), whose softmax is
# NaN: llama.cpp's chain then draws an arbitrary token, and a grammar handed it aborts
# the process.
MIN_REPETITION_PENALTY = 1e-3


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    mirostat_target: float | None = None  # mirostat tau
    mirostat_lr: float | None = None  # mirostat eta
    mirostat_version: int = 2  # 1 or 2 (Ollama's `mirostat` option chooses)
    typical_p: float = 1.0  # locally typical sampling; 1.0: off
    penalty_last_n: int = -1  # tokens the penalties look back over; -1: the whole context
    ignore_eos: bool = False
    grammar: str | None = None  # GBNF, root rule "root"

    @property
    def uses_penalties(self) -> bool:
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    @property
    def uses_mirostat(self) -> bool:
        return self.mirostat_target is not None or self.mirostat_lr is not None


class Sampler(Protocol):
    """What the scheduler needs of a choice's sampler (this chain, or full_vocab's)."""

    params: SamplingParams

    @property
    def has_grammar(self) -> bool: ...

    def prime(self, prompt_tokens: list[int]) -> None: ...

    def sample(self, ctx: lc.llama_context_p, batch_row: int) -> int: ...

    def close(self) -> None: ...


class GrammarError(ValueError):
    """llama.cpp refused to parse a grammar."""


# Matches struct llama_token_data {int32 id; float logit; float p;}.
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


class SamplerChain:
    """Owns one llama_sampler chain; sampling and acceptance run in C.

    A grammar is kept out of the chain: checking all ~50k candidates against it costs
    more than decoding a token. The chain samples first, the grammar checks just that
    token, and only a rejected token makes the grammar filter the whole vocabulary
    (llama.cpp's common sampler does the same).
    """

    def __init__(self, params: SamplingParams, vocab: Vocab, *, n_ctx: int, seed: int) -> None:
        self.params = params
        chain_params = lc.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = lc.llama_sampler_chain_init(chain_params)
        self._penalties: lc.llama_sampler_p | None = None
        self._grammar: lc.llama_sampler_p | None = None
        self._n_vocab = vocab.n_tokens
        try:
            self._build(params, vocab, n_ctx=n_ctx, seed=seed)
        except Exception:
            self.close()
            raise

    def _add(self, sampler: lc.llama_sampler_p | None) -> lc.llama_sampler_p:
        if not sampler:
            raise GrammarError("llama.cpp could not build this sampler")
        lc.llama_sampler_chain_add(self.ptr, sampler)
        return sampler

    def _build(self, p: SamplingParams, vocab: Vocab, *, n_ctx: int, seed: int) -> None:
        if p.grammar is not None:
            grammar = lc.llama_sampler_init_grammar(vocab.ptr, p.grammar.encode(), b"root")
            if not grammar:
                raise GrammarError("llama.cpp could not parse the grammar")
            self._grammar = grammar
            self._candidates = np.zeros(vocab.n_tokens, dtype=_TOKEN_DATA)
            self._ids = np.arange(vocab.n_tokens, dtype=np.int32)
            self._one = np.zeros(1, dtype=_TOKEN_DATA)
        bias = dict(p.logit_bias)
        # A grammar ends the output by allowing only end-of-generation tokens: banning
        # them too would leave nothing to sample, so the grammar wins over ignore_eos.
        if p.ignore_eos and p.grammar is None:
            for token in vocab.eog_tokens:
                bias[token] = float("-inf")
        if bias:
            arr = (lc.llama_logit_bias * len(bias))()
            for i, (token, value) in enumerate(bias.items()):
                arr[i] = lc.llama_logit_bias(token, value)
            self._add(lc.llama_sampler_init_logit_bias(vocab.n_tokens, len(bias), arr))
        if p.uses_penalties:
            # The API holds the window to the context already; this is the last guard,
            # as llama.cpp allocates and zero-fills a ring buffer of that many tokens.
            window = n_ctx if p.penalty_last_n < 0 else min(p.penalty_last_n, n_ctx)
            self._penalties = self._add(
                lc.llama_sampler_init_penalties(
                    vocab.n_tokens,
                    window,
                    max(p.repetition_penalty, MIN_REPETITION_PENALTY),
                    p.frequency_penalty,
                    p.presence_penalty,
                )
            )
        if p.greedy:
            self._add(lc.llama_sampler_init_greedy())
            return
        if p.uses_mirostat:
            tau = 1.5 if p.mirostat_target is None else p.mirostat_target
            eta = 0.1 if p.mirostat_lr is None else p.mirostat_lr
            self._add(lc.llama_sampler_init_temp(p.temperature))
            if p.mirostat_version == 1:
                # m = 100: the candidates mirostat v1 estimates s_hat from (its paper's value).
                self._add(lc.llama_sampler_init_mirostat(vocab.n_tokens, seed, tau, eta, 100))
            else:
                self._add(lc.llama_sampler_init_mirostat_v2(seed, tau, eta))
            return
        if p.top_k > 0:
            self._add(lc.llama_sampler_init_top_k(min(p.top_k, vocab.n_tokens)))
        if p.typical_p < 1.0:
            self._add(lc.llama_sampler_init_typical(p.typical_p, 1))
        if p.top_p < 1.0:
            self._add(lc.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            self._add(lc.llama_sampler_init_min_p(p.min_p, 1))
        self._add(lc.llama_sampler_init_temp(p.temperature))
        self._add(lc.llama_sampler_init_dist(seed))

    @property
    def has_grammar(self) -> bool:
        return self._grammar is not None

    def prime(self, prompt_tokens: list[int]) -> None:
        """Let the penalties see the prompt, as repetition penalty is documented to."""
        if self._penalties is not None:
            for token in prompt_tokens:
                if token >= 0:  # image placeholders are not tokens of the vocabulary
                    lc.llama_sampler_accept(self._penalties, token)

    def sample(self, ctx: lc.llama_context_p, batch_row: int) -> int:
        if self._grammar is None:
            return int(lc.llama_sampler_sample(self.ptr, ctx, batch_row))
        logits = np.ctypeslib.as_array(
            lc.llama_get_logits_ith(ctx, batch_row), shape=(self._n_vocab,)
        )
        token = self._pick(logits, grammar_first=False)
        if not self._grammar_allows(token):
            token = self._pick(logits, grammar_first=True)
        lc.llama_sampler_accept(self._grammar, token)
        lc.llama_sampler_accept(self.ptr, token)
        return token

    def _apply(self, sampler: lc.llama_sampler_p, data: np.ndarray) -> int:
        array = lc.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)),
            size=len(data),
            selected=-1,
            sorted=False,
        )
        lc.llama_sampler_apply(sampler, ctypes.byref(array))
        return int(array.selected)

    def _pick(self, logits: np.ndarray, *, grammar_first: bool) -> int:
        data = self._candidates
        data["logit"] = logits
        data["p"] = 0.0
        data["id"] = self._ids  # samplers reorder candidates in place
        if grammar_first:
            assert self._grammar is not None
            self._apply(self._grammar, data)
        selected = self._apply(self.ptr, data)
        return int(data["id"][selected])

    def _grammar_allows(self, token: int) -> bool:
        one = self._one
        one["id"] = token
        one["logit"] = 0.0
        assert self._grammar is not None
        self._apply(self._grammar, one)
        return bool(np.isfinite(one["logit"][0]))

    def close(self) -> None:
        if self.ptr:
            lc.llama_sampler_free(self.ptr)
            self.ptr = None
        if self._grammar:
            lc.llama_sampler_free(self._grammar)
            self._grammar = None


def resolve_seed(seed: int | None) -> int:
    """A 32-bit seed for llama.cpp's RNG; a fresh random one when the request gives none
    or one below 0 (-1 is "random" to llama-server, Ollama and many clients)."""
    if seed is None or seed < 0:
        return secrets.randbits(32) & 0xFFFFFFFE  # 0xFFFFFFFF means "random" to llama.cpp
    return seed & 0xFFFFFFFF
