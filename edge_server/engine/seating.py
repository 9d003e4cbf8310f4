"""Where a request's sequences start: a slot for its prompt (with the longest cached
prefix copied in, or a wait for a slot evaluating the same prefix right now), and slots
for its n choices. The scheduler decides when; this module decides where.
"""

from __future__ import annotations

from .backend.llama_model import LlamaModel, Vocab
from .jobs import Choice, Job, choice_seed
from .kv.slots import PrefixSource, Slot, SlotTable, common_prefix
from .request import RequestHandle
from .sampling.chain import resolve_seed
from .sampling.full_vocab import build_sampler
from .text_stream import IndentGuard, TextStream

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
    partition = request.partition
    slot = kv.choose(free, prompt, partition)
    slot.busy = True
    job = Job(request, handle, slot, [], prefill_at=0)
    limit = _prefill_limit(job)
    source = kv.best_source(prompt, slot, partition)
    upcoming, shared = kv.upcoming_source(prompt, partition)
    if upcoming is not None and min(shared, limit) >= source.length + _MIN_SHARED_PREFIX:
        job.wait_for = (upcoming, min(shared, limit))  # evaluate it once, then copy
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
    prompt, partition = job.request.prompt_tokens, job.request.partition
    if not kv.can_copy_from(source):
        return  # its own copy lands with the next decode
    if common_prefix(source.cached_for(partition), prompt) >= length:
        found = PrefixSource(length, slot=source)
    elif source.partition == partition and source.target[:length] == prompt[:length]:
        return  # still evaluating it
    else:
        found = kv.best_source(prompt, job.slot, partition)
    job.wait_for = None
    job.prefill_at = kv.fill(job.slot, prompt, found, limit=_prefill_limit(job),
                             partition=partition)
    job.handle.usage.cached_tokens = job.prefill_at
    job.slot.target = list(prompt)


def seat_pending_choices(kv: SlotTable, model: LlamaModel, jobs: list[Job],
                         free: list[Slot]) -> None:
    """Choices beyond the free slots start on their request's own sequences as its
    earlier choices finish, or on `free` slots (shared fairly among the requests that
    have choices waiting)."""
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
            if common_prefix(slot.cached_for(job.request.partition), prompt) < len(prompt) - 1:
                kv.copy_prefix(job.slot, slot, len(prompt) - 1)
            else:
                model.seq_remove(slot.seq_id, len(prompt) - 1, -1)
                del slot.cached[len(prompt) - 1 :]
            choice.slot = slot
            choice.position = len(prompt) - 1
            choice.first_from = prompt[-1]
