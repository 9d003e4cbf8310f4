"""The scheduler's record of an admitted request and of each of its choices."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .kv_slots import Slot
from .logprobs import TokenLogprob
from .request import ChoiceDelta, GenerationRequest, RequestHandle
from .sampling import SamplerChain
from .text_stream import TextStream

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
    seq_id: int
    sampler: SamplerChain
    text: TextStream
    generated: int = 0
    next_token: int = -1  # sampled, not yet decoded
    position: int = 0  # KV position next_token will take
    row: int = -1  # batch row whose logits it samples from
    finished: bool = False
    decoded: list[int] = field(default_factory=list)  # generated tokens now in the KV cache
    # After a preemption: generated tokens to evaluate again before decoding goes on.
    replay: list[int] = field(default_factory=list)


@dataclass
class Job:
    request: GenerationRequest
    handle: RequestHandle
    slot: Slot
    choices: list[Choice]
    prefill_at: int  # index of the next prompt token to evaluate
    prompt_row: int = -1  # row holding the last prompt token's logits, once evaluated
    outbox: list[object] = field(default_factory=list)
    admitted_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    started: bool = False  # the prompt was evaluated and first tokens sampled
    preempted: bool = False  # its KV was freed for others; it waits to be recomputed
    resuming: bool = False  # recomputing after a preemption: no new first tokens

    @property
    def prefilling(self) -> bool:
        return self.prefill_at < len(self.request.prompt_tokens)

    @property
    def replaying(self) -> bool:
        return any(c.replay for c in self.choices if not c.finished)

    @property
    def kv_cells(self) -> int:
        """KV cells this job occupies (siblings share the prompt's cells)."""
        if self.preempted:
            return 0
        return self.prefill_at + sum(len(c.decoded) for c in self.choices)

    @property
    def recompute_cells(self) -> int:
        """KV cells a preempted job needs to come back."""
        return len(self.request.prompt_tokens) + sum(
            len(c.decoded) + len(c.replay) for c in self.choices
        )

    def finish_choice(
        self,
        choice: Choice,
        reason: str,
        tokens: list[int],
        text: str = "",
        scored: list[TokenLogprob] | None = None,
    ) -> None:
        # Flush held-back text unless a stop string ended it, or the caller already did.
        if (reason == "stop" and not choice.text.stopped) or (reason == "length" and not tokens):
            text += choice.text.finish()
        choice.finished = True
        choice.replay.clear()
        self.handle.usage.completion_tokens += choice.generated
        self.outbox.append(ChoiceDelta(choice.index, text, tokens, reason, scored))

    def preempt(self) -> None:
        """Its KV was freed: its choices keep their text, samplers and tokens so far, and
        evaluate the prompt and their tokens again once resumed."""
        self.preempted = True
        # Choices that already began recompute their tokens; a prompt cut short by the
        # preemption simply starts again.
        self.resuming = self.started
        if not self.started:
            self.handle.prompt_logprobs.clear()
        for choice in self.choices:
            choice.replay = [] if choice.finished else [*choice.decoded, *choice.replay]
            choice.decoded = []
            choice.position = 0
        self.prefill_at = 0

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
