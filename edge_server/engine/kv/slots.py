"""Which sequence of the KV cache holds which tokens, and where a new prompt's prefix
can be found: in a slot's own stream, in another slot's (busy or idle), or in the host
RAM store of spilled prefixes.

Each slot is one sequence with a KV stream of its own. A slot keeps its tokens after a
request, so the next request sharing a prefix (a system prompt, a growing chat)
evaluates only its new tail. The scheduler decides *when*; this module keeps the books
and issues the llama.cpp memory calls.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ..backend.llama_model import LlamaModel
from .prompt_store import PromptStore, StoredPrefix, common_prefix

log = logging.getLogger(__name__)

# A free slot is reused in place when the new prompt keeps at least this share of what
# it holds; otherwise the least recently used free slot is taken, so distinct prompts
# stay cached side by side.
_REUSE_SHARE = 0.5
# Copying a prefix from elsewhere must save at least this many tokens of prefill.
_MIN_COPY_GAIN = 32
# Prefixes this long are worth keeping in host RAM when their slot is overwritten.
_MIN_SPILL_TOKENS = 128

__all__ = ["Slot", "SlotTable", "common_prefix"]


@dataclass
class Slot:
    seq_id: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV this stream holds
    busy: bool = False
    last_used: float = 0.0
    # While a prompt is being evaluated here: all of it, so that identical prompts
    # arriving meanwhile can wait for it instead of evaluating it again.
    target: list[int] = field(default_factory=list)
    # Whose prompts `cached` holds: only requests of this partition may reuse them.
    partition: str = ""

    def cached_for(self, partition: str) -> list[int]:
        """What this stream holds that a request of `partition` may reuse."""
        return self.cached if self.partition == partition else []


@dataclass(frozen=True)
class PrefixSource:
    length: int  # prompt tokens it can provide
    slot: Slot | None = None  # copy from this slot's stream ...
    stored: StoredPrefix | None = None  # ... or restore this saved prefix


class SlotTable:
    def __init__(self, model: LlamaModel, store: PromptStore) -> None:
        self.model = model
        self.store = store
        self.slots = [Slot(seq_id=i) for i in range(model.n_seq_max)]
        self._copied_into: set[int] = set()  # streams whose copy waits for the next decode

    # --- choosing and filling a slot -------------------------------------------------------

    def free_slots(self) -> list[Slot]:
        return [s for s in self.slots if not s.busy]

    def choose(self, free: list[Slot], prompt: list[int], partition: str) -> Slot:
        """The free slot to serve `prompt`: one whose cache it mostly keeps; else one
        next to busy slots (filling a gap first), then the least recently used (an empty
        one first). Busy slots in one run of sequence ids decode in one graph run per
        step; each gap costs another (see step_batch)."""
        def kept_share(slot: Slot) -> float:
            mine = slot.cached_for(partition)
            return common_prefix(mine, prompt) / len(mine) if mine else 0

        best = max(free, key=kept_share)
        if kept_share(best) >= _REUSE_SHARE:
            return best
        busy = {s.seq_id for s in self.slots if s.busy}

        def busy_neighbours(slot: Slot) -> int:
            return (slot.seq_id - 1 in busy) + (slot.seq_id + 1 in busy)

        return min(free, key=lambda s: (-busy_neighbours(s), bool(s.cached), s.last_used))

    def best_source(self, prompt: list[int], dst: Slot, partition: str) -> PrefixSource:
        """Where the longest prefix of `prompt` that `partition` may reuse is available
        right now."""
        best = PrefixSource(common_prefix(dst.cached_for(partition), prompt), slot=dst)
        for slot in self.slots:
            if slot is dst or slot.seq_id in self._copied_into:
                continue
            n = common_prefix(slot.cached_for(partition), prompt)
            if n > best.length:
                best = PrefixSource(n, slot=slot)
        stored, n = self.store.best(prompt, partition)
        if stored is not None and n > best.length and len(stored.tokens) <= self.model.n_ctx_seq:
            best = PrefixSource(n, stored=stored)
        return best

    def upcoming_source(self, prompt: list[int], partition: str) -> tuple[Slot | None, int]:
        """A slot of `partition` still evaluating a prompt that shares a longer prefix than
        is cached."""
        best: Slot | None = None
        length = 0
        for slot in self.slots:
            if (slot.target and len(slot.cached) < len(slot.target)
                    and slot.partition == partition):
                n = common_prefix(slot.target, prompt)
                if n > length:
                    best, length = slot, n
        return best, length

    def fill(self, slot: Slot, prompt: list[int], source: PrefixSource, *, limit: int,
             partition: str) -> int:
        """Makes `slot` hold the longest usable prefix of `prompt` (at most `limit` tokens)
        from `source` for a request of `partition`; returns how many prompt tokens it now
        holds."""
        own = common_prefix(slot.cached_for(partition), prompt)
        length = min(source.length, limit)
        if source.slot is not slot and length >= own + _MIN_COPY_GAIN:
            if source.slot is not None:
                self.copy_prefix(source.slot, slot, length)
                return length
            assert source.stored is not None
            # Read from its file on first use; gone or corrupt there, the slot is as it was.
            data = self.store.load(source.stored)
            if data is not None:
                self.spill(slot, keep=0)
                slot.partition = partition
                if self.model.seq_restore(slot.seq_id, data, length):
                    source.stored.last_used = time.monotonic()
                    slot.cached = source.stored.tokens[:length]
                    return length
                log.warning("a saved prompt prefix did not load; evaluating it again")
                slot.cached = []
                own = 0
        keep = min(own, limit)
        self.trim(slot, keep)  # spilled, if long, under its old partition
        slot.partition = partition
        return keep

    def copy_prefix(self, src: Slot, dst: Slot, length: int) -> None:
        """dst's stream gets src's first `length` tokens (the buffer copy runs with the
        next decode, so dst is no source for others until then)."""
        self.spill(dst, keep=0)
        self.model.seq_copy_prefix(src.seq_id, dst.seq_id, length)
        dst.cached = src.cached[:length]
        dst.partition = src.partition
        self._copied_into.add(dst.seq_id)

    def can_copy_from(self, slot: Slot) -> bool:
        return slot.seq_id not in self._copied_into

    def trim(self, slot: Slot, keep: int) -> None:
        """Keeps the first `keep` tokens of a slot's stream (spilling what goes, if long)."""
        if keep < len(slot.cached):
            self.spill(slot, keep)
            if not self.model.seq_remove(slot.seq_id, keep, -1):
                self.model.seq_remove(slot.seq_id)
                keep = 0
            del slot.cached[keep:]

    def drop_unconfirmed(self, slot: Slot) -> None:
        """Removes the cells past what the slot holds for sure: draft tokens not kept."""
        self.model.seq_remove(slot.seq_id, len(slot.cached), -1)

    def spill(self, slot: Slot, keep: int) -> None:
        """Saves a long prefix to host RAM before it is overwritten past `keep` tokens,
        unless another slot or the store still holds it."""
        tokens = slot.cached
        if (len(tokens) - keep < _MIN_SPILL_TOKENS or self.store.max_bytes <= 0
                or slot.seq_id in self._copied_into):  # its buffer is not written yet
            return
        partition = slot.partition
        if any(s is not slot and s.partition == partition and s.cached[: len(tokens)] == tokens
               for s in self.slots):
            return
        _, stored = self.store.best(tokens, partition)
        if stored > len(tokens) - _MIN_SPILL_TOKENS:
            return  # the store already holds all but a short tail of it
        self.store.put(StoredPrefix(list(tokens), self.model.seq_state(slot.seq_id),
                                    partition))

    def decoded(self) -> None:
        """A decode ran: queued stream copies are done."""
        self._copied_into.clear()

    def release(self, slot: Slot) -> None:
        slot.busy = False
        slot.target = []
        slot.last_used = time.monotonic()

    def forget(self, slot: Slot) -> None:
        """Drops a slot's KV: it may be half-written."""
        self.model.seq_remove(slot.seq_id)
        slot.cached = []
        slot.target = []

    def spill_all(self) -> None:
        """Before the context goes away (unload, shutdown): keep what idle slots hold."""
        for slot in sorted(self.slots, key=lambda s: s.last_used, reverse=True):
            if not slot.busy:
                self.spill(slot, keep=0)

    def cached_tokens(self) -> int:
        return sum(len(s.cached) for s in self.slots)
