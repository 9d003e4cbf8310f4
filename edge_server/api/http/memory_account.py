"""The memory account: what the process's resident memory holds, part by part.

The resident set (VmRSS) is file-backed pages plus anonymous ones (/proc/self/status):

- file-backed: the model files llama.cpp memory-maps (`weights_resident`: the pages read
  so far, of `weights_mapped` mapped; a page never read costs nothing) and `libraries`
  (libllama, ggml, Python and its extension modules: the rest of the file-backed pages);
- anonymous, per loaded model: weights llama.cpp copied out of the file (repacked for
  the CPU's kernels, or a model not mapped: `weights` less `weights_mapped`), the KV
  cache, llama.cpp's compute buffers, the prompt store's entries in RAM, the embedding
  context (only once an embeddings request made it), the projector and its image cache;
  process-wide: the grammar cache; and `other`, the rest: Python's heap, allocator
  arenas, thread stacks.

So `rss` is the sum of every part but `weights` and `weights_mapped`, which say what
llama.cpp allocated for the weights and how much of it is the mapped file. Comparing
with llama-server's RSS: it maps the same file and allocates the same KV cache and
compute buffers; `prompt_store`, `embedding_context` and Python's share of `other` and
`libraries` are what this server adds.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ...engine.grammar.json_grammar import grammar_cache_bytes
from ...model_pool import ModelPool

MODEL_PARTS = ("kv_cache", "compute_buffers", "prompt_store", "embedding_context",
               "projector", "image_cache")
PARTS = ("weights", "weights_mapped", "weights_resident", "weights_copied", *MODEL_PARTS,
         "grammar_cache", "libraries", "other")


def _status_kb(fields: Iterable[str]) -> dict[str, int]:
    """Bytes of the named /proc/self/status lines (none where /proc is not there)."""
    wanted = set(fields)
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in wanted:
                out[name] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


def resident_bytes() -> int:
    """VmRSS of this process (0 where /proc is not there)."""
    return _status_kb(["VmRSS"]).get("VmRSS", 0)


def mapped_files(paths: set[str]) -> tuple[int, int]:
    """Bytes mapped of these files, and of those the resident ones (/proc/self/smaps)."""
    size = resident = 0
    current = False
    try:
        with open("/proc/self/smaps") as fh:
            for line in fh:
                head = line.split(maxsplit=5)
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    current = len(head) == 6 and head[5].rstrip("\n") in paths
                elif current and head[0] == "Size:":
                    size += int(head[1]) * 1024
                elif current and head[0] == "Rss:":
                    resident += int(head[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return size, resident


def memory_account(pool: ModelPool) -> dict[str, int]:
    """`rss` and its parts, in bytes."""
    parts = dict.fromkeys(PARTS, 0)
    model_files: set[str] = set()
    for engine in pool.loaded_engines():
        model_files.add(str(engine.path.resolve()))
        for part, size in engine.memory().items():
            parts[part] += size
    parts["grammar_cache"] = grammar_cache_bytes()
    parts["weights_mapped"], parts["weights_resident"] = mapped_files(model_files)
    parts["weights_copied"] = max(0, parts["weights"] - parts["weights_mapped"])
    status = _status_kb(["VmRSS", "RssFile"])
    rss = status.get("VmRSS", 0)
    if not rss:
        return {"rss": 0, **parts}
    parts["libraries"] = max(0, status.get("RssFile", 0) - parts["weights_resident"])
    summed = sum(v for k, v in parts.items() if k not in ("weights", "weights_mapped", "other"))
    parts["other"] = rss - summed
    return {"rss": rss, **parts}
