"""Whole-vocabulary sampling in numpy (engine/sampling/full_vocab.py), on a vocabulary
as large as Gemma 3's: it draws from softmax(logits / T) over every token (no hidden
top-k: tokens far down the list are drawn as often as their probability says), repeats
itself for a seed, and honours logit_bias and ignore_eos. Through the server, the seeded
and biased sampling tests of test_fields.py and test_generation.py run on it too."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_server.engine.sampling.chain import SamplingParams
from edge_server.engine.sampling.full_vocab import FullVocabSampler, full_vocab_eligible

VOCAB = 262_144
DRAWS = 20_000


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    scaled = logits.astype(np.float64) / temperature
    weights = np.exp(scaled - scaled.max())
    return weights / weights.sum()  # type: ignore[no-any-return]


def peaked_logits() -> np.ndarray:
    """Eight likely tokens spread over the vocabulary, and a long flat tail that holds
    most of the probability at T=1 and a tenth at T=0.7."""
    rng = np.random.default_rng(7)
    logits = rng.normal(0.0, 0.5, VOCAB).astype(np.float32)
    likely = [3, 1_000, 65_535, 65_536, 131_071, 200_000, 262_000, VOCAB - 1]
    logits[likely] = np.linspace(9.5, 8.5, len(likely), dtype=np.float32)
    return logits


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_draws_follow_the_whole_distribution(temperature: float) -> None:
    logits = peaked_logits()
    expected = softmax(logits, temperature)
    sampler = FullVocabSampler(SamplingParams(temperature=temperature), VOCAB, [], seed=42)
    drawn = np.bincount([sampler.sample_logits(logits) for _ in range(DRAWS)],
                        minlength=VOCAB)
    top = np.argsort(-expected)[:8]
    for token in top:
        p = expected[token]
        sigma = math.sqrt(DRAWS * p * (1 - p))
        assert abs(drawn[token] - DRAWS * p) < 5 * sigma, (token, drawn[token], DRAWS * p)
    tail = 1.0 - expected[top].sum()
    sigma = math.sqrt(DRAWS * tail * (1 - tail))
    assert tail > 0.05
    assert abs(drawn.sum() - drawn[top].sum() - DRAWS * tail) < 5 * sigma
    # No truncation: tail tokens are drawn, from all over the vocabulary.
    tail_drawn = np.flatnonzero(drawn)
    tail_drawn = tail_drawn[~np.isin(tail_drawn, top)]
    assert len(tail_drawn) > 100
    assert tail_drawn.min() < VOCAB // 8 and tail_drawn.max() > VOCAB - VOCAB // 8


def test_a_seed_repeats_its_draws_and_seeds_differ() -> None:
    logits = peaked_logits()

    def draws(seed: int) -> list[int]:
        sampler = FullVocabSampler(SamplingParams(temperature=1.0), VOCAB, [], seed=seed)
        return [sampler.sample_logits(logits) for _ in range(200)]

    assert draws(5) == draws(5)
    assert draws(5) != draws(6)


def test_bias_and_ignore_eos_move_the_draws() -> None:
    logits = peaked_logits()
    banned = [3, 1_000, 65_535, 65_536]  # the likeliest: as end-of-generation tokens
    favoured = 12_345
    params = SamplingParams(temperature=1.0, ignore_eos=True, logit_bias={favoured: 12.0})
    sampler = FullVocabSampler(params, VOCAB, banned, seed=1)
    drawn = [sampler.sample_logits(logits) for _ in range(2_000)]
    assert not set(drawn) & set(banned)
    assert drawn.count(favoured) > 300  # now the likeliest token, about a third
    # The logits the engine passes in are llama.cpp's own buffer: never written.
    assert np.array_equal(logits, peaked_logits())


def test_greedy_takes_the_first_maximum() -> None:
    logits = np.zeros(VOCAB, dtype=np.float32)
    logits[[10, 20]] = 5.0
    sampler = FullVocabSampler(SamplingParams(temperature=0.0), VOCAB, [], seed=1)
    assert sampler.sample_logits(logits) == 10
    biased = FullVocabSampler(SamplingParams(temperature=0.0, logit_bias={10: -100.0}),
                              VOCAB, [], seed=1)
    assert biased.sample_logits(logits) == 20


@pytest.mark.parametrize("temperature", [5e-324, 1e-40, 2e-39, 1e-31])
def test_a_vanishing_temperature_is_greedy(temperature: float) -> None:
    """1/T would overflow float32: the draw is the limit, greedy, never NaN's pick."""
    logits = peaked_logits()
    sampler = FullVocabSampler(SamplingParams(temperature=temperature), VOCAB, [], seed=3)
    assert all(sampler.sample_logits(logits) == int(np.argmax(logits)) for _ in range(20))


def test_a_small_temperature_draws_the_peak() -> None:
    logits = peaked_logits()
    sampler = FullVocabSampler(SamplingParams(temperature=1e-20), VOCAB, [], seed=3)
    assert all(sampler.sample_logits(logits) == int(np.argmax(logits)) for _ in range(20))


def test_truncating_and_stateful_samplers_stay_in_llama_cpp() -> None:
    assert full_vocab_eligible(SamplingParams(temperature=0.7))
    assert full_vocab_eligible(SamplingParams(temperature=0.0, logit_bias={1: 2.0}))
    for params in (SamplingParams(top_k=40), SamplingParams(top_p=0.95),
                   SamplingParams(min_p=0.05), SamplingParams(presence_penalty=0.5),
                   SamplingParams(mirostat_target=3.0), SamplingParams(typical_p=0.9),
                   SamplingParams(grammar="root ::= \"a\"")):
        assert not full_vocab_eligible(params)
