"""What a model's memory is, and what it allows: the one place that decides.

llama.cpp keeps one of four kinds of memory per sequence:

- attention: a KV cell per token (MoE models too: their experts are feed-forward
  layers, their memory is attention). A stream can be cut at any position.
- sliding window: attention whose layers (some or all) look back a fixed number of
  tokens. Those layers keep the window and a ubatch of cells per stream (not
  llama.cpp's `swa_full`): cells that fell out of the window are overwritten as tokens
  come, and a sequence's saved state leaves them out. A cut is exact only where the
  cells the window needs there are still held (`llama_memory_seq_pos_min`), which
  kv/slots.py checks: a chat's next turn reuses its stream, a prefix shared with a
  stream that has gone on further than that is evaluated again.
- recurrent (Mamba, RWKV): one state per sequence, rewritten by every token. A cut
  would need the state of an earlier position, which is gone.
- hybrid (Qwen3.5, LFM2, Granite 4-H, Nemotron-H, Falcon-H1, Jamba): attention layers
  beside recurrent ones, so the recurrent part rules.

llama.cpp can undo the last decode of a recurrent state where the architecture keeps
per-token snapshots (the context's `n_rs_seq`, experimental; `llm_arch_supports_rs_rollback`
in src/llama-arch.cpp): the trailing tokens of the most recent `llama_decode` of that
sequence, at most `n_rs_seq` of them, once. That is what a rejected draft needs, so those
models draft; other recurrent and hybrid models cannot cut at all, and neither drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import llama_cpp as lc

ATTENTION = "attention"
SLIDING_WINDOW = "sliding_window"
RECURRENT = "recurrent"
HYBRID = "hybrid"

# llm_arch_supports_rs_rollback of the vendored llama.cpp, by architecture name.
ROLLBACK_ARCHS = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
    "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3",
})
# Tokens of its last decode a recurrent state may be rolled back by (n_rs_seq), where the
# architecture allows it: drafts are at most this deep there. Each is a snapshot of
# every sequence's state (Qwen3.5-0.8B: 19 MiB a sequence), allocated with the context.
ROLLBACK_TOKENS = 3


@dataclass(frozen=True)
class MemoryKind:
    kind: str  # ATTENTION, SLIDING_WINDOW, RECURRENT or HYBRID
    arch: str  # llama.cpp's architecture name (general.architecture)
    n_swa: int = 0  # the sliding window, in tokens (0: none)
    # Trailing tokens of a sequence's last decode that may be cut (llama.cpp's n_rs_seq
    # as the context has it; 0: none).
    rollback: int = 0

    @property
    def recurrent(self) -> bool:
        """A recurrent state in its memory (recurrent or hybrid)."""
        return self.kind in (RECURRENT, HYBRID)

    @property
    def windowed(self) -> bool:
        return self.kind == SLIDING_WINDOW

    @property
    def cuts_anywhere(self) -> bool:
        """Any tail of a stream can be removed, the rest staying exact, whatever the
        stream went through."""
        return self.kind == ATTENTION

    @property
    def can_roll_back(self) -> bool:
        """llama.cpp keeps snapshots to undo the last decode, given n_rs_seq."""
        return self.recurrent and self.arch in ROLLBACK_ARCHS

    @property
    def drafts(self) -> bool:
        """A rejected draft can be removed: a cut anywhere, or a rollback of the decode
        that verified it."""
        return not self.recurrent or self.rollback > 0

    def draft_limit(self, most: int) -> int:
        """The deepest a step may draft: `most`, or the rollback's reach (the draft rows
        after a sequence's next token are what a rejection rolls back)."""
        return most if not self.recurrent else min(most, self.rollback)

    def with_rollback(self, tokens: int) -> MemoryKind:
        return replace(self, rollback=tokens if self.recurrent else 0)

    def cuts(self) -> str:
        """What may be removed from a stream's tail, in words (the log, /props)."""
        if self.cuts_anywhere:
            return "anywhere"
        if self.windowed:
            return "anywhere the window's cells are still held"
        if self.rollback:
            return (f"the last decode's tokens, {self.rollback} at most, or back to a "
                    "checkpoint")
        return "back to a checkpoint"

    def describe(self) -> dict[str, object]:
        """For /props: the kind, what cuts, whether it drafts."""
        return {"kind": self.kind, "architecture": self.arch, "sliding_window": self.n_swa,
                "cuts": self.cuts(), "rollback_tokens": self.rollback,
                "drafting": self.drafts}


def memory_kind(model: lc.llama_model_p, metadata: dict[str, str]) -> MemoryKind:
    """The kind of memory llama.cpp builds for this model."""
    arch = metadata.get("general.architecture", "")
    n_swa = max(0, int(lc.llama_model_n_swa(model)))
    if lc.llama_model_is_hybrid(model):
        kind = HYBRID
    elif lc.llama_model_is_recurrent(model):
        kind = RECURRENT
    elif n_swa > 0:
        kind = SLIDING_WINDOW
    else:
        kind = ATTENTION
    return MemoryKind(kind, arch, n_swa)
