"""Checkpoints of a recurrent state (memory_kind.py): a stream that cannot be cut keeps
its state as it was after each of its last prompts was evaluated (in its slot, and with
it in the prompt store when the slot is spilled), so that the next request sharing that
prompt (a chat's next turn, the same system prompt again) starts there: the recurrent
layers set back to the checkpoint, the attention layers' cells past it removed, and only
the rest evaluated. llama.cpp saves just the recurrent part
(`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`): a fixed size per model, whatever the length."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Checkpoints a slot keeps, the newest: each is one recurrent state (Qwen3.5-0.8B:
# 19 MiB), and a chat's next turn needs the last prompt's.
MAX_PER_SLOT = 2


@dataclass(frozen=True)
class Checkpoint:
    tokens: int  # the stream's first `tokens` tokens were evaluated into it
    data: bytes  # llama.cpp's partial sequence state


def at(checkpoints: Sequence[Checkpoint], tokens: int) -> Checkpoint | None:
    return next((c for c in checkpoints if c.tokens == tokens), None)


def with_new(checkpoints: Sequence[Checkpoint], new: Checkpoint) -> list[Checkpoint]:
    """`new` kept with the newest others, MAX_PER_SLOT in all."""
    kept = [c for c in checkpoints if c.tokens != new.tokens]
    return [*kept, new][-MAX_PER_SLOT:]


def within(checkpoints: Sequence[Checkpoint], tokens: int) -> list[Checkpoint]:
    """Those still true of a stream cut to its first `tokens` tokens."""
    return [c for c in checkpoints if c.tokens <= tokens]
