"""One engine step's batch: the next token of every generating sequence plus chunks of
waiting prompts, with rows in ascending sequence id.

The order matters for speed. With a KV stream per sequence, llama.cpp splits a batch
into ubatches that hold only consecutive, increasing sequence ids (llama_batch_allocr::
split_equal, sequential), one graph run each: the same 8 sequences added as 4,5,6,7,0,1,
2,3 took two runs per step, 15% longer than in order (measured here, SmolLM2, 8 x 64
steps: 3.74 s against 3.25 s). Where prompt chunks share a step with one-row tokens,
ascending order makes the first ubatch take one row of every sequence, chunks included,
and the chunks' other rows a second; the chunks then go first instead, as one large run,
whenever that leaves fewer or smaller runs (backend/ubatch_split.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.measure.step_cost import StepCost
from edge_server.engine.backend.memory_kind import MemoryKind
from edge_server.engine.backend.ubatch_split import small_rows, ubatch_shapes
from edge_server.engine.sampling.lookup_draft import LookupDraft, choose_depth, expected_tokens
from edge_server.engine.sched.decode_groups import DecodeGroups
from edge_server.engine.sched.image_prefill import text_end
from edge_server.engine.sched.jobs import Choice, Job
from edge_server.engine.sched.model_draft import DraftModel


@dataclass
class StepBatch:
    decoding: list[tuple[Job, Choice]] = field(default_factory=list)  # next tokens
    firsts: list[tuple[Job, Choice]] = field(default_factory=list)  # re-evaluated prompt ends
    prefill: list[tuple[Job, int, int]] = field(default_factory=list)  # job, end, first row
    grouped: bool = False  # some generating sequences sit this step out (decode_groups)


def _chunk_end(job: Job, budget: int) -> int:
    """Where the job's next prompt chunk ends: within `budget`, before its next image, at
    a point where its state is to be saved or copied (Job.pause_at, Slot.holds)."""
    start = job.prefill_at
    end = min(len(job.request.prompt_tokens), start + budget)
    for stop in (job.pause_at, *job.slot.holds):
        if start < stop < end:
            end = stop
    return text_end(job.request, start, end)


def _add_chunk(batch: DecodeBatch, job: Job, end: int) -> int:
    """Adds prompt tokens prefill_at..end of the job; returns the first row."""
    prompt = job.request.prompt_tokens
    first_row = batch.size
    row = batch.add_span(prompt[job.prefill_at : end], job.prefill_at, job.slot.seq_id,
                         logits_last=end == len(prompt))
    if job.request.prompt_logprobs:
        batch.want_logits[first_row : row + 1] = 1
    if end == len(prompt):
        job.prompt_row = row
    return first_row


def plan_drafts(batch: DecodeBatch, jobs: list[Job], most: int, n_ctx_seq: int,
                cost: StepCost, kind: MemoryKind, drafter: DraftModel | None = None,
                draft_min: int = 0, by_cost: bool = True) -> None:
    """Sets every generating choice's drafts for this step: the same number for each,
    short ones padded, so the batch stays one graph run; from lookups (lookup_draft.py)
    or, where it is expected to yield more tokens per second, the draft model
    (model_draft.py); `draft_min` rows at least where either has a guess (--draft-min).
    Without `by_cost` (an unmeasured step cost), only forced drafts are made.
    None while a generating request asked for no drafting (one-row
    numerics for all its tokens). Never deeper than the memory can take back (a
    recurrent state: a rollback of the decode that verifies them)."""
    generating = [(job, c) for job in jobs for c in job.choices
                  if c.slot is not None and not c.finished and c.next_token >= 0]
    for _, choice in generating:
        choice.drafts = []
    if most <= 0 or not generating or any(c.first_from >= 0 for job in jobs
                                           for c in job.choices if c.slot is not None):
        return
    if any(not job.request.draft for job, _ in generating):
        return
    most = min(kind.draft_limit(most), (batch.capacity // 2) // len(generating),
               *(n_ctx_seq - c.position - 2 for _, c in generating))
    # Drafts past the choice's last token could only be thrown away.
    room = [max(job.request.max_tokens - c.generated - 1, 0) for job, c in generating]
    proposals = []
    rates = []
    for (job, choice), left in zip(generating, room, strict=True):
        assert choice.slot is not None
        if choice.lookup is None:
            choice.lookup = LookupDraft([*choice.slot.cached, choice.next_token],
                                        job.request.prediction)
        rates.append(choice.lookup.rates)
        proposals.append(choice.lookup.propose(max(most, 1))[:left])
    n = len(generating)
    depths = cost.draft_depths(most)

    def step(rows: int) -> float:
        return cost.seconds(n, rows)

    depth = choose_depth(proposals, rates, depths, step) if by_cost else 0
    if draft_min > 0 and any(proposals):
        depth = max(depth, _forced_depth(depths, draft_min, most))
    if drafter is not None and most > 0:
        # A request that named the draft model (LM Studio's draft_model) drafts with it.
        asked = any(job.request.draft_model is not None for job, _ in generating)
        forced = max(draft_min, 1) if asked else draft_min
        if by_cost or forced > 0:
            model = _model_drafts(drafter, generating, room, most, depths, step,
                                  expected_tokens(proposals, rates, depth) / step(n * (1 + depth)),
                                  forced)
            if model is not None:
                proposals, depth = model
    for (_, choice), draft in zip(generating, proposals, strict=True):
        # A row past a short draft is a guess too: cheaper than a second graph run.
        filler = draft[-1] if draft else choice.next_token
        choice.drafts = (draft + [filler] * depth)[:depth]


def _forced_depth(depths: Sequence[int], draft_min: int, most: int) -> int:
    """The shallowest timed depth that drafts `draft_min` rows (--draft-min), at most `most`."""
    return min((d for d in depths if d >= draft_min), default=most)


def _model_drafts(drafter: DraftModel, generating: list[tuple[Job, Choice]], room: list[int],
                  most: int, depths: Sequence[int], step: Callable[[int], float],
                  lookup_rate: float, draft_min: int) -> tuple[list[list[int]], int] | None:
    """The draft model's drafts and depth for this step, where its expected tokens per
    second (its own decodes counted) beat the lookups' `lookup_rate`, or where it must
    draft `draft_min` tokens at least; else None."""
    n = len(generating)
    per_draft = drafter.step_seconds(n, step(n))
    rates = [c.model_rates.pair for _, c in generating]
    reach = [[0] * min(most, left) for left in room]

    def drafting(rows: int) -> float:
        return step(rows) + (rows // n - 1) * per_draft

    depth = choose_depth(reach, rates, depths, drafting)
    if draft_min > 0:
        depth = max(depth, _forced_depth(depths, draft_min, most))
    elif depth == 0 or expected_tokens(reach, rates, depth) / drafting(n * (1 + depth)) \
            <= lookup_rate:
        return None
    wanted = [(c.seq_id, [*c.slot.cached, c.next_token], job.request.sampling.logit_bias)
              for job, c in generating if c.slot is not None]
    drafts = drafter.propose(wanted, depth)
    proposals = []
    for (_, choice), draft, left in zip(generating, drafts, room, strict=True):
        choice.model_rates.proposed = draft[:left]
        proposals.append(draft[:left])
    drafter.counts.drafted += sum(len(d) for d in proposals)
    return proposals, depth


def fill_step_batch(batch: DecodeBatch, jobs: list[Job], prefill_while_decoding: int,
                    groups: DecodeGroups | None = None) -> StepBatch:
    """Fills `batch` for one step. Prompt chunks share what the batch has left in job
    order (while sequences generate, at most `prefill_while_decoding` tokens per waiting
    prompt, so a long prompt delays their next token by one chunk a step). Without
    drafts, the generating sequences may take turns in groups (decode_groups.py)."""
    batch.clear()
    tokens: list[tuple[int, Job, Choice]] = []
    for job in jobs:
        for choice in job.choices:
            if choice.slot is not None and not choice.finished and (
                    choice.first_from >= 0 or choice.next_token >= 0):
                tokens.append((choice.seq_id, job, choice))
    generating = sorted(seq for seq, _, c in tokens if c.first_from < 0)
    step = StepBatch()
    if groups is not None and generating and not any(c.drafts for _, _, c in tokens):
        turn = groups.pick(generating)
        if len(turn) < len(generating):
            step.grouped = True
            tokens = [t for t in tokens if t[2].first_from >= 0 or t[0] in turn]
    budget = batch.capacity - len(tokens) - sum(len(c.drafts) for _, _, c in tokens)
    if tokens:
        # A share per waiting prompt: one long prompt delays the generating sequences
        # by a chunk a step, while a burst of new requests is evaluated in large batches
        # (a 1.5B model's prompts ran at 12 ms a token in 128-token chunks of three
        # prompts, 10 ms in batches of 300; llama-server fills its whole batch).
        waiting = sum(1 for job in jobs if job.prefilling and job.wait_for is None)
        budget = min(budget, prefill_while_decoding * max(1, waiting))
    chunks: list[tuple[int, Job, int]] = []
    for job in jobs:
        if budget <= 0:
            break
        if job.prefilling and job.wait_for is None:
            end = _chunk_end(job, budget)
            if end > job.prefill_at:  # else an image comes first (image_prefill)
                budget -= end - job.prefill_at
                chunks.append((job.slot.seq_id, job, end))
    order = _row_order(tokens, chunks, batch.capacity)
    for seq, kind, i in order:
        if kind == 1:
            _, job, end = chunks[i]
            step.prefill.append((job, end, _add_chunk(batch, job, end)))
            continue
        _, job, choice = tokens[i]
        if choice.first_from >= 0:
            choice.row = batch.add(choice.first_from, choice.position, seq, logits=True)
            step.firsts.append((job, choice))
        else:
            choice.row = batch.add(choice.next_token, choice.position, seq, logits=True)
            for i, token in enumerate(choice.drafts, start=1):
                batch.add(token, choice.position + i, seq, logits=True)
            step.decoding.append((job, choice))
    return step


def _row_order(tokens: list[tuple[int, Job, Choice]], chunks: list[tuple[int, Job, int]],
               n_ubatch: int) -> list[tuple[int, int, int]]:
    """(sequence, 0 for a token or 1 for a chunk, index) in batch order: ascending
    sequence ids, or the chunks first where llama.cpp then cuts fewer or smaller graph
    runs (a burst's prompts beside the first request's first token: 7 chunks as one run
    of 7 x 52 rows, not one row each in a run of 8 and then 7 x 51)."""
    token_rows = [(seq, 0, i) for i, (seq, _, _) in enumerate(tokens)]
    chunk_rows = [(seq, 1, i) for i, (seq, _, _) in enumerate(chunks)]
    ascending = sorted(token_rows + chunk_rows)
    if not token_rows or not chunk_rows:
        return ascending
    chunks_first = sorted(chunk_rows) + sorted(token_rows)

    def cost(order: list[tuple[int, int, int]]) -> tuple[int, int]:
        runs = [(seq, chunks[i][2] - chunks[i][1].prefill_at if kind else
                 1 + (len(tokens[i][2].drafts) if tokens[i][2].first_from < 0 else 0))
                for seq, kind, i in order]
        shapes = ubatch_shapes(runs, n_ubatch)
        return len(shapes), small_rows(shapes)

    return chunks_first if cost(chunks_first) < cost(ascending) else ascending
