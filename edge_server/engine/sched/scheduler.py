"""Continuous batching over one llama.cpp context.

One engine thread runs the step loop. Each step is a single `llama_decode` over the next
token of every generating sequence plus chunks of waiting prompts (chunked prefill), then
one C sampler call per sequence. Python does a handful of operations per token; the heavy
work (matrix math, sampling) is in C with the GIL released.

Every slot is a sequence with a KV stream of its own (see kv/slots.py), so a request
never runs out of cache because others grew: what does not fit one stream is refused up
front. A prompt whose prefix another slot holds, or is evaluating right now, copies that
KV instead of evaluating it again. The n choices of a request take as many free slots as
they can; the rest start on the request's own slots as earlier choices finish.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.llama_model import LlamaModel
from edge_server.engine.backend.lora import LoraAdapters
from edge_server.engine.backend.measure.step_cost import StepCost
from edge_server.engine.backend.measure.thread_tuner import ThreadTuner
from edge_server.engine.errors import EngineError
from edge_server.engine.kv.prompt_store import PromptStore
from edge_server.engine.kv.slots import Slot, SlotTable
from edge_server.engine.multimodal.projector import Projector
from edge_server.engine.request import DONE_MARKER, GenerationRequest, RequestHandle
from edge_server.engine.sampling.chain import GrammarError
from edge_server.engine.sampling.logprobs import token_logprob
from edge_server.engine.sampling.lookup_draft import STEP_COST_IN_ROWS, DraftCounts
from edge_server.engine.sched.adapter_turns import AdapterTurns
from edge_server.engine.sched.decode_groups import DecodeGroups
from edge_server.engine.sched.delivery import post_outboxes
from edge_server.engine.sched.draft_depth import draft_depth, measure_step_cost
from edge_server.engine.sched.image_prefill import decode_next_image
from edge_server.engine.sched.jobs import Choice, Job, JobStats
from edge_server.engine.sched.model_draft import DraftModel
from edge_server.engine.sched.seating import (
    add_choices,
    open_job,
    resolve_wait,
    save_prompt_state,
    seat_pending_choices,
    wants_prompt_state,
)
from edge_server.engine.sched.settings import SchedulerSettings
from edge_server.engine.sched.step_batch import fill_step_batch, plan_drafts
from edge_server.engine.sched.token_outcome import take_token
from edge_server.engine.sched.waiting import WaitingQueue

log = logging.getLogger(__name__)

__all__ = ["JobStats", "Scheduler", "SchedulerSettings"]

# llama.cpp's grammar parser and sampler setup recurse in C on this thread: give it a
# stack far deeper than any bounded grammar needs (virtual memory, touched on demand).
_ENGINE_STACK_BYTES = 256 * 1024 * 1024
_READY_TIMEOUT_S = 60.0  # start() waits this long at most for the engine thread
# How long stopping waits for the engine thread to finish its step (a long prefill, an
# image encode) and exit.
STOP_TIMEOUT = 30.0


class Scheduler:
    def __init__(self, model: LlamaModel, settings: SchedulerSettings,
                 store: PromptStore, projector: Projector | None = None,
                 step_cost_file: Path | None = None, lora: LoraAdapters | None = None,
                 drafter: DraftModel | None = None, draft_cost_file: Path | None = None
                 ) -> None:
        self.model = model
        self.drafter = drafter  # a draft model beside the lookups, if one was given
        self._draft_cost_file = draft_cost_file
        self.projector = projector
        self.lora = lora or LoraAdapters(model.model, ())
        self.turns = AdapterTurns()  # one LoRA adapter set a step
        self.vocab = model.vocab
        self.settings = settings
        self.kv = SlotTable(model, store)
        self._batch = DecodeBatch(model.n_batch)
        # Made on the engine thread (see _run): all cores until then.
        self.threads = ThreadTuner(model.n_threads, adaptive=False)
        self._waiting = WaitingQueue(settings.max_waiting, settings.max_wait_seconds)
        self._jobs: list[Job] = []
        self.drafts = DraftCounts()
        self.draft_max = draft_depth(settings.draft_max, model)
        self.drafts_by_cost = True  # False where the step cost could not be measured
        # Replaced on the engine thread by this machine's measured cost (step_cost.py).
        self.step_cost = StepCost.fixed_model(STEP_COST_IN_ROWS)
        self._step_cost_file = step_cost_file
        self.groups: DecodeGroups | None = None  # from the measured cost, if any
        self.grouped_steps = 0  # steps that decoded one group of the generating sequences
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()  # set once the engine thread serves
        # Watchdog: when the current step began (None between steps).
        self.step_started: float | None = None
        # Called on the engine thread for each finished request (metrics).
        self.on_job_done: Callable[[JobStats], None] | None = None

    # --- public, called from the event loop -----------------------------------------

    @property
    def n_slots(self) -> int:
        return len(self.kv.slots)

    def start(self) -> None:
        self._waiting.open = True
        self._thread = threading.Thread(target=self._run, name="edge-engine", daemon=True)
        previous = threading.stack_size(_ENGINE_STACK_BYTES)
        try:
            self._thread.start()
        finally:
            threading.stack_size(previous)
        # The model is not reported loaded while the step cost is measured (at most its
        # time budget, once per machine): requests meanwhile would queue, and time out.
        self._ready.wait(timeout=_READY_TIMEOUT_S)

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Refuses new requests, answers those waiting, and waits up to `timeout` seconds
        for the engine thread to end its step and exit. False: it still runs (a step
        longer than that, or one parked in llama.cpp), so the context is still in use:
        the caller must neither read its KV nor free it."""
        for handle in self._waiting.close():
            handle.request.close()
            handle.post([EngineError("the model is shutting down; retry shortly")])
        if self._thread is None:
            return True
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()

    def submit(self, request: GenerationRequest) -> RequestHandle:
        # Last guard before C code: anything refused here would otherwise abort it.
        request.check(n_ctx=self.model.n_ctx_seq, n_vocab=self.vocab.n_tokens)
        handle = RequestHandle(request, asyncio.get_running_loop())
        request.take_images()  # before the push: the engine thread may end it at once
        try:
            self._waiting.push(handle)
        except BaseException:
            request.take_images(False)
            raise
        return handle

    def fail_all(self, error: EngineError) -> None:
        """Any thread, for when the engine thread cannot go on (a lost RPC server): every
        queued and running request gets `error` now."""
        for handle in self._waiting.close():
            handle.request.close()  # never admitted: the engine thread has not seen it
            handle.post([error])
        for job in list(self._jobs):
            job.handle.post([error])

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        return not self._jobs and not len(self._waiting)

    def running(self) -> list[Job]:
        """The requests being served (a copy: read from the event loop, for /slots)."""
        return list(self._jobs)

    def stalled_for(self) -> float:
        """Seconds the current step has run (0 between steps): the watchdog's reading."""
        started = self.step_started
        return 0.0 if started is None else time.monotonic() - started

    # --- engine thread ----------------------------------------------------------------

    def _run(self) -> None:
        # llama.cpp's OpenMP keeps a team of workers per calling thread, and a team left
        # idle on another thread slows every later step: decode on this thread only.
        self.threads = ThreadTuner.for_model(self.model, adaptive=self.settings.adaptive_threads)
        # The measured cost sets draft depths and, on the CPU, decode groups.
        measured, self.drafts_by_cost = measure_step_cost(self.model, self._step_cost_file,
                                                          self.draft_max)
        if measured is not None:
            self.step_cost = measured
            self.groups = DecodeGroups(measured.widths)
        if self.drafter is not None:
            self.drafter.measure(self._draft_cost_file)
        self._ready.set()
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
        self._end_prompts_over_budget()
        self._admit()
        self._resolve_waits()
        self._seat_pending_choices()
        if any(job.prefilling for job in self._jobs):
            # Prompt chunks and images make long steps: send what is held first.
            self._flush_outboxes([], hold=False)
        adapters, jobs = self.turns.pick(self._jobs)
        if not self.lora.apply(self.model.ctx, adapters):
            for job in jobs:
                self._abort(job, EngineError("llama.cpp refused the LoRA adapters", status=500))
            return
        failed = decode_next_image(jobs, self.model, self.projector, self.kv)
        if failed is not None:
            self._abort(*failed)
        jobs = [job for job in jobs if job in self._jobs]
        if not jobs:
            return
        batch = self._batch
        plan_drafts(batch, jobs, self.draft_max, self.model.n_ctx_seq, self.step_cost,
                    self.kv.kind, self.drafter, self.settings.draft_min, self.drafts_by_cost)
        step = fill_step_batch(batch, jobs, self.settings.prefill_chunk_while_decoding,
                               self.groups)
        if batch.size == 0:
            return  # only jobs waiting for a shared prefix
        self.grouped_steps += step.grouped

        status = self.threads.decode(self.model, batch)
        # Rows per sequence set a recurrent state's rollback room: attention needs none.
        self.kv.decoded(None if self.kv.kind.cuts_anywhere else batch.rows_per_sequence())
        if status != 0:
            # Streams are sized so that checked requests fit: this is llama.cpp failing.
            for job in list(self._jobs):
                self._abort(job, EngineError(f"llama_decode failed ({status})"))
            return

        for job, end, first_row in step.prefill:
            if job.request.prompt_logprobs:
                job.score_prompt(self.model, end, first_row)
            job.slot.cached.extend(job.request.prompt_tokens[job.prefill_at : end])
            job.prefill_at = end
            save_prompt_state(self.model, job)
            job.report_progress()
            if not job.prefilling:
                self.kv.checkpoint(job.slot)
                self._start_choices(job)
        for job, choice in step.firsts:
            if job not in self._jobs:  # ended meanwhile (an abort)
                continue
            self._record_decoded(choice, choice.first_from)
            choice.first_from = -1
            self._on_token(job, choice, choice.row)
        for job, choice in step.decoding:
            if job not in self._jobs:
                continue
            self._record_decoded(choice, choice.next_token)
            self._take_tokens(job, choice)
        self._finish_done_jobs()

    def _take_tokens(self, job: Job, choice: Choice) -> None:
        """Samples the rows of a decoded token and its drafts in order, keeping each draft
        the row before it sampled (its KV is written already) and dropping the rest."""
        drafts, sampled, kept = choice.drafts, [], 0
        for i in range(len(drafts) + 1):
            sampled.append(self._on_token(job, choice, choice.row + i))
            if choice.finished or i == len(drafts) or sampled[-1] != drafts[i]:
                break
            self._record_decoded(choice, drafts[i])
            kept += 1
        if choice.lookup is not None:
            job.handle.usage.prediction_accepted += choice.lookup.observe(sampled)
        if choice.model_rates.proposed and self.drafter is not None:
            self.drafter.counts.accepted += choice.model_rates.observe(sampled)
        if drafts:
            self.drafts.drafted += len(drafts)
            self.drafts.accepted += kept
            job.handle.usage.drafted += len(drafts)
            job.handle.usage.draft_accepted += kept
            if kept < len(drafts):
                assert choice.slot is not None
                if not self.kv.drop_unconfirmed(choice.slot, len(drafts) - kept):
                    # Never expected (drafts are never deeper than a rollback reaches):
                    # the stream lost its tokens, so the sequence cannot go on.
                    self._abort(job, EngineError("llama.cpp could not remove rejected "
                                                 "draft tokens", status=500))

    @staticmethod
    def _record_decoded(choice: Choice, token: int) -> None:
        assert choice.slot is not None
        choice.slot.cached.append(token)
        choice.position += 1

    def _start_choices(self, job: Job) -> None:
        """The prompt is in the KV cache: give the siblings seated so far a copy, and
        sample every seated choice's first token from the prompt's logits."""
        prompt = job.request.prompt_tokens
        if job.request.max_tokens == 0:  # the prompt only (llama-server's n_predict 0)
            for choice in job.choices:
                job.finish_choice(choice, "length", [])
            return
        for choice in job.choices:
            if choice.slot is None:
                continue
            if choice.slot is not job.slot and not self.kv.copy_prefix(
                    job.slot, choice.slot, len(prompt)):
                self._abort(job, EngineError("llama.cpp could not copy a prompt's cache "
                                             "to another choice", status=500))
                return
            choice.position = len(prompt)
            self._on_token(job, choice, job.prompt_row)

    def _on_token(self, job: Job, choice: Choice, row: int) -> int:
        token = choice.sampler.sample(self.model.ctx, row)
        if choice.lookup is not None:
            choice.lookup.push(token)
        if job.first_token_at is None:
            job.first_token_at = time.monotonic()
        request = job.request
        scored = (
            [token_logprob(self.model.logits_row(row), token, request.logprobs)]
            if request.logprobs is not None
            else None
        )
        take_token(job, choice, token, scored, bool(self.vocab.is_eog[token]),
                   self.model.n_ctx_seq)
        return token

    def _end_prompts_over_budget(self) -> None:
        now = time.monotonic()
        if [job for job in self._jobs if job.end_if_over_prompt_budget(now)]:
            self._finish_done_jobs()

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

    def _flush_outboxes(self, finished: list[Job], hold: bool = True) -> None:
        post_outboxes(self._jobs, finished, self.settings.stream_interval_ms / 1000,
                      hold=hold)

    # --- admission, prefix sharing and release -----------------------------------------

    def _admit(self) -> None:
        self._waiting.expire()
        waiting = self._waiting.snapshot()
        for i, handle in enumerate(waiting):
            free = self.kv.free_slots()
            if not free:
                return
            self._waiting.remove(handle)
            self._start_job(handle, free, others_waiting=len(waiting) - i - 1)

    def _start_job(self, handle: RequestHandle, free: list[Slot], others_waiting: int) -> None:
        job = open_job(self.kv, handle, free)
        self._jobs.append(job)
        job.report_progress()  # the cached share, before any evaluation
        try:
            add_choices(job, self.model, self.vocab, free, others_waiting)
            if wants_prompt_state(self.kv, job):
                job.pause_at = len(job.request.prompt_tokens) - 1
                save_prompt_state(self.model, job)
        except GrammarError as exc:
            self._abort(job, EngineError(str(exc), status=400, code="invalid_grammar"))
        except Exception:
            log.exception("could not start a request")
            self._abort(job, EngineError("internal engine error", status=500))

    def _resolve_waits(self) -> None:
        for job in self._jobs:
            if job.wait_for is not None:
                resolve_wait(self.kv, job)
                save_prompt_state(self.model, job)

    def _seat_pending_choices(self) -> None:
        # Free slots go to waiting choices only while no new request waits for one.
        free = [] if len(self._waiting) else self.kv.free_slots()
        for job in seat_pending_choices(self.kv, self._jobs, free):
            self._abort(job, EngineError("a choice's prompt could not be restored",
                                         status=500))

    def _release(self, job: Job) -> None:
        for choice in job.choices:
            choice.sampler.close()
        job.request.close()
        for slot in job.slots:
            self.kv.release(slot)
        self._jobs.remove(job)

    def _abort(self, job: Job, last_item: object) -> None:
        """Ends a job now with `last_item` (an error, or DONE after finished choices)."""
        job.outbox.append(last_item)
        for slot in job.slots:
            self.kv.forget(slot)  # its KV may be half-written: forget it, never trust it
        self._release(job)
        job.handle.post(job.outbox)
        job.outbox = []

    def _drop_cancelled(self) -> None:
        # The handle already told its caller (RequestHandle.cancel); free the sequences.
        # What a cancelled prompt evaluated stays usable as a cached prefix.
        for job in [j for j in self._jobs if j.handle.cancelled]:
            job.outbox.clear()
            self._release(job)
