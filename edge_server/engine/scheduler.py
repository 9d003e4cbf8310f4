"""Continuous batching over one llama.cpp context.

One engine thread runs the step loop. Each step is a single `llama_decode` over the next
token of every generating sequence plus chunks of waiting prompts (chunked prefill), then
one C sampler call per sequence. Python does a handful of operations per token; the heavy
work (matrix math, sampling) is in C with the GIL released.

Sequence ids: ids 0..slots-1 are cache slots whose KV survives a request, so the next
request sharing a prefix (a system prompt, a growing chat) evaluates only its new tail.
Extra choices of an `n > 1` request borrow ids from a pool above the slots and get a copy
of the prompt's KV instead of evaluating it again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .batch import DecodeBatch
from .llama_model import LlamaModel
from .logprobs import TokenLogprob, token_logprob
from .request import (
    DONE_MARKER,
    ChoiceDelta,
    EngineError,
    EngineOverloaded,
    GenerationRequest,
    RequestHandle,
)
from .sampling import GrammarError, SamplerChain, resolve_seed
from .text_stream import TextStream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerSettings:
    slots: int = 4  # requests decoded at once
    max_waiting: int = 64  # queued requests beyond the slots before 429
    max_wait_seconds: float = 120.0  # a request not admitted by then fails with 503
    # While other sequences are generating, a step evaluates at most this many prompt
    # tokens, so a long prompt delays their next token by a fraction of a second only.
    prefill_chunk_while_decoding: int = 128


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
class _Slot:
    seq_id: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV this sequence holds
    busy: bool = False
    last_used: float = 0.0


@dataclass
class _Choice:
    index: int
    seq_id: int
    sampler: SamplerChain
    text: TextStream
    generated: int = 0
    next_token: int = -1  # sampled, not yet decoded
    position: int = 0  # KV position next_token will take
    row: int = -1  # batch row whose logits it samples from
    finished: bool = False


@dataclass
class _Job:
    request: GenerationRequest
    handle: RequestHandle
    slot: _Slot
    choices: list[_Choice]
    prefill_at: int  # index of the next prompt token to evaluate
    prompt_row: int = -1  # row holding the last prompt token's logits, once evaluated
    outbox: list[object] = field(default_factory=list)
    admitted_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None

    @property
    def prefilling(self) -> bool:
        return self.prefill_at < len(self.request.prompt_tokens)


class Scheduler:
    def __init__(self, model: LlamaModel, settings: SchedulerSettings) -> None:
        self.model = model
        self.vocab = model.vocab
        n_slots = max(1, min(settings.slots, model.n_seq_max))
        self.settings = settings
        self._slots = [_Slot(seq_id=i) for i in range(n_slots)]
        self._spare_seq_ids = list(range(n_slots, model.n_seq_max))
        self._batch = DecodeBatch(model.n_batch)
        self._waiting: deque[RequestHandle] = deque()
        self._jobs: list[_Job] = []
        self._wake = threading.Condition()
        self._running = False
        self._thread: threading.Thread | None = None
        # Called on the engine thread for each finished request (metrics).
        self.on_job_done: Callable[[JobStats], None] | None = None

    # --- public, called from the event loop -----------------------------------------

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    @property
    def max_choices(self) -> int:
        return 1 + len(self._spare_seq_ids)

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._run, name="edge-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._running = False
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, request: GenerationRequest) -> RequestHandle:
        self._check(request)
        handle = RequestHandle(request, asyncio.get_running_loop())
        with self._wake:
            if len(self._waiting) >= self.settings.max_waiting:
                raise EngineOverloaded("too many requests are waiting; retry shortly")
            self._waiting.append(handle)
            self._wake.notify()
        return handle

    @property
    def idle(self) -> bool:
        return not self._jobs and not self._waiting

    def stats(self) -> dict[str, int]:
        jobs = list(self._jobs)
        return {
            "slots": len(self._slots),
            "busy_slots": sum(s.busy for s in self._slots),
            "busy_sequences": sum(1 for j in jobs for c in j.choices if not c.finished),
            "waiting": len(self._waiting),
            # Prompt and generated tokens held in the KV cache (cached prefixes included).
            "kv_tokens": sum(len(s.cached) for s in self._slots)
            + sum(c.position for j in jobs for c in j.choices if c.seq_id != j.slot.seq_id),
            "kv_capacity": self.model.n_ctx,
        }

    def _check(self, request: GenerationRequest) -> None:
        """Last guard before C code: anything here would otherwise abort the process."""
        tokens = request.prompt_tokens
        if not tokens:
            raise EngineError("the prompt is empty", status=400, code="invalid_prompt")
        if any(not self.vocab.is_valid(t) for t in tokens):
            raise EngineError("the prompt holds a token id outside the vocabulary", status=400)
        if len(tokens) + request.max_tokens > self.model.n_ctx:
            raise EngineError("prompt and max_tokens exceed the context", status=400)
        if request.n > self.max_choices:
            raise EngineError(f"n may be at most {self.max_choices} here", status=400)

    # --- engine thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._running and not self._jobs and not self._waiting:
                    self._wake.wait()
                if not self._running:
                    break
            try:
                self._step()
            except Exception:  # keep serving: fail the jobs in flight, not the process
                log.exception("engine step failed")
                for job in list(self._jobs):
                    self._abort(job, EngineError("internal engine error", status=500))
                self._flush_outboxes([])
        for job in list(self._jobs):
            self._abort(job, EngineError("server is shutting down"))
        self._flush_outboxes([])

    def _step(self) -> None:
        self._drop_cancelled()
        self._admit()
        if not self._jobs:
            return
        batch = self._batch
        batch.clear()
        decoding: list[tuple[_Job, _Choice]] = []
        for job in self._jobs:
            if job.prefilling:
                continue
            for choice in job.choices:
                if not choice.finished:
                    choice.row = batch.add(
                        choice.next_token, choice.position, choice.seq_id, logits=True
                    )
                    decoding.append((job, choice))
        prefill_spans: list[tuple[_Job, int, int]] = []
        budget = batch.free
        if decoding:
            budget = min(budget, self.settings.prefill_chunk_while_decoding)
        for job in self._jobs:
            if not job.prefilling or budget <= 0:
                continue
            prompt = job.request.prompt_tokens
            end = min(len(prompt), job.prefill_at + budget)
            budget -= end - job.prefill_at
            last = end == len(prompt)
            first_row = batch.size
            row = batch.add_span(
                prompt[job.prefill_at : end], job.prefill_at, job.slot.seq_id, logits_last=last
            )
            if job.request.prompt_logprobs:
                batch.want_logits[first_row : row + 1] = 1
            prefill_spans.append((job, end, first_row))
            if last:
                job.prompt_row = row

        status = batch.decode(self.model.ctx)
        if status == 1 and self._evict_idle_caches():
            status = batch.decode(self.model.ctx)
        if status != 0:
            self._on_decode_failure(status)
            return

        for job, end, first_row in prefill_spans:
            if job.request.prompt_logprobs:
                self._score_prompt(job, end, first_row)
            job.slot.cached.extend(job.request.prompt_tokens[job.prefill_at : end])
            job.prefill_at = end
            if not job.prefilling:
                self._start_choices(job)
        for job, choice in decoding:
            if choice.seq_id == job.slot.seq_id:
                job.slot.cached.append(choice.next_token)
            choice.position += 1
            self._on_token(job, choice, choice.row)
        self._finish_done_jobs()

    def _start_choices(self, job: _Job) -> None:
        """The prompt is in the KV cache: give siblings a copy and sample first tokens."""
        for choice in job.choices:
            if choice.seq_id != job.slot.seq_id:
                self.model.seq_copy(job.slot.seq_id, choice.seq_id)
            choice.position = len(job.request.prompt_tokens)
        for choice in job.choices:
            self._on_token(job, choice, job.prompt_row)

    def _score_prompt(self, job: _Job, end: int, first_row: int) -> None:
        """Scores prompt tokens: row of token j holds the distribution of token j+1."""
        handle, prompt, top_n = job.handle, job.request.prompt_tokens, job.request.logprobs or 0
        if job.prefill_at == 0:
            handle.prompt_logprobs.append(None)  # the first token has no context
        for j in range(job.prefill_at, min(end, len(prompt) - 1)):
            row = first_row + (j - job.prefill_at)
            handle.prompt_logprobs.append(
                token_logprob(self.model.logits_row(row), prompt[j + 1], top_n)
            )

    def _on_token(self, job: _Job, choice: _Choice, row: int) -> None:
        token = choice.sampler.sample(self.model.ctx, row)
        if job.first_token_at is None:
            job.first_token_at = time.monotonic()
        request = job.request
        scored = (
            [token_logprob(self.model.logits_row(row), token, request.logprobs)]
            if request.logprobs is not None
            else None
        )
        if self.vocab.is_eog[token] and not request.sampling.ignore_eos:
            self._finish_choice(job, choice, "stop", [])
            return
        choice.generated += 1
        text = choice.text.push(self.vocab.pieces[token])
        if choice.text.stopped:
            self._finish_choice(job, choice, "stop", [token], text, scored)
        elif choice.generated >= request.max_tokens or choice.position + 1 >= self.model.n_ctx:
            text += choice.text.finish()
            self._finish_choice(job, choice, "length", [token], text, scored)
        else:
            choice.next_token = token
            job.outbox.append(ChoiceDelta(choice.index, text, [token], None, scored))

    def _finish_choice(
        self,
        job: _Job,
        choice: _Choice,
        reason: str,
        tokens: list[int],
        text: str = "",
        scored: list[TokenLogprob] | None = None,
    ) -> None:
        if reason == "stop" and not choice.text.stopped:
            text += choice.text.finish()
        choice.finished = True
        job.handle.usage.completion_tokens += choice.generated
        job.outbox.append(ChoiceDelta(choice.index, text, tokens, reason, scored))

    def _finish_done_jobs(self) -> None:
        done = [job for job in self._jobs if all(c.finished for c in job.choices)]
        for job in done:
            job.outbox.append(DONE_MARKER)
            self._release(job)
            self._report(job)
        self._flush_outboxes(done)

    def _report(self, job: _Job) -> None:
        if self.on_job_done is None:
            return
        now = time.monotonic()
        usage = job.handle.usage
        first = job.first_token_at
        try:
            self.on_job_done(JobStats(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cached_tokens=usage.cached_tokens,
                queued_s=job.admitted_at - job.handle.submitted_at,
                first_token_s=None if first is None else first - job.handle.submitted_at,
                decode_s=0.0 if first is None else now - first,
            ))
        except Exception:
            log.exception("on_job_done callback failed")

    def _flush_outboxes(self, extra: list[_Job]) -> None:
        for job in [*self._jobs, *extra]:
            if job.outbox:
                job.handle.post(job.outbox)
                job.outbox = []

    # --- admission and release ----------------------------------------------------------

    def _admit(self) -> None:
        self._expire_waiting()
        while True:
            with self._wake:
                if not self._waiting:
                    return
                handle = self._waiting[0]
                if handle.cancelled:
                    self._waiting.popleft()
                    continue
                free = [s for s in self._slots if not s.busy]
                if not free or handle.request.n - 1 > len(self._spare_seq_ids):
                    return
                self._waiting.popleft()
            self._start_job(handle, free)

    def _expire_waiting(self) -> None:
        """Drops waiting requests whose client left; those that waited too long for a
        slot get a clear error instead of a hang."""
        if not self._waiting:
            return
        deadline = time.monotonic() - self.settings.max_wait_seconds
        with self._wake:
            gone = [h for h in self._waiting if h.cancelled or h.submitted_at < deadline]
            for handle in gone:
                self._waiting.remove(handle)
            expired = [h for h in gone if not h.cancelled]
        for handle in expired:
            handle.post(
                [
                    EngineOverloaded(
                        f"no slot became free within {self.settings.max_wait_seconds:g}s; "
                        "retry later",
                        status=503,
                    )
                ]
            )

    def _start_job(self, handle: RequestHandle, free: list[_Slot]) -> None:
        request = handle.request
        prompt = request.prompt_tokens
        slot = max(free, key=lambda s: (_common_prefix(s.cached, prompt), -s.last_used))
        # Keep the shared prefix, but always re-evaluate at least the last prompt token:
        # its logits are needed to sample the first token.
        keep = min(_common_prefix(slot.cached, prompt), len(prompt) - 1)
        if request.prompt_logprobs:
            keep = 0  # every prompt token must be scored, so every one is evaluated
        if not self.model.seq_remove(slot.seq_id, keep, -1):
            self.model.seq_remove(slot.seq_id)
            keep = 0
        del slot.cached[keep:]
        slot.busy = True
        handle.usage.cached_tokens = keep
        job = _Job(request, handle, slot, [], prefill_at=keep)
        self._jobs.append(job)
        base_seed = resolve_seed(request.sampling.seed)
        try:
            for i in range(request.n):
                sampler = SamplerChain(
                    request.sampling,
                    self.vocab,
                    n_ctx=self.model.n_ctx,
                    seed=(base_seed + i) & 0xFFFFFFFE,
                )
                seq_id = slot.seq_id if i == 0 else self._spare_seq_ids.pop()
                stream = TextStream(request.stop, include_stop=request.include_stop)
                job.choices.append(_Choice(i, seq_id, sampler, stream))
                sampler.prime(prompt)
        except GrammarError as exc:
            self._abort(job, EngineError(str(exc), status=400, code="invalid_grammar"))
        except Exception:
            log.exception("could not start a request")
            self._abort(job, EngineError("internal engine error", status=500))

    def _release(self, job: _Job) -> None:
        for choice in job.choices:
            choice.sampler.close()
            if choice.seq_id != job.slot.seq_id:
                self.model.seq_remove(choice.seq_id)
                self._spare_seq_ids.append(choice.seq_id)
        job.slot.busy = False
        job.slot.last_used = time.monotonic()
        self._jobs.remove(job)

    def _abort(self, job: _Job, last_item: object) -> None:
        """Ends a job now with `last_item` (an error, or DONE after finished choices)."""
        job.outbox.append(last_item)
        # The slot's KV may be half-written: forget it rather than trust it.
        self.model.seq_remove(job.slot.seq_id)
        job.slot.cached.clear()
        self._release(job)
        job.handle.post(job.outbox)
        job.outbox = []

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._jobs if j.handle.cancelled]:
            job.outbox.clear()
            # A cancelled prompt may be half evaluated; what was evaluated stays usable.
            self._release(job)

    def _evict_idle_caches(self) -> bool:
        """Free the KV of idle slots to make room; True if anything was freed."""
        freed = False
        for slot in self._slots:
            if not slot.busy and slot.cached:
                self.model.seq_remove(slot.seq_id)
                slot.cached.clear()
                freed = True
        return freed

    def _on_decode_failure(self, status: int) -> None:
        if status == 1 and len(self._jobs) > 1:
            # The KV cache is full with several requests in flight: end the newest one
            # so the others can go on.
            newest = self._jobs[-1]
            log.warning("KV cache full: ending the newest request")
            for choice in newest.choices:
                if not choice.finished:
                    self._finish_choice(newest, choice, "length", [])
            self._abort(newest, DONE_MARKER)
            return
        message = "the KV cache is full" if status == 1 else f"llama_decode failed ({status})"
        for job in list(self._jobs):
            self._abort(job, EngineError(message))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
