"""What a step does when the shared KV cache has no room for its batch.

All slots share one cache (backend/llama_model.py), so one request may use every cell,
and requests that together want more than the cache holds meet here: llama_decode
answers NO_ROOM and changes nothing. Room is then made, cheapest loss first, and the
decode tried again:

1. an idle slot's cells go (least recently used first; a long prefix is kept in the
   prompt store, so a later request sharing it loads it back);
2. prompts wait: the batch keeps the running requests' next tokens only, and their
   drafts go next;
3. the youngest request still evaluating its prompt gives its cells back and starts its
   prompt over once there is room (running requests go first);
4. the youngest running requests pause, a step at a time, so the older ones grow and
   finish; where the oldest alone still finds no room, the paused request holding the
   most cells ends, finish reason "length", as one at the end of its context does. One
   lone prompt that still finds no room fails with 503.

Admission (`admits`) keeps requests with short answers from meeting here at all: one
starts when its prompt and answer fit beside the running ones. No request gets a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .errors import EngineError
from .jobs import Choice, Job
from .kv.slots import SlotTable
from .request import GenerationRequest
from .step_batch import StepBatch

log = logging.getLogger(__name__)

NO_ROOM = 1  # llama_decode: no KV cells for the batch; the cache is as it was

__all__ = ["NO_ROOM", "admits", "decode_in_room"]

# Answer cells reserved at admission: max_tokens up to this share of the cache per slot
# (at least _MIN_ANSWER_SHARE). Short answers are reserved whole, so requests that fit
# together never meet below; open-ended ones grow past it into free cells.
_MIN_ANSWER_SHARE = 512


def _reserved(request: GenerationRequest, n_ctx: int, n_slots: int) -> int:
    share = max(n_ctx // (2 * max(n_slots, 1)), _MIN_ANSWER_SHARE)
    return len(request.prompt_tokens) + request.n * min(request.max_tokens, share)


def admits(jobs: list[Job], request: GenerationRequest, n_ctx: int, n_slots: int) -> bool:
    """Whether `request` may start now: alone always (it fits the context: checked at
    submit), else when its reserved cells fit beside the running requests' (idle slots'
    cells do not count: they are evicted for it). Shared prefixes count once per
    request: a conservative figure."""
    if not jobs:
        return True
    held = sum(_reserved(job.request, n_ctx, n_slots) for job in jobs)
    return held + _reserved(request, n_ctx, n_slots) <= n_ctx


def decode_in_room(kv: SlotTable, jobs: list[Job], decode: Callable[[], int],
                   refill: Callable[[bool, set[int]], StepBatch], step: StepBatch,
                   abort: Callable[[Job, EngineError], None]) -> tuple[int, StepBatch]:
    """Decodes the step's batch, making room as above while llama.cpp finds none.
    `refill(prefill, paused)` rebuilds the batch (with or without prompt chunks, without
    the choices whose id() is in `paused`) and returns the new step; returns
    llama_decode's last status and the step that ran."""
    with_prefill, paused = True, set[int]()
    status = decode()
    while status == NO_ROOM:
        running = [*step.firsts, *step.decoding]
        if kv.evict_idle():
            pass
        elif step.prefill and running:
            with_prefill = False
        elif any(choice.drafts for _, choice in step.decoding):
            for _, choice in step.decoding:
                choice.drafts = []
        elif _restart_youngest_prompt(kv, jobs):
            pass
        elif len(running) > 1:
            paused.add(id(_youngest(jobs, running)))
        elif paused or running:
            _end_largest(kv, jobs, paused, running)
            paused.clear()
        else:
            for job, _, _ in step.prefill:
                abort(job, EngineError("the KV cache has no room for this prompt now; "
                                       "retry shortly"))
            return 0, StepBatch()
        step = refill(with_prefill, paused)
        if not (step.decoding or step.firsts or step.prefill):
            return 0, step
        status = decode()
    return status, step


def _youngest(jobs: list[Job], running: list[tuple[Job, Choice]]) -> Choice:
    """The choice of the most recently admitted job among `running` (its last)."""
    order = {id(job): i for i, job in enumerate(jobs)}
    return max(running, key=lambda item: (order[id(item[0])], item[1].index))[1]


def _restart_youngest_prompt(kv: SlotTable, jobs: list[Job]) -> bool:
    """The youngest job evaluating its prompt with cells to give, if another job holds
    cells too, forgets what it evaluated and starts its prompt over later."""
    holders = [job for job in jobs if any(slot.cached for slot in job.slots)]
    for job in reversed(jobs):
        restartable = (job.prefilling and job.slot.cached and job.wait_for is None
                       and not job.request.prompt_logprobs and not job.request.images)
        if restartable and len(holders) > 1:
            kv.forget(job.slot)
            job.prefill_at = 0
            job.handle.usage.cached_tokens = 0
            return True
    return False


def _end_largest(kv: SlotTable, jobs: list[Job], paused: set[int],
                 running: list[tuple[Job, Choice]]) -> None:
    """Ends the paused (else running) choice holding the most cells: with only the
    oldest left to run, the cache is full of what it and the paused ones hold."""
    candidates = [(job, c) for job in jobs for c in job.choices
                  if id(c) in paused and not c.finished] or running
    job, choice = max(candidates, key=lambda item: len(item[1].slot.cached)
                      if item[1].slot is not None else 0)
    log.info("KV cache full: a choice ends at %d tokens (finish reason length)",
             len(choice.slot.cached) if choice.slot is not None else 0)
    job.finish_choice(choice, "length", [])
    # Its cells go unless the job's prompt slot must still seed a waiting sibling.
    if choice.slot is not None and (choice.slot is not job.slot or not job.pending_choices()):
        kv.forget(choice.slot)
