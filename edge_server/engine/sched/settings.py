"""What an operator may set about the step loop (from ServeOptions, through the pool)."""

from __future__ import annotations

from dataclasses import dataclass

# 16 rows a sequence: the row block of llama.cpp's AVX-512 Q4_K kernel (step_cost.py).
DEFAULT_DRAFT_MAX = 15


@dataclass(frozen=True)
class SchedulerSettings:
    max_waiting: int = 64  # queued requests beyond the slots before 429
    max_wait_seconds: float = 120.0  # a request not admitted by then fails with 503
    # While other sequences are generating, a step evaluates at most this many prompt
    # tokens per waiting prompt, so a long prompt delays their next token by a fraction
    # of a second only (on SmolLM2; a 1.5B model takes a second and a half).
    prefill_chunk_while_decoding: int = 128
    # Time decode steps on all cores and on one fewer, and use the faster (thread_tuner).
    adaptive_threads: bool = False
    # Tokens a sequence may draft per step by lookup (lookup_draft.py); 0: never;
    # -1: DEFAULT_DRAFT_MAX where every layer runs on the CPU, else 0 (on an H100,
    # drafting at full depth made steps slower: 0.62-0.76x the tokens/s, 1-8 clients).
    draft_max: int = -1
    # A step drafts at least this many rows a sequence, paying or not, where a lookup or
    # the draft model has a guess (llama-server's --draft-min); 0: only where the
    # measured cost says drafts pay (lookup_draft.choose_depth, model_draft.py).
    draft_min: int = 0
    # After a request's first token, its tokens go to the event loop at most this often
    # (delivery.py); 0: every step's at once.
    stream_interval_ms: float = 15.0
