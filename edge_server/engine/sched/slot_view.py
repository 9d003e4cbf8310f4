"""What each slot is doing, read from the event loop while the engine thread runs (for
llama-server's GET /slots): counts only, never a request's text, since slots serve
every caller of the server."""

from __future__ import annotations

from dataclasses import dataclass

from edge_server.engine.backend.lora import KEY_SEPARATOR
from edge_server.engine.sched.scheduler import Scheduler


@dataclass(frozen=True)
class SlotView:
    id: int
    n_ctx: int  # tokens one request may use in this slot
    busy: bool
    speculative: bool  # it may draft tokens (prompt lookup decoding)
    cached_tokens: int  # tokens its KV stream holds (kept after a request, for reuse)
    prompt_tokens: int = 0  # of the request it serves (0: idle)
    max_tokens: int = 0
    decoded: int = 0  # tokens generated so far
    partition: str = ""  # whose request it serves, or whose prompt it keeps

    def anonymised(self) -> SlotView:
        """Only whether it is busy: for a caller whose work it does not hold."""
        return SlotView(self.id, self.n_ctx, self.busy, self.speculative, 0)


def slot_views(scheduler: Scheduler) -> list[SlotView]:
    """One view per slot. The engine thread may move on while this reads: each view is
    one moment of that slot, which is all a monitor needs."""
    serving: dict[int, SlotView] = {}
    n_ctx = scheduler.model.n_ctx_seq
    drafts = scheduler.draft_max > 0
    for job in scheduler.running():
        request = job.request
        for choice in job.choices:
            slot = choice.slot
            if slot is None or choice.finished:
                continue
            serving[slot.seq_id] = SlotView(
                slot.seq_id, n_ctx, True, drafts, len(slot.cached),
                prompt_tokens=len(request.prompt_tokens), max_tokens=request.max_tokens,
                decoded=choice.generated, partition=request.partition)
        if job.prefilling and job.slot.seq_id not in serving:
            serving[job.slot.seq_id] = SlotView(
                job.slot.seq_id, n_ctx, True, drafts, len(job.slot.cached),
                prompt_tokens=len(request.prompt_tokens), max_tokens=request.max_tokens,
                partition=request.partition)
    return [serving.get(slot.seq_id)
            or SlotView(slot.seq_id, n_ctx, slot.busy, drafts, len(slot.cached),
                        partition=slot.partition.split(KEY_SEPARATOR)[0])
            for slot in list(scheduler.kv.slots)]


def engine_counts(scheduler: Scheduler) -> dict[str, int]:
    """The scheduler's counts for /health, /metrics and the memory account."""
    kv, jobs = scheduler.kv, scheduler.running()
    return {
        "slots": scheduler.n_slots,
        "busy_slots": sum(s.busy for s in kv.slots),
        "busy_sequences": sum(
            1 for j in jobs for c in j.choices if c.slot is not None and not c.finished
        ),
        "waiting": scheduler.n_waiting,
        "kv_tokens": kv.cached_tokens(),
        "kv_capacity": scheduler.model.n_ctx,
        "prompt_store_entries": len(kv.store),
        "prompt_store_bytes": kv.store.used_bytes,
        "prompt_store_on_disk_only": kv.store.disk_only,
        "decode_threads": scheduler.threads.best(1),
        "draft_tokens": scheduler.drafts.drafted,
        "draft_tokens_accepted": scheduler.drafts.accepted,
        "grouped_decode_steps": scheduler.grouped_steps,
        "lora_set_switches": scheduler.turns.switches,
        **({"draft_model_tokens": scheduler.drafter.counts.drafted,
            "draft_model_tokens_accepted": scheduler.drafter.counts.accepted}
           if scheduler.drafter is not None else {}),
    }
