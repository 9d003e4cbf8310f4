"""One slot: a sequence of the KV cache with a stream of its own, and the books kept on
it (the tokens it holds, whose they are, what may be cut or rolled back); and where a
prompt's prefix may come from (PrefixSource)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_server.engine.kv.checkpoints import Checkpoint
from edge_server.engine.kv.prompt_store import StoredPrefix


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
    # Tokens at the stream's end that may be cut now, on a recurrent state that rolls
    # back (those of its last decode but one, llama.cpp's n_rs_seq at most).
    room: int = 0
    # A rollback waits for the sequence's next decode: until then its state must not be
    # copied (llama.cpp would copy the state from before the rollback).
    rolled_back: bool = False
    # Where this slot's prompt evaluation pauses for a step, so that requests waiting
    # for that prefix copy the whole stream there (a state that cannot be cut).
    holds: set[int] = field(default_factory=set)
    # A recurrent state as it was after the stream's last prompts (checkpoints.py).
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def cached_for(self, partition: str) -> list[int]:
        """What this stream holds that a request of `partition` may reuse."""
        return self.cached if self.partition == partition else []


@dataclass(frozen=True)
class PrefixSource:
    length: int  # prompt tokens it can provide
    slot: Slot | None = None  # copy from this slot's stream ...
    stored: StoredPrefix | None = None  # ... or restore this saved prefix
