"""The step loop: which requests run in the next `llama_decode`, where their
sequences sit, and when their tokens go back to the callers (as vLLM's `v1/core/sched/`)."""
