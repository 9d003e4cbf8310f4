"""Draft tokens by lookup (prompt lookup decoding): the tokens that followed the last
earlier occurrence of a sequence's newest n-gram, in its prompt or its own output.

A drafted token costs a batch row. The step verifies it by sampling that row's logits
with the choice's own sampler, in order, and keeps drafts while each sampled token equals
the draft (scheduler.py). Sampling a draft's position uses the sampler, state and random
stream that decoding one token at a time would use there; what differs is the logits
(see Numerics below), and the number of `llama_decode` calls, which falls.

Whether drafting pays depends on the text (small models loop, code edits repeat the
prompt) and on the batch. llama.cpp runs a multi-sequence batch as one graph only while
every sequence has the same number of rows in it (llama_batch_allocr::split_equal), so a
step drafts the same depth for every generating sequence or for none. Each sequence keeps
two rates of its lookups: how often the first looked-up token is the one sampled
(observed on every token, drafted or not), and how often a further one is, given the one
before it was (observed on kept drafts). Copying comes in runs (an edited block is copied
verbatim between the edits), so once a lookup's first token is right the rest mostly
is: one rate for every position would draft too shallow there. The step picks, of the
depths whose steps were timed (1, 3, 7 and 15 on the CPU: 16 rows fill one block of
llama.cpp's Q4_K kernel), the one with the most tokens expected per unit of decode time.

The cost of a step is measured once per model, llama.cpp build and CPU and then read
from disk (backend/measure/step_cost.py), not timed as steps run: the depth shapes the batch,
the shape changes llama.cpp's numerics in the last bits, and a choice made from live
timings would let the same seed write a different text on a second run.

Two guards keep drafting from losing where the estimate is off: a step drafts only when
it expects `draft_margin(n)` times the tokens per second of not drafting, and a sequence
whose first looked-up tokens are sampled less than MIN_HIT_RATE of the time counts as
proposing nothing (its rows are paid for, never counted on). The margin covers what the
step cost (llama_decode timed on an idle machine) leaves out: live steps share the cores
with the HTTP layer and the clients, and each drafted row is also sampled and its KV
entry kept or dropped. Beyond eight sequences it grows, the gain a step can make there
being small beside that work.

A request may also give a reference text, OpenAI's predicted output (`prediction`): the
answer it expects, e.g. the file being edited. Its n-grams are looked up before the
sequence's own: where the answer follows the reference, drafts come from it, and after
a departure (the edit) the next n-gram that matches finds the reference again, at its
first occurrence past the point last followed, so a repeated line does not send the
lookup to the reference's end.

Numerics: drafted rows are evaluated by llama.cpp's multi-row kernels, whose results
differ slightly from one-row decoding (they equal those of prompt evaluation), so a
greedy output can diverge from its undrafted twin after some tokens. A request may turn
drafting off for the steps it takes part in (GenerationRequest.draft).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

NGRAM_SIZES = (3, 2, 1)  # longest match first
_FIRST_RATE_DECAY = 0.8  # weight of the past in a sequence's first rate (one look a token)
# ... and in its run rate, which sees every kept draft (several looks a step) and so
# forgets more slowly per look to span as many steps.
_RUN_RATE_DECAY = 0.9
# Used until the step cost of this machine is known (and where it cannot be measured):
# a step's cost beyond its rows, in rows' worth, on a 2-core x86 CPU (SmolLM2-135M, one
# sequence 7.3 ms + 4.1 ms a row, eight 12 ms + 3.8 ms a row).
STEP_COST_IN_ROWS = 2.5
# Drafting must expect this many times the tokens/s of not drafting. Measured on a 2-core
# AVX-512 box with flash attention, SmolLM2, one client: at 1.03 drafting lost 6% on
# sampled text that kept 81% of its drafts (the table is timed on an idle machine; live
# steps share the cores with the HTTP layer and the clients, and more rows suffer more).
DRAFT_MARGIN = 1.10
DRAFT_MARGIN_PER_SEQUENCE = 0.01  # ... and this much more for each sequence beyond
MARGIN_FLAT_UP_TO = 8  # ... this many
MIN_HIT_RATE = 0.3  # below it a sequence's lookups are not counted on


def draft_margin(sequences: int) -> float:
    return DRAFT_MARGIN + DRAFT_MARGIN_PER_SEQUENCE * max(sequences - MARGIN_FLAT_UP_TO, 0)


def choose_depth(proposals: list[list[int]], rates: list[tuple[float, float]],
                 depths: Sequence[int], cost: Callable[[int], float]) -> int:
    """Draft depth for a step whose sequences proposed these lookups: of `depths`
    (ascending, StepCost.draft_depths), the one expecting the most tokens per unit of
    decode time, `cost(rows)` being a step's, if that beats no drafts by draft_margin;
    else 0. `rates` holds each sequence's (first, run) rates: its first draft is kept
    with probability `first`, each further one with probability `run` once the one
    before it was, if its lookup reached that far and its first rate is counted on."""
    n = len(proposals)
    undrafted = n / cost(n)
    best_depth, best_rate = 0, undrafted * draft_margin(n)
    expected = float(n)
    kept = [first if first >= MIN_HIT_RATE else 0.0 for first, _ in rates]
    candidates = set(depths)
    for depth in range(1, max(depths, default=0) + 1):
        expected += sum(p for draft, p in zip(proposals, kept, strict=True)
                        if len(draft) >= depth)
        if depth in candidates:
            rate = expected / cost(n * (1 + depth))
            if rate > best_rate:
                best_depth, best_rate = depth, rate
        kept = [p * run for p, (_, run) in zip(kept, rates, strict=True)]
    return best_depth


def expected_tokens(proposals: list[list[int]], rates: list[tuple[float, float]],
                    depth: int) -> float:
    """Tokens a step drafting `depth` rows a sequence is expected to yield (choose_depth's
    estimate at that depth)."""
    expected = float(len(proposals))
    kept = [first if first >= MIN_HIT_RATE else 0.0 for first, _ in rates]
    for level in range(1, depth + 1):
        expected += sum(p for draft, p in zip(proposals, kept, strict=True)
                        if len(draft) >= level)
        kept = [p * run for p, (_, run) in zip(kept, rates, strict=True)]
    return expected


@dataclass
class DraftCounts:
    """Totals for /health: rows drafted and drafts kept."""

    drafted: int = 0
    accepted: int = 0


class Reference:
    """A predicted output's tokens, indexed by their n-grams (every occurrence)."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)
        self._at: dict[tuple[int, ...], list[int]] = {}  # n-gram -> indexes that follow it
        for end in range(1, len(self.tokens)):
            for size in NGRAM_SIZES:
                if end >= size:
                    self._at.setdefault(tuple(self.tokens[end - size : end]), []).append(end)
        self.cursor = 0  # where the answer last followed the reference

    def follow(self, gram: tuple[int, ...]) -> int | None:
        """The index after the gram's first occurrence at or past the cursor (else its
        first), None where it never occurs."""
        found = self._at.get(gram)
        if not found:
            return None
        i = bisect.bisect_left(found, self.cursor)
        return found[i] if i < len(found) else found[0]


class LookupDraft:
    """One choice's token history, indexed by its n-grams, and its lookup hit rate."""

    def __init__(self, tokens: list[int], reference: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        # n-gram -> index of the token that followed its latest occurrence
        self._follow: dict[tuple[int, ...], int] = {}
        self.reference = Reference(reference) if reference else None
        self._from_reference: int | None = None  # where this step's lookup read it
        # Uncommitted until lookups have been seen: the first looked-up token sampled,
        # and a further one sampled once the one before it was.
        self.first_rate = 0.5
        self.run_rate = 0.5
        self._after_hit = False  # the last token seen was a guess sampled
        self.proposed: list[int] = []  # this step's lookup, drafted or not
        for token in tokens:
            self.push(token)

    @property
    def rates(self) -> tuple[float, float]:
        return self.first_rate, self.run_rate

    def push(self, token: int) -> None:
        tokens = self.tokens
        end = len(tokens)
        for size in NGRAM_SIZES:
            if end >= size:
                self._follow[tuple(tokens[end - size :])] = end
        tokens.append(token)

    def lookup(self, depth: int) -> list[int]:
        """Up to `depth` tokens that followed the newest n-gram: in the reference, else
        at its last earlier occurrence in the sequence. Continuing into the tokens it
        proposes makes a repeating loop draft whole."""
        self._from_reference = None
        tokens = self.tokens
        for size in NGRAM_SIZES:
            if len(tokens) < size:
                continue
            gram = tuple(tokens[-size:])
            start = self.reference.follow(gram) if self.reference is not None else None
            if start is not None:
                assert self.reference is not None
                self._from_reference = start
                return self.reference.tokens[start : start + depth]
            start = self._follow.get(gram) if len(tokens) > size else None
            if start is None:
                continue
            draft: list[int] = []
            for i in range(start, start + depth):
                token = tokens[i] if i < len(tokens) else draft[i - len(tokens)]
                if token < 0:  # an image placeholder: not a token to decode
                    break
                draft.append(token)
            return draft
        return []

    def propose(self, depth: int) -> list[int]:
        """This step's lookup, kept for `observe`."""
        self.proposed = self.lookup(depth)
        return self.proposed

    def observe(self, sampled: list[int]) -> int:
        """Updates the rates from the tokens sampled this step, in order; returns how many
        of them the reference predicted. The first lookup token is seen even when nothing
        was drafted; so is a run going on without drafts (a first guess sampled right
        after a guess was), or the run rate, never fed, could never make drafting start
        where one draft alone does not pay."""
        hits = 0
        for i, (guess, token) in enumerate(zip(self.proposed, sampled, strict=False)):
            hit = guess == token
            if i == 0:
                self.first_rate = _decayed(self.first_rate, hit, _FIRST_RATE_DECAY)
            if i > 0 or self._after_hit:
                self.run_rate = _decayed(self.run_rate, hit, _RUN_RATE_DECAY)
            self._after_hit = hit
            if not hit:
                break
            hits += 1
        if not self.proposed:
            self._after_hit = False
        self.proposed = []
        if self._from_reference is None or self.reference is None:
            return 0
        if hits:
            self.reference.cursor = self._from_reference + hits
        return hits


def _decayed(rate: float, hit: bool, decay: float) -> float:
    return decay * rate + (1 - decay) * hit
