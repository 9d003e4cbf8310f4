"""The scheduler's record of an admitted request and of each of its choices."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from edge_server.engine.backend.llama_model import LlamaModel
from edge_server.engine.kv.slots import Slot
from edge_server.engine.request import (
    ChoiceDelta,
    FinishReason,
    GenerationRequest,
    PromptProgress,
    RequestHandle,
)
from edge_server.engine.sampling.chain import Sampler
from edge_server.engine.sampling.logprobs import TokenLogprob, score_rows
from edge_server.engine.sampling.lookup_draft import LookupDraft
from edge_server.engine.sched.model_draft import DraftRates
from edge_server.engine.text_stream import IndentGuard, TextStream

# Choice i of a request samples with its own seed: the request's seed for choice 0 (so
# n=1 is repeatable with the same seed), then steps of the golden ratio.
_SEED_STEP = 0x9E3779B1
_RANDOM_SEED = 0xFFFFFFFF  # llama.cpp reads this seed as "pick one at random"


def choice_seed(base: int, index: int) -> int:
    seed = (base + index * _SEED_STEP) & 0xFFFFFFFF
    return 0 if seed == _RANDOM_SEED else seed


@dataclass(frozen=True)
class JobStats:
    """Timings and counts of one finished request, for metrics."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    queued_s: float  # submit -> admitted
    first_token_s: float | None  # submit -> first token sampled
    decode_s: float  # first token -> finished


@dataclass
class Choice:
    index: int
    sampler: Sampler
    text: TextStream
    # The vocabulary's pieces, with control tokens rendered where the request asks.
    pieces: list[bytes] = field(default_factory=list)
    slot: Slot | None = None  # None: waiting for a sequence (n larger than free slots)
    generated: int = 0
    next_token: int = -1  # sampled, not yet decoded
    position: int = 0  # KV position next_token will take
    row: int = -1  # batch row whose logits it samples from
    finished: bool = False
    # A choice that starts on a sequence which already holds the prompt evaluates the
    # last prompt token again to get the logits of its first token.
    first_from: int = -1  # that token, or -1
    lookup: LookupDraft | None = None  # made at its first decode step (step_batch)
    model_rates: DraftRates = field(default_factory=DraftRates)  # the draft model's hits
    drafts: list[int] = field(default_factory=list)  # rows after next_token this step
    indent: IndentGuard | None = None  # with the request's min_indent

    @property
    def seq_id(self) -> int:
        assert self.slot is not None
        return self.slot.seq_id


@dataclass
class Job:
    request: GenerationRequest
    handle: RequestHandle
    slot: Slot  # the sequence that evaluates the prompt
    choices: list[Choice]
    prefill_at: int  # index of the next prompt token to evaluate
    prompt_row: int = -1  # row holding the last prompt token's logits, once evaluated
    outbox: list[object] = field(default_factory=list)
    admitted_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    posted_at: float | None = None  # when its tokens last went to the caller
    # Waiting for another slot to finish evaluating a shared prefix: (slot, tokens).
    wait_for: tuple[Slot, int] | None = None
    # Where the prompt's evaluation pauses so its state is saved there (0: nowhere), and
    # that state: what choices seated later start from (seating.py).
    pause_at: int = 0
    prompt_state: bytes | None = None

    @property
    def prefilling(self) -> bool:
        return self.prefill_at < len(self.request.prompt_tokens)

    @property
    def slots(self) -> list[Slot]:
        seen = [self.slot]
        for choice in self.choices:
            if choice.slot is not None and choice.slot not in seen:
                seen.append(choice.slot)
        return seen

    def report_progress(self) -> None:
        """With return_progress: how far the prompt's evaluation has come."""
        if self.request.return_progress:
            self.outbox.append(PromptProgress(
                total=len(self.request.prompt_tokens), cached=self.handle.usage.cached_tokens,
                processed=self.prefill_at,
                time_ms=round((time.monotonic() - self.admitted_at) * 1000, 3)))

    def end_if_over_prompt_budget(self, now: float) -> bool:
        """Ends every choice, with no text, of a request still evaluating its prompt past
        max_prompt_ms. What was evaluated stays cached (its slot keeps it), so the same
        prompt resumes from there next time."""
        budget = self.request.max_prompt_ms
        if budget is None or not self.prefilling or (now - self.admitted_at) * 1000 <= budget:
            return False
        for choice in self.choices:
            if not choice.finished:
                self.finish_choice(choice, "length", [])
        return True

    def score_prompt(self, model: LlamaModel, end: int, first_row: int) -> None:
        """Scores the prompt tokens evaluated this step, up to `end`: the row of token j
        holds the distribution of token j+1."""
        handle, prompt = self.handle, self.request.prompt_tokens
        if self.prefill_at == 0:
            handle.prompt_logprobs.append(None)  # the first token has no context
        last = min(end, len(prompt) - 1)
        if last > self.prefill_at:
            handle.prompt_logprobs.extend(
                score_rows(
                    model.logits_rows(first_row, last - self.prefill_at),
                    prompt[self.prefill_at + 1 : last + 1],
                    self.request.logprobs or 0,
                )
            )

    def over_predict_budget(self, now: float) -> bool:
        """Generating for longer than the request's max_predict_ms."""
        budget, first = self.request.max_predict_ms, self.first_token_at
        return budget is not None and first is not None and (now - first) * 1000 > budget

    def over_answer_ceiling(self, now: float) -> bool:
        """Submitted longer ago than the request's max_answer_s (an unbounded answer's
        ceiling)."""
        ceiling = self.request.max_answer_s
        return ceiling is not None and now - self.handle.submitted_at > ceiling

    def pending_choices(self) -> list[Choice]:
        return [c for c in self.choices if c.slot is None and not c.finished]

    def finish_choice(
        self,
        choice: Choice,
        reason: FinishReason,
        tokens: list[int],
        text: str = "",
        scored: list[TokenLogprob] | None = None,
    ) -> None:
        # Flush held-back text unless a stop string ended it, or the caller already did.
        if (reason == "stop" and not choice.text.stopped) or (reason == "length" and not tokens):
            text += choice.text.finish()
        choice.finished = True
        self.handle.usage.completion_tokens += choice.generated
        self.outbox.append(ChoiceDelta(choice.index, text, tokens, reason, scored,
                                       choice.text.stop_word))

    def stats(self) -> JobStats:
        now = time.monotonic()
        usage, first = self.handle.usage, self.first_token_at
        return JobStats(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            queued_s=self.admitted_at - self.handle.submitted_at,
            first_token_s=None if first is None else first - self.handle.submitted_at,
            decode_s=0.0 if first is None else now - first,
        )
