"""The memory account: what the process's resident memory holds, part by part.

Nothing here walks memory: the resident set comes from /proc/self/statm (two counters
the kernel keeps: resident pages, and of those the file-backed and shared ones), and
each model's parts are the buffers llama.cpp reported allocating for it at load.

- `file_backed`: resident file pages: the model files llama.cpp memory-maps (the pages
  read so far of `weights_mapped`; a page never read costs nothing), libllama, ggml,
  Python and its extension modules;
- anonymous, per loaded model: weights llama.cpp copied out of the file (repacked for
  the CPU's kernels, or a model not mapped: `weights_copied`, `weights` less
  `weights_mapped`), the KV cache (resident whole from load: llama.cpp clears it),
  llama.cpp's compute buffers (allocated; their pages resident as steps touch them),
  the prompt store's entries in RAM, recurrent models' checkpoints (engine/kv/
  checkpoints.py), the embedding context (only once an embeddings
  request made it), the projector and its image cache, LoRA adapters (llama.cpp
  reads each file into a buffer of its own), a draft model (its weights, KV streams and
  compute buffers); process-wide: the grammar cache;
  and `other`, the rest: Python's heap, allocator arenas, thread stacks, less compute
  buffer pages never touched (so it can be negative).

So `rss` is the sum of every part but `weights` and `weights_mapped`, which say what
llama.cpp allocated for the weights and how much of it is the mapped file. Comparing
with llama-server's RSS: it maps the same file and allocates the same compute buffers;
its KV cache is one unified buffer where this server keeps a stream per slot;
`prompt_store`, `embedding_context` and Python's share of `other` and `file_backed` are
what this server adds.
"""

from __future__ import annotations

import mmap
from pathlib import Path

from edge_server.catalogue.pool import ModelPool
from edge_server.engine.grammar.json_grammar import grammar_cache_bytes

MODEL_PARTS = ("kv_cache", "compute_buffers", "prompt_store", "checkpoints",
               "embedding_context",
               "projector", "image_cache", "lora_adapters", "draft_model")
PARTS = ("weights", "weights_mapped", "weights_copied", *MODEL_PARTS, "grammar_cache",
         "file_backed", "other")


def _statm() -> tuple[int, int]:
    """Resident bytes of this process, and of those the file-backed (and shared) ones;
    zeros where /proc is not there."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
        return int(fields[1]) * mmap.PAGESIZE, int(fields[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return 0, 0


def resident_bytes() -> int:
    """VmRSS of this process (0 where /proc is not there)."""
    return _statm()[0]


def memory_account(pool: ModelPool) -> dict[str, int]:
    """`rss` and its parts, in bytes."""
    parts = dict.fromkeys(PARTS, 0)
    for engine in pool.loaded_engines():
        for part, size in engine.memory().items():
            parts[part] += size
    parts["grammar_cache"] = grammar_cache_bytes()
    parts["weights_copied"] = max(0, parts["weights"] - parts["weights_mapped"])
    rss, parts["file_backed"] = _statm()
    if not rss:
        return {"rss": 0, **parts}
    summed = sum(v for k, v in parts.items() if k not in ("weights", "weights_mapped", "other"))
    parts["other"] = rss - summed
    return {"rss": rss, **parts}
