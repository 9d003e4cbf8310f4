"""Which sequence of the KV cache holds which tokens: cache slots and spare sequence ids.

Sequence ids 0..slots-1 are cache slots whose KV survives a request, so the next request
sharing a prefix (a system prompt, a growing chat) evaluates only its new tail. Extra
choices of an `n > 1` request borrow ids from a pool above the slots and get a copy of
the prompt's KV instead of evaluating it again. The scheduler decides *when*; this
module keeps the books and issues the llama.cpp memory calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .llama_model import LlamaModel


@dataclass
class Slot:
    seq_id: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV this sequence holds
    busy: bool = False
    last_used: float = 0.0


class SlotTable:
    def __init__(self, model: LlamaModel, n_slots: int) -> None:
        self.model = model
        n_slots = max(1, min(n_slots, model.n_seq_max))
        self.slots = [Slot(seq_id=i) for i in range(n_slots)]
        self._spare: list[int] = list(range(n_slots, model.n_seq_max))
        self.n_spare_total = len(self._spare)

    # --- slots ---------------------------------------------------------------------------

    def free_slots(self) -> list[Slot]:
        return [s for s in self.slots if not s.busy]

    def claim(self, free: list[Slot], prompt: list[int], *, reuse: bool) -> tuple[Slot, int]:
        """Takes the free slot sharing the longest prefix with `prompt` (least recently
        used among equals); returns it and how many prompt tokens its KV already holds."""
        slot = max(free, key=lambda s: (common_prefix(s.cached, prompt), -s.last_used))
        # Keep the shared prefix, but always re-evaluate at least the last prompt token:
        # its logits are needed to sample the first token.
        keep = min(common_prefix(slot.cached, prompt), len(prompt) - 1) if reuse else 0
        if not self.model.seq_remove(slot.seq_id, keep, -1):
            self.model.seq_remove(slot.seq_id)
            keep = 0
        del slot.cached[keep:]
        slot.busy = True
        return slot, keep

    def release(self, slot: Slot) -> None:
        slot.busy = False
        slot.last_used = time.monotonic()

    def forget(self, slot: Slot) -> None:
        """Drops a slot's KV: it may be half-written, or its room is needed."""
        self.model.seq_remove(slot.seq_id)
        slot.cached.clear()

    def evict_idle(self) -> bool:
        """Frees the KV of idle slots to make room; True if anything was freed."""
        freed = False
        for slot in self.slots:
            if not slot.busy and slot.cached:
                self.forget(slot)
                freed = True
        return freed

    # --- spare sequence ids for sibling choices ------------------------------------------

    @property
    def n_spare_free(self) -> int:
        return len(self._spare)

    def borrow(self) -> int:
        return self._spare.pop()

    def give_back(self, seq_id: int) -> None:
        self.model.seq_remove(seq_id)
        self._spare.append(seq_id)

    # --- accounting ------------------------------------------------------------------------

    def idle_cached_tokens(self) -> int:
        return sum(len(s.cached) for s in self.slots if not s.busy)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
