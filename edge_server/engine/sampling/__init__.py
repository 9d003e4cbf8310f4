"""Choosing tokens: per-sequence sampler chains built in llama.cpp (chain), token
log-probabilities from the logits (logprobs), and lookup drafting (lookup_draft).

May import: engine.backend.
Imported by: the scheduler core (request, jobs, seating, step_batch, scheduler).
"""
