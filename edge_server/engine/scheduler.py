"""Continuous batching over one llama.cpp context.

One engine thread runs the step loop. Each step is a single `llama_decode` over the next
token of every generating sequence plus chunks of waiting prompts (chunked prefill), then
one C sampler call per sequence. Python does a handful of operations per token; the heavy
work (matrix math, sampling) is in C with the GIL released.

KV pressure never throws generated text away: a request whose prompt and `n` x
`max_tokens` cannot fit is refused up front; when the shared cache runs out mid-way
because several requests grew at once, the newest one is preempted (its KV freed, its
text so far kept) and recomputed once there is room again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .batch import DecodeBatch
from .jobs import Choice, Job, JobStats, choice_seed
from .kv_slots import Slot, SlotTable
from .llama_model import LlamaModel
from .logprobs import score_rows, token_logprob
from .request import (
    DONE_MARKER,
    ChoiceDelta,
    EngineError,
    GenerationRequest,
    RequestHandle,
)
from .sampling import GrammarError, SamplerChain, resolve_seed
from .text_stream import TextStream
from .waiting import WaitingQueue

log = logging.getLogger(__name__)

__all__ = ["JobStats", "Scheduler", "SchedulerSettings"]

# llama.cpp's grammar parser and sampler setup recurse in C on this thread: give it a
# stack far deeper than any bounded grammar needs (virtual memory, touched on demand).
_ENGINE_STACK_BYTES = 256 * 1024 * 1024
# A request that needs spare sequences (n > 1) lets later ones pass it for this long,
# then the queue waits for it (no starvation).
_MAX_SKIP_SECONDS = 5.0


@dataclass(frozen=True)
class SchedulerSettings:
    slots: int = 4  # requests decoded at once
    max_waiting: int = 64  # queued requests beyond the slots before 429
    max_wait_seconds: float = 120.0  # a request not admitted by then fails with 503
    # While other sequences are generating, a step evaluates at most this many prompt
    # tokens, so a long prompt delays their next token by a fraction of a second only.
    prefill_chunk_while_decoding: int = 128


class Scheduler:
    def __init__(self, model: LlamaModel, settings: SchedulerSettings) -> None:
        self.model = model
        self.vocab = model.vocab
        self.settings = settings
        self.kv = SlotTable(model, settings.slots)
        self._batch = DecodeBatch(model.n_batch)
        self._waiting = WaitingQueue(settings.max_waiting, settings.max_wait_seconds)
        self._jobs: list[Job] = []
        self._thread: threading.Thread | None = None
        # Watchdog: when the current step began (None between steps).
        self.step_started: float | None = None
        # Called on the engine thread for each finished request (metrics).
        self.on_job_done: Callable[[JobStats], None] | None = None

    # --- public, called from the event loop -----------------------------------------

    @property
    def n_slots(self) -> int:
        return len(self.kv.slots)

    @property
    def max_choices(self) -> int:
        return 1 + self.kv.n_spare_total

    def start(self) -> None:
        self._waiting.open = True
        self._thread = threading.Thread(target=self._run, name="edge-engine", daemon=True)
        previous = threading.stack_size(_ENGINE_STACK_BYTES)
        try:
            self._thread.start()
        finally:
            threading.stack_size(previous)

    def stop(self) -> None:
        for handle in self._waiting.close():
            handle.post([EngineError("the model is shutting down; retry shortly")])
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, request: GenerationRequest) -> RequestHandle:
        # Last guard before C code: anything refused here would otherwise abort it.
        request.check(n_ctx=self.model.n_ctx, max_choices=self.max_choices,
                      n_vocab=self.vocab.n_tokens)
        handle = RequestHandle(request, asyncio.get_running_loop())
        self._waiting.push(handle)
        return handle

    @property
    def idle(self) -> bool:
        return not self._jobs and not self._waiting

    def stalled_for(self) -> float:
        """Seconds the current step has run (0 between steps): the watchdog's reading."""
        started = self.step_started
        return 0.0 if started is None else time.monotonic() - started

    def stats(self) -> dict[str, int]:
        jobs = list(self._jobs)
        return {
            "slots": self.n_slots,
            "busy_slots": sum(s.busy for s in self.kv.slots),
            "busy_sequences": sum(1 for j in jobs for c in j.choices if not c.finished),
            "waiting": len(self._waiting),
            "preempted": sum(j.preempted for j in jobs),
            # Prompt and generated tokens held in the KV cache (cached prefixes included).
            "kv_tokens": self.kv.idle_cached_tokens() + sum(j.kv_cells for j in jobs),
            "kv_capacity": self.model.n_ctx,
        }

    # --- engine thread ----------------------------------------------------------------

    def _run(self) -> None:
        while self._waiting.wait_for_work(bool(self._jobs)):
            self.step_started = time.monotonic()
            try:
                self._step()
            except Exception:  # keep serving: fail the jobs in flight, not the process
                log.exception("engine step failed")
                for job in list(self._jobs):
                    self._abort(job, EngineError("internal engine error", status=500))
            finally:
                self.step_started = None
        for job in list(self._jobs):
            self._abort(job, EngineError("the model is shutting down; retry shortly"))

    def _step(self) -> None:
        self._drop_cancelled()
        self._resume_preempted()
        self._admit()
        active = [j for j in self._jobs if not j.preempted]
        if not active:
            return
        batch = self._batch
        batch.clear()
        decoding: list[tuple[Job, Choice]] = []
        for job in active:
            if job.prefilling or job.replaying:
                continue
            for choice in job.choices:
                if not choice.finished:
                    choice.row = batch.add(
                        choice.next_token, choice.position, choice.seq_id, logits=True
                    )
                    decoding.append((job, choice))
        budget = batch.free
        if decoding:
            budget = min(budget, self.settings.prefill_chunk_while_decoding)
        prefill_spans: list[tuple[Job, int, int]] = []
        replay_spans: list[tuple[Job, Choice, int]] = []
        for job in active:
            if budget <= 0:
                break
            if job.prefilling:
                end, first_row = self._add_prompt_chunk(job, budget)
                budget -= end - job.prefill_at
                prefill_spans.append((job, end, first_row))
            elif job.replaying:
                for choice in job.choices:
                    if choice.replay and not choice.finished and budget > 0:
                        take = choice.replay[:budget]
                        batch.add_span(take, choice.position, choice.seq_id, logits_last=False)
                        budget -= len(take)
                        replay_spans.append((job, choice, len(take)))

        status = batch.decode(self.model.ctx)
        if status == 1 and self.kv.evict_idle():
            status = batch.decode(self.model.ctx)
        if status != 0:
            self._on_decode_failure(status, active)
            return

        for job, end, first_row in prefill_spans:
            if job.request.prompt_logprobs and not job.resuming:
                self._score_prompt(job, end, first_row)
            job.slot.cached.extend(job.request.prompt_tokens[job.prefill_at : end])
            job.prefill_at = end
            if not job.prefilling:
                self._start_choices(job)
        for job, choice, count in replay_spans:
            self._record_decoded(job, choice, choice.replay[:count])
            del choice.replay[:count]
        for job, choice in decoding:
            self._record_decoded(job, choice, [choice.next_token])
            self._on_token(job, choice, choice.row)
        self._finish_done_jobs()

    def _add_prompt_chunk(self, job: Job, budget: int) -> tuple[int, int]:
        prompt = job.request.prompt_tokens
        end = min(len(prompt), job.prefill_at + budget)
        last = end == len(prompt)
        batch = self._batch
        first_row = batch.size
        row = batch.add_span(
            prompt[job.prefill_at : end], job.prefill_at, job.slot.seq_id,
            logits_last=last and not job.resuming,
        )
        if job.request.prompt_logprobs and not job.resuming:
            batch.want_logits[first_row : row + 1] = 1
        if last:
            job.prompt_row = row
        return end, first_row

    def _record_decoded(self, job: Job, choice: Choice, tokens: list[int]) -> None:
        """Tokens of a choice are now in its sequence's KV."""
        if choice.seq_id == job.slot.seq_id:
            job.slot.cached.extend(tokens)
        choice.decoded.extend(tokens)
        choice.position += len(tokens)

    def _start_choices(self, job: Job) -> None:
        """The prompt is in the KV cache: give siblings a copy and sample first tokens
        (or, after a preemption, queue each choice's own tokens to be evaluated again)."""
        for choice in job.choices:
            if choice.seq_id != job.slot.seq_id and not choice.finished:
                self.model.seq_copy(job.slot.seq_id, choice.seq_id)
            choice.position = len(job.request.prompt_tokens)
        if job.resuming:
            job.resuming = False
            return
        job.started = True
        for choice in job.choices:
            self._on_token(job, choice, job.prompt_row)

    def _score_prompt(self, job: Job, end: int, first_row: int) -> None:
        """Scores prompt tokens: row of token j holds the distribution of token j+1."""
        handle, prompt = job.handle, job.request.prompt_tokens
        if job.prefill_at == 0:
            handle.prompt_logprobs.append(None)  # the first token has no context
        last = min(end, len(prompt) - 1)
        if last > job.prefill_at:
            handle.prompt_logprobs.extend(
                score_rows(
                    self.model.logits_rows(first_row, last - job.prefill_at),
                    prompt[job.prefill_at + 1 : last + 1],
                    job.request.logprobs or 0,
                )
            )

    def _on_token(self, job: Job, choice: Choice, row: int) -> None:
        token = choice.sampler.sample(self.model.ctx, row)
        if job.first_token_at is None:
            job.first_token_at = time.monotonic()
        request = job.request
        scored = (
            [token_logprob(self.model.logits_row(row), token, request.logprobs)]
            if request.logprobs is not None
            else None
        )
        # With a grammar, an end-of-generation token is only sampled once the grammar is
        # complete, so it ends the choice even under ignore_eos.
        if self.vocab.is_eog[token] and (
            not request.sampling.ignore_eos or choice.sampler.has_grammar
        ):
            job.finish_choice(choice, "stop", [])
            return
        choice.generated += 1
        text = choice.text.push(self.vocab.pieces[token])
        if choice.text.stopped:
            job.finish_choice(choice, "stop", [token], text, scored)
        elif choice.generated >= request.max_tokens or choice.position + 1 >= self.model.n_ctx:
            text += choice.text.finish()
            job.finish_choice(choice, "length", [token], text, scored)
        else:
            choice.next_token = token
            job.outbox.append(ChoiceDelta(choice.index, text, [token], None, scored))

    def _finish_done_jobs(self) -> None:
        done = [job for job in self._jobs if all(c.finished for c in job.choices)]
        for job in done:
            job.outbox.append(DONE_MARKER)
            self._release(job)
            self._report(job)
        self._flush_outboxes(done)

    def _report(self, job: Job) -> None:
        if self.on_job_done is None:
            return
        try:
            self.on_job_done(job.stats())
        except Exception:
            log.exception("on_job_done callback failed")

    def _flush_outboxes(self, extra: list[Job]) -> None:
        for job in [*self._jobs, *extra]:
            if job.outbox:
                job.handle.post(job.outbox)
                job.outbox = []

    # --- admission and release ----------------------------------------------------------

    def _kv_in_use(self) -> int:
        return sum(j.kv_cells for j in self._jobs)

    def _admit(self) -> None:
        self._waiting.expire()
        if any(j.preempted for j in self._jobs):
            return  # recompute preempted work before taking new work
        candidates = self._waiting.snapshot()
        now = time.monotonic()
        for handle in candidates:
            free = self.kv.free_slots()
            if not free:
                return
            request = handle.request
            room = self.model.n_ctx - self._kv_in_use()
            fits = request.n - 1 <= self.kv.n_spare_free and (
                not self._jobs or len(request.prompt_tokens) <= room
            )
            if not fits:
                if now - handle.submitted_at > _MAX_SKIP_SECONDS:
                    return  # it has waited long enough: nothing may pass it now
                continue
            self._waiting.remove(handle)
            self._start_job(handle, free)

    def _start_job(self, handle: RequestHandle, free: list[Slot]) -> None:
        request = handle.request
        # Every prompt token must be scored for prompt logprobs: evaluate them all.
        slot, keep = self.kv.claim(free, request.prompt_tokens, reuse=not request.prompt_logprobs)
        handle.usage.cached_tokens = keep
        job = Job(request, handle, slot, [], prefill_at=keep)
        self._jobs.append(job)
        base_seed = resolve_seed(request.sampling.seed)
        try:
            for i in range(request.n):
                sampler = SamplerChain(
                    request.sampling,
                    self.vocab,
                    n_ctx=self.model.n_ctx,
                    seed=choice_seed(base_seed, i),
                )
                seq_id = slot.seq_id if i == 0 else self.kv.borrow()
                stream = TextStream(request.stop, include_stop=request.include_stop)
                job.choices.append(Choice(i, seq_id, sampler, stream))
                sampler.prime(request.prompt_tokens)
        except GrammarError as exc:
            self._abort(job, EngineError(str(exc), status=400, code="invalid_grammar"))
        except Exception:
            log.exception("could not start a request")
            self._abort(job, EngineError("internal engine error", status=500))

    def _release(self, job: Job) -> None:
        for choice in job.choices:
            choice.sampler.close()
            if choice.seq_id != job.slot.seq_id:
                self.kv.give_back(choice.seq_id)
        self.kv.release(job.slot)
        self._jobs.remove(job)

    def _abort(self, job: Job, last_item: object) -> None:
        """Ends a job now with `last_item` (an error, or DONE after finished choices)."""
        job.outbox.append(last_item)
        self.kv.forget(job.slot)  # its KV may be half-written: forget it, never trust it
        self._release(job)
        job.handle.post(job.outbox)
        job.outbox = []

    def _drop_cancelled(self) -> None:
        # The handle already told its caller (RequestHandle.cancel); free the sequences.
        for job in [j for j in self._jobs if j.handle.cancelled]:
            job.outbox.clear()
            # A cancelled prompt may be half evaluated; what was evaluated stays usable.
            self._release(job)

    # --- KV pressure --------------------------------------------------------------------

    def _preempt(self, job: Job) -> None:
        log.info("KV cache full: preempting a request to recompute it later")
        self.kv.forget(job.slot)
        for choice in job.choices:
            if choice.seq_id != job.slot.seq_id:
                self.model.seq_remove(choice.seq_id)
        job.preempt()

    def _resume_preempted(self) -> None:
        for job in self._jobs:
            if not job.preempted:
                continue
            others = [j for j in self._jobs if not j.preempted]
            room = self.model.n_ctx - self._kv_in_use()  # idle caches are evicted on demand
            # Headroom: each choice will grow while others do.
            if others and job.recompute_cells + 16 * len(job.choices) > room:
                return  # oldest first: later preempted jobs wait behind it
            job.preempted = False

    def _on_decode_failure(self, status: int, active: list[Job]) -> None:
        if status == 1 and len(active) > 1:
            # The cache is full with several requests growing: the newest makes room.
            self._preempt(active[-1])
            return
        if status == 1:
            # One request alone fills the cache (only possible when the cache is
            # fragmented): end it with what it has, never throw the text away.
            job = active[0]
            if job.prefilling or job.resuming:
                self._abort(job, EngineError("the KV cache is full; retry shortly"))
                return
            for choice in job.choices:
                if not choice.finished:
                    job.finish_choice(choice, "length", [])
            self._finish_done_jobs()
            return
        for job in list(self._jobs):
            self._abort(job, EngineError(f"llama_decode failed ({status})"))
