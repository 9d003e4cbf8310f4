"""The memory account: what the process's resident memory holds, part by part.

The parts the server knows (per loaded model: weights, KV cache, llama.cpp's compute
buffers, the prompt store, the embedding context, the projector and its image cache;
process-wide: the grammar cache) are summed; `other` is the rest of the resident set
(Python itself, allocator arenas, libraries): RSS from /proc/self/status less the parts.
Weights are memory-mapped, so until every page was read they count less in RSS than
here, and `other` can then be negative.
"""

from __future__ import annotations

from pathlib import Path

from ...engine.grammar.json_grammar import grammar_cache_bytes
from ...model_pool import ModelPool

MODEL_PARTS = ("weights", "kv_cache", "compute_buffers", "prompt_store", "embedding_context",
               "projector", "image_cache")
PARTS = (*MODEL_PARTS, "grammar_cache", "other")


def resident_bytes() -> int:
    """VmRSS of this process (0 where /proc is not there)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_account(pool: ModelPool) -> dict[str, int]:
    """`rss` and its parts, in bytes."""
    parts = dict.fromkeys(PARTS, 0)
    for engine in pool.loaded_engines():
        for part, size in engine.memory().items():
            parts[part] += size
    parts["grammar_cache"] = grammar_cache_bytes()
    rss = resident_bytes()
    parts["other"] = rss - sum(parts.values()) if rss else 0
    return {"rss": rss, **parts}
