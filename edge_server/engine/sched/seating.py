"""Where a request's sequences start: a slot for its prompt (with the longest cached
prefix copied in, or a wait for a slot evaluating the same prefix right now), and slots
for its n choices. The scheduler decides when; this module decides where.

A choice seated after its request's prompt was evaluated starts on a stream that holds
the prompt but its last token (evaluated again for the choice's first logits): a cut of
a stream holding the prompt, or a copy cut short. Where the memory cannot cut
(memory_kind.py), the prompt's evaluation pauses one token before its end, so that the
state there is saved for them (`Job.prompt_state`).
"""

from __future__ import annotations

from edge_server.engine.backend.llama_model import LlamaModel
from edge_server.engine.backend.vocab import Vocab
from edge_server.engine.kv.slots import Slot, SlotTable, common_prefix
from edge_server.engine.request import RequestHandle
from edge_server.engine.sampling.chain import resolve_seed
from edge_server.engine.sampling.full_vocab import build_sampler
from edge_server.engine.sched.jobs import Choice, Job, choice_seed
from edge_server.engine.text_stream import IndentGuard, TextStream

# Waiting for a slot that is evaluating the same prefix pays off from this many tokens.
_MIN_SHARED_PREFIX = 64


def _prefill_limit(job: Job) -> int:
    # Keep at least the last prompt token to evaluate: its logits give the first token.
    # Prompt logprobs need every token evaluated.
    return 0 if job.request.prompt_logprobs else len(job.request.prompt_tokens) - 1


def open_job(kv: SlotTable, handle: RequestHandle, free: list[Slot]) -> Job:
    """A job on the free slot that suits its prompt best, its prefix filled from the
    best source (or set to wait for a slot evaluating a longer one)."""
    request = handle.request
    prompt = request.prompt_tokens
    partition = request.cache_partition
    slot = kv.choose(free, prompt, partition)
    slot.busy = True
    job = Job(request, handle, slot, [], prefill_at=0)
    limit = _prefill_limit(job)
    source = kv.best_source(prompt, slot, partition, limit)
    upcoming, shared = kv.upcoming_source(prompt, partition, limit)
    if upcoming is not None and shared >= source.length + _MIN_SHARED_PREFIX:
        job.wait_for = (upcoming, shared)  # evaluate it once, then copy
        kv.hold(upcoming, shared)
    else:
        job.prefill_at = kv.fill(slot, prompt, source, limit=limit, partition=partition)
        slot.target = list(prompt)  # later identical prompts may wait for this one
    handle.usage.cached_tokens = job.prefill_at
    return job


def add_choices(job: Job, model: LlamaModel, vocab: Vocab, free: list[Slot],
                others_waiting: int) -> None:
    """The job's n choices, each with its sampler; the first on the job's slot, the
    others on free slots while nobody else waits for one (raises GrammarError)."""
    request = job.request
    base_seed = resolve_seed(request.sampling.seed)
    # Least recently used last, for pop.
    spare = [] if others_waiting else sorted(
        (s for s in free if s is not job.slot), key=lambda s: (bool(s.cached), s.last_used),
        reverse=True)
    for i in range(request.n):
        sampler = build_sampler(request.sampling, vocab, n_ctx=model.n_ctx_seq,
                                seed=choice_seed(base_seed, i))
        choice = Choice(i, sampler, TextStream(request.stop, include_stop=request.include_stop),
                        pieces=vocab.marked_pieces if request.render_control else vocab.pieces)
        if request.min_indent > 0:
            choice.indent = IndentGuard(request.min_indent)
        job.choices.append(choice)
        sampler.prime(request.prompt_tokens)
        if i == 0:
            choice.slot = job.slot
        elif spare:
            choice.slot = spare.pop()
            choice.slot.busy = True


def resolve_wait(kv: SlotTable, job: Job) -> None:
    """A job waiting for a shared prefix copies it once its source has evaluated it (or
    evaluates it itself if the source went away)."""
    assert job.wait_for is not None
    source, length = job.wait_for
    prompt, partition = job.request.prompt_tokens, job.request.cache_partition
    if not kv.can_copy_from(source):
        return  # its own copy lands with the next decode
    if (len(source.cached) < length and source.partition == partition
            and source.target[:length] == prompt[:length]):
        return  # still evaluating it
    limit = _prefill_limit(job)
    job.wait_for = None
    job.prefill_at = kv.fill(job.slot, prompt, kv.best_source(prompt, job.slot, partition, limit),
                             limit=limit, partition=partition)
    job.handle.usage.cached_tokens = job.prefill_at
    job.slot.target = list(prompt)


def seat_pending_choices(kv: SlotTable, jobs: list[Job], free: list[Slot]) -> list[Job]:
    """Choices beyond the free slots start on their request's own sequences as its
    earlier choices finish, or on `free` slots (shared fairly among the requests that
    have choices waiting). Returns the jobs whose choice could not be given its prompt
    (never expected: the caller ends them)."""
    failed: list[Job] = []
    ready = [j for j in jobs if j.pending_choices() and not j.prefilling and j.wait_for is None]
    share = -(-len(free) // len(ready)) if ready else 0
    for job in ready:
        pending = job.pending_choices()
        prompt = job.request.prompt_tokens
        done_slots = [s for s in job.slots
                      if not any(c.slot is s and not c.finished for c in job.choices)]
        extra = free[: max(0, min(share, len(pending) - len(done_slots)))]
        free = free[len(extra):]
        for slot, choice in zip(done_slots + extra, pending, strict=False):
            slot.busy = True
            choice.slot = slot
            if not _hold_prompt_but_last(kv, job, slot):
                failed.append(job)
                break
            choice.position = len(prompt) - 1
            choice.first_from = prompt[-1]
    return failed


def _hold_prompt_but_last(kv: SlotTable, job: Job, slot: Slot) -> bool:
    """Makes `slot` hold the job's prompt but its last token: cut there, copied from the
    job's slot, or restored from the state saved there."""
    prompt, partition = job.request.prompt_tokens, job.request.cache_partition
    keep = len(prompt) - 1
    mine = slot.cached_for(partition)
    if common_prefix(mine, prompt) >= keep and kv.can_cut(slot, keep):
        kv.trim(slot, keep)
        return len(slot.cached) == keep
    if not kv.kind.recurrent and kv.copy_prefix(job.slot, slot, keep):
        return True
    if job.prompt_state is None:
        return False
    return kv.restore_state(slot, job.prompt_state, prompt[:keep], partition)


def wants_prompt_state(kv: SlotTable, job: Job) -> bool:
    """Whether the job's later choices will need the state one token before its prompt's
    end saved (a memory that cannot be cut there afterwards, or a sliding window that may
    not: memory_kind.py)."""
    return (not kv.kind.cuts_anywhere and bool(job.pending_choices())
            and job.prompt_state is None and len(job.request.prompt_tokens) > 1)


def save_prompt_state(model: LlamaModel, job: Job) -> None:
    """Saves the job's state where its prompt evaluation paused for it (wants_prompt_state)."""
    if job.pause_at and job.prefill_at == job.pause_at and job.wait_for is None:
        job.prompt_state = model.seq_state(job.slot.seq_id)
        job.pause_at = 0
