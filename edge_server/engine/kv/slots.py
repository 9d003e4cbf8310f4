"""Which sequence of the KV cache holds which tokens, and where a new prompt's prefix
can be found: in a slot's own stream, in another slot's (busy or idle), or in the host
RAM store of spilled prefixes.

Each slot is one sequence with a KV stream of its own. A slot keeps its tokens after a
request, so the next request sharing a prefix (a system prompt, a growing chat)
evaluates only its new tail. The scheduler decides *when*; this module keeps the books
and issues the llama.cpp memory calls.

What a stream allows depends on the model's memory (backend/memory_kind.py): attention
streams are cut anywhere; sliding-window streams anywhere the window's cells are still
held (`window_floor`); a recurrent state only by a rollback of the sequence's last
decode (`Slot.room` tokens), or back to one of its checkpoints (checkpoints.py). A
prefix is only ever taken where it can be had exactly: cut there, or a whole stream (or
saved prefix) that is exactly that prefix. Where a cut fails anyway, the stream is
cleared with its token list, so the books never claim cells the stream does not hold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from edge_server.engine.backend.llama_model import LlamaModel
from edge_server.engine.kv import checkpoints
from edge_server.engine.kv.checkpoints import Checkpoint
from edge_server.engine.kv.prompt_store import (
    PromptStore,
    StoredPrefix,
    common_prefix,
    pack,
    unpack,
)
from edge_server.engine.kv.slot import PrefixSource, Slot

log = logging.getLogger(__name__)

# A free slot is reused in place when the new prompt keeps at least this share of what
# it holds; otherwise the least recently used free slot is taken, so distinct prompts
# stay cached side by side.
_REUSE_SHARE = 0.5
# Copying a prefix from elsewhere must save at least this many tokens of prefill.
_MIN_COPY_GAIN = 32
# Prefixes this long are worth keeping in host RAM when their slot is overwritten.
_MIN_SPILL_TOKENS = 128

# Slot is defined in slot.py; the scheduler takes it from here with the table.
__all__ = ["PrefixSource", "Slot", "SlotTable", "common_prefix"]


class SlotTable:
    def __init__(self, model: LlamaModel, store: PromptStore) -> None:
        self.model = model
        self.kind = model.memory_kind
        self.store = store
        self.slots = [Slot(seq_id=i) for i in range(model.n_seq_max)]
        self._copied_into: set[int] = set()  # streams whose copy waits for the next decode

    # --- what can be had exactly -----------------------------------------------------------

    def window_floor(self, slot: Slot) -> int:
        """On a sliding window, the fewest tokens the slot's stream can keep exactly: its
        next token must see the window's cells before it, and those before the lowest
        position it holds are gone (0 on other memories)."""
        first = self.model.seq_first_position(slot.seq_id) if self.kind.windowed else -1
        return first + self.kind.n_swa - 1 if first > 0 else 0

    def _stored_floor(self, held: int) -> int:
        """window_floor of a saved prefix of `held` tokens: llama.cpp's sequence state
        leaves out the cells before the window of its last token."""
        return held - 1 if self.kind.windowed and held > self.kind.n_swa else 0

    def can_cut(self, slot: Slot, keep: int) -> bool:
        """Whether the slot's stream can keep its first `keep` tokens (the rest cut)."""
        drop = len(slot.cached) - keep
        if drop <= 0 or keep == 0:
            return True
        if self.kind.recurrent:
            return drop <= slot.room or checkpoints.at(slot.checkpoints, keep) is not None
        return keep >= self.window_floor(slot)

    def usable(self, held: int, common: int, *, own: Slot | None = None,
               floor: int = 0, marks: Sequence[int] = ()) -> int:
        """Of a stream (or saved prefix) of `held` tokens sharing `common` with a prompt,
        the longest prefix it can give exactly: all of it if it is all shared; else, on a
        recurrent state, up to its newest checkpoint within the prefix (`marks`: those of
        a saved prefix; `own`: the slot itself, whose rollback room counts too); else any
        prefix of at least `floor` tokens (window_floor)."""
        if common >= held:
            return common
        if self.kind.recurrent:
            if own is not None:
                if held - common <= own.room:
                    return common
                marks = [c.tokens for c in own.checkpoints]
            return max((m for m in marks if m <= common), default=0)
        return common if common >= floor else 0

    def _stored_usable(self, entry: StoredPrefix, common: int) -> int:
        held = len(entry.tokens)
        return self.usable(held, common, floor=self._stored_floor(held),
                           marks=entry.checkpoint_tokens)

    def _slot_floor(self, slot: Slot) -> int:
        return self.window_floor(slot) if slot.cached else 0

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
            kept = self.usable(len(mine), common_prefix(mine, prompt), own=slot)
            return kept / len(mine) if mine else 0

        best = max(free, key=kept_share)
        if kept_share(best) >= _REUSE_SHARE:
            return best
        busy = {s.seq_id for s in self.slots if s.busy}

        def busy_neighbours(slot: Slot) -> int:
            return (slot.seq_id - 1 in busy) + (slot.seq_id + 1 in busy)

        return min(free, key=lambda s: (-busy_neighbours(s), bool(s.cached), s.last_used))

    def _own(self, slot: Slot, prompt: list[int], partition: str, limit: int) -> int:
        mine = slot.cached_for(partition)
        return self.usable(len(mine), min(common_prefix(mine, prompt), limit), own=slot,
                           floor=self._slot_floor(slot))

    def best_source(self, prompt: list[int], dst: Slot, partition: str,
                    limit: int) -> PrefixSource:
        """Where the longest prefix of `prompt` (at most `limit` tokens) that `partition`
        may reuse can be had exactly right now."""
        best = PrefixSource(self._own(dst, prompt, partition, limit), slot=dst)
        for slot in self.slots:
            if slot is dst or not self.can_copy_from(slot):
                continue
            mine = slot.cached_for(partition)
            n = self.usable(len(mine), min(common_prefix(mine, prompt), limit),
                            floor=self._slot_floor(slot))
            if n > best.length:
                best = PrefixSource(n, slot=slot)
        stored, n = self.store.best(prompt[:limit], partition, self._stored_usable)
        if stored is not None and n > best.length and len(stored.tokens) <= self.model.n_ctx_seq:
            best = PrefixSource(n, stored=stored)
        return best

    def upcoming_source(self, prompt: list[int], partition: str,
                        limit: int) -> tuple[Slot | None, int]:
        """A slot of `partition` still evaluating a prompt that shares a longer prefix
        than is cached, and that prefix (at most `limit`): where its state cannot be cut,
        only a slot that has not passed it yet (it pauses there, `hold`)."""
        best: Slot | None = None
        length = 0
        for slot in self.slots:
            if (slot.target and len(slot.cached) < len(slot.target)
                    and slot.partition == partition):
                n = min(common_prefix(slot.target, prompt), limit)
                if n > length and (not self.kind.recurrent or len(slot.cached) <= n):
                    best, length = slot, n
        return best, length

    def hold(self, slot: Slot, length: int) -> None:
        """The slot's prompt evaluation pauses at `length` (see Slot.holds), where a cut
        would not give that prefix."""
        if self.kind.recurrent and length > len(slot.cached):
            slot.holds.add(length)

    def fill(self, slot: Slot, prompt: list[int], source: PrefixSource, *, limit: int,
             partition: str) -> int:
        """Makes `slot` hold the longest usable prefix of `prompt` (at most `limit` tokens)
        from `source` for a request of `partition`; returns how many prompt tokens it now
        holds."""
        own = self._own(slot, prompt, partition, limit)
        length = min(source.length, limit)
        if source.slot is not slot and length >= own + _MIN_COPY_GAIN:
            if source.slot is not None:
                if self.copy_prefix(source.slot, slot, length):
                    return length
                own = 0
            else:
                assert source.stored is not None
                if self._restore(slot, source.stored, length, partition):
                    return length
                own = 0
        self.trim(slot, own)  # spilled, if long, under its old partition
        slot.partition = partition
        return len(slot.cached)

    def _restore(self, slot: Slot, stored: StoredPrefix, length: int, partition: str) -> bool:
        """Loads `stored`'s first `length` tokens into the slot (read from its file on
        first use); False, and the slot empty, where that failed."""
        data = self.store.load(stored)
        if data is None:  # gone or corrupt there: the slot is as it was
            return False
        state, saved = unpack(stored, data)
        self.spill(slot, keep=0)
        slot.partition = partition
        self._reset(slot)
        held = len(stored.tokens)
        if self.kind.recurrent and length < held:
            # Had whole, then set back to its checkpoint at `length` (usable said so).
            checkpoint = checkpoints.at(saved, length)
            loaded = (checkpoint is not None
                      and self.model.seq_restore(slot.seq_id, state, held)
                      and self.model.seq_restore_checkpoint(slot.seq_id, checkpoint.data,
                                                            length))
        else:
            loaded = self.model.seq_restore(slot.seq_id, state, length)
        if loaded:
            stored.last_used = time.monotonic()
            slot.cached = stored.tokens[:length]
            slot.checkpoints = checkpoints.within(saved, length)
            if self._window_held(slot):
                return True
        log.warning("a saved prompt prefix did not load; evaluating it again")
        self._reset(slot)
        return False

    def restore_state(self, slot: Slot, data: bytes, tokens: list[int], partition: str) -> bool:
        """Loads a sequence state saved earlier (exactly `tokens`) into the slot."""
        self.spill(slot, keep=0)
        slot.partition = partition
        self._reset(slot)
        if not tokens:
            return True
        if self.model.seq_restore(slot.seq_id, data, len(tokens)):
            slot.cached = list(tokens)
            if self._window_held(slot):
                return True
        self._reset(slot)
        return False

    def copy_prefix(self, src: Slot, dst: Slot, length: int) -> bool:
        """dst's stream gets src's first `length` tokens (the buffer copy runs with the
        next decode, so dst is no source for others until then). A stream that cannot be
        cut is copied whole: `length` must be all it holds. False: dst is empty."""
        self.spill(dst, keep=0)
        self._reset(dst)
        if length < len(src.cached) and (self.kind.recurrent
                                         or length < self._slot_floor(src)):
            return False
        if not self.model.seq_copy_prefix(src.seq_id, dst.seq_id, length):
            log.error("llama.cpp refused a copy of %d tokens; evaluating them again", length)
            return False
        dst.cached = src.cached[:length]
        dst.partition = src.partition
        self._copied_into.add(dst.seq_id)
        if self._window_held(dst):
            return True
        self._reset(dst)
        return False

    def can_copy_from(self, slot: Slot) -> bool:
        return slot.seq_id not in self._copied_into and not slot.rolled_back

    def trim(self, slot: Slot, keep: int) -> None:
        """Keeps the first `keep` tokens of a slot's stream (spilling what goes, if long);
        where the memory cannot cut there, the stream is emptied."""
        if keep < len(slot.cached):
            self.spill(slot, keep)
            self._cut(slot, keep)

    def _cut(self, slot: Slot, keep: int) -> None:
        if keep > 0 and self.can_cut(slot, keep):
            if self._remove_tail(slot, keep):
                del slot.cached[keep:]
                slot.checkpoints = checkpoints.within(slot.checkpoints, keep)
                if self._window_held(slot):
                    return
            else:
                log.error("llama.cpp refused to cut a stream at %d tokens; emptying it", keep)
        self._reset(slot)

    def _remove_tail(self, slot: Slot, keep: int) -> bool:
        """llama.cpp's cut after `keep` tokens; on a recurrent state a rollback of its
        last decode, or else its checkpoint there restored (can_cut said which)."""
        if not self.kind.recurrent:
            return self.model.seq_remove(slot.seq_id, keep, -1)
        if len(slot.cached) - keep <= slot.room:
            slot.room, slot.rolled_back = 0, True
            return self.model.seq_remove(slot.seq_id, keep, -1)
        checkpoint = checkpoints.at(slot.checkpoints, keep)
        slot.room, slot.rolled_back = 0, False
        return checkpoint is not None and self.model.seq_restore_checkpoint(
            slot.seq_id, checkpoint.data, keep)

    def checkpoint(self, slot: Slot) -> None:
        """Keeps a checkpoint of the slot's recurrent state where its stream ends now (a
        prompt just evaluated), for the next request sharing all of it."""
        length = len(slot.cached)
        if (not self.kind.recurrent or not length or slot.rolled_back
                or checkpoints.at(slot.checkpoints, length) is not None):
            return
        data = self.model.seq_checkpoint(slot.seq_id)
        if data:
            slot.checkpoints = checkpoints.with_new(slot.checkpoints, Checkpoint(length, data))

    def checkpoint_bytes(self) -> int:
        return sum(len(c.data) for slot in self.slots for c in slot.checkpoints)

    def _window_held(self, slot: Slot) -> bool:
        """Whether a sliding-window stream still holds the cells its next token needs
        (logged where not: the caller empties it). Always true on other memories."""
        if self.window_floor(slot) <= len(slot.cached):
            return True
        log.error("a sliding-window stream of %d tokens lacks cells its window needs; "
                  "emptying it", len(slot.cached))
        return False

    def _reset(self, slot: Slot) -> None:
        """Empties the slot's stream and its books."""
        self.model.seq_clear(slot.seq_id)
        slot.cached = []
        slot.checkpoints = []
        slot.room, slot.rolled_back = 0, False

    def drop_unconfirmed(self, slot: Slot, rejected: int) -> bool:
        """Removes the `rejected` cells past what the slot holds for sure: draft tokens
        not kept, which the decode just written. False where that failed: the stream
        and its books are emptied, and the sequence cannot go on."""
        cells = len(slot.cached) + rejected
        if (not self.kind.recurrent or rejected <= slot.room) and self.model.seq_remove(
                slot.seq_id, len(slot.cached), -1):
            if self.kind.recurrent:
                slot.room, slot.rolled_back = 0, True
            held = self._window_held(slot)
        else:
            log.error("llama.cpp refused to remove %d rejected drafts of %d cells",
                      rejected, cells)
            held = False
        if not held:
            self._reset(slot)
        return held

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
        _, stored = self.store.best(tokens, partition, self._stored_usable)
        if stored > len(tokens) - _MIN_SPILL_TOKENS:
            return  # the store already holds all but a short tail of it
        self.store.put(pack(tokens, self.model.seq_state(slot.seq_id), slot.checkpoints,
                            partition))

    def decoded(self, rows: dict[int, int] | None = None) -> None:
        """A decode ran, `rows[seq_id]` tokens of each sequence in it: queued stream copies
        are done, and those sequences' rollback room is their last decode's."""
        self._copied_into.clear()
        for seq_id, n in (rows or {}).items():
            slot = self.slots[seq_id]
            slot.rolled_back = False
            slot.room = min(self.kind.rollback, n - 1) if n > 0 else 0
            slot.holds = {h for h in slot.holds if h > len(slot.cached) + n}

    def release(self, slot: Slot) -> None:
        slot.busy = False
        slot.target = []
        slot.holds = set()
        slot.last_used = time.monotonic()

    def forget(self, slot: Slot) -> None:
        """Drops a slot's KV: it may be half-written."""
        self._reset(slot)
        slot.target = []
        slot.holds = set()

    def spill_all(self) -> None:
        """Before the context goes away (unload, shutdown): keep what idle slots hold."""
        for slot in sorted(self.slots, key=lambda s: s.last_used, reverse=True):
            if not slot.busy:
                self.spill(slot, keep=0)

    def cached_tokens(self) -> int:
        return sum(len(s.cached) for s in self.slots)
