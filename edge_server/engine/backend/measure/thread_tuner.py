"""How many CPU threads each decode step gets, chosen by measurement.

On a small machine llama.cpp shares its few cores with the HTTP layer and, often, with
the clients themselves. llama.cpp's workers meet at a spinning barrier after every
operation of the graph, so when another thread takes one of their cores, the others
spin until it comes back: a step on every core can be slower than a step that leaves
one core free for the rest. Which is faster depends on the machine, the model, the batch
and the load of the moment, so the tuner measures instead of guessing. Decode steps (up
to ADAPTIVE_MAX_TOKENS tokens) are grouped by their token count (a power-of-two class);
in each class every candidate is timed a few times, then the fastest serves most steps
while the others are timed again now and then, so a change of load moves the choice.
llama.cpp's CPU kernels split work by output rows, so the thread count should not change
the numbers a step computes; `same_numbers_on` checks that at load, and where it does
not hold the tuner stays off (a seed must give the same text whatever the load).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.llama_model import LlamaModel

log = logging.getLogger(__name__)

WARMUP_SAMPLES = 4  # timings of each candidate before the class trusts its figures
EXPLORE_EVERY = 32  # one step in this many, per class, re-times a candidate not in use
# A candidate's figure is the median of its latest timings: one slow step (a new graph
# shape, a page fault, a burst of other work) must not condemn a count that is rarely
# timed again.
RECENT_SAMPLES = 9
# Larger steps evaluate prompts: compute-bound and long, so every core wins there and
# timing fewer would only slow the prompts it is tried on.
ADAPTIVE_MAX_TOKENS = 32


def candidate_counts(max_threads: int) -> tuple[int, ...]:
    """All cores, and all cores but one where that leaves llama.cpp two or more."""
    if max_threads <= 2:
        return (max_threads, 1) if max_threads == 2 else (1,)
    return (max_threads, max_threads - 1)


_PROBE_TEXT = "A step computes the same numbers on any number of threads, or else"


def same_numbers_on(model: LlamaModel, counts: tuple[int, ...]) -> bool:
    """Whether decoding gives bit-identical logits on each thread count: a short prompt
    in sequence 0, then one generated token, each way (sequence 0 is left empty)."""
    if len(counts) < 2:
        return True
    tokens = model.vocab.tokenize(_PROBE_TEXT, add_special=True, parse_special=False)
    batch = DecodeBatch(len(tokens) + 1)
    first: list[np.ndarray] | None = None
    try:
        for threads in counts:
            model.set_threads(threads)
            model.seq_remove(0)
            batch.clear()
            batch.add_span(tokens, 0, 0, logits_last=True)
            if model.decode(batch) != 0:
                return False
            rows = [model.logits_row(len(tokens) - 1).copy()]
            batch.clear()
            batch.add(int(rows[0].argmax()), len(tokens), 0, logits=True)
            if model.decode(batch) != 0:
                return False
            rows.append(model.logits_row(0).copy())
            if first is None:
                first = rows
            elif not all(np.array_equal(a, b) for a, b in zip(first, rows, strict=True)):
                return False
        return True
    finally:
        model.seq_remove(0)
        model.set_threads(model.n_threads)


@dataclass
class _StepClass:
    """Latest seconds per token, per candidate thread count."""

    recent: dict[int, deque[float]] = field(default_factory=dict)
    samples: dict[int, int] = field(default_factory=dict)
    steps: int = 0
    explored: int = 0  # which other candidate the next exploration times


class ThreadTuner:
    def __init__(self, max_threads: int, *, adaptive: bool = True) -> None:
        self.max_threads = max_threads
        self.candidates = candidate_counts(max_threads) if adaptive else (max_threads,)
        self._classes: dict[int, _StepClass] = {}

    @classmethod
    def for_model(cls, model: LlamaModel, *, adaptive: bool) -> ThreadTuner:
        """A tuner over the model's thread count, adaptive only where thread counts give
        the same numbers."""
        if adaptive and not same_numbers_on(model, candidate_counts(model.n_threads)):
            log.info("thread counts change llama.cpp's numbers here: adaptive threads off")
            adaptive = False
        return cls(model.n_threads, adaptive=adaptive)

    def decode(self, model: LlamaModel, batch: DecodeBatch) -> int:
        """llama_decode of the batch on the chosen thread count, timed for the tuner."""
        if len(self.candidates) == 1:  # nothing to choose: nothing to time
            return model.decode(batch)
        threads = self.choose(batch.size)
        model.set_threads(threads)
        started = time.perf_counter()
        status = model.decode(batch)
        self.record(batch.size, threads, time.perf_counter() - started)
        return status

    @staticmethod
    def _class_of(n_tokens: int) -> int:
        return max(1, n_tokens).bit_length()

    def choose(self, n_tokens: int) -> int:
        """The thread count for a step of `n_tokens` tokens."""
        if len(self.candidates) == 1 or n_tokens > ADAPTIVE_MAX_TOKENS:
            return self.max_threads
        cls = self._classes.setdefault(self._class_of(n_tokens), _StepClass())
        cls.steps += 1
        for count in self.candidates:
            if cls.samples.get(count, 0) < WARMUP_SAMPLES:
                return count
        best = self.best(n_tokens)
        if cls.steps % EXPLORE_EVERY == 0:
            others = [c for c in self.candidates if c != best]
            cls.explored += 1
            return others[cls.explored % len(others)]
        return best

    def record(self, n_tokens: int, threads: int, seconds: float) -> None:
        """The wall time of a step of `n_tokens` tokens on `threads` threads."""
        if (len(self.candidates) == 1 or threads not in self.candidates
                or n_tokens > ADAPTIVE_MAX_TOKENS):
            return
        cls = self._classes.setdefault(self._class_of(n_tokens), _StepClass())
        recent = cls.recent.setdefault(threads, deque(maxlen=RECENT_SAMPLES))
        recent.append(seconds / max(1, n_tokens))
        cls.samples[threads] = cls.samples.get(threads, 0) + 1

    def best(self, n_tokens: int) -> int:
        """The fastest candidate measured for steps of this size (all cores if unknown)."""
        cls = self._classes.get(self._class_of(n_tokens))
        if cls is None or not cls.recent:
            return self.max_threads
        return min(cls.recent, key=lambda count: statistics.median(cls.recent[count]))
