"""What a model will hold once loaded, worked out before it is, from its file's header.

The model pool makes room in its memory budget with this before a load, then charges
what llama.cpp reported allocating (LlamaModel.buffer_bytes). The KV streams are the
part that depends on the settings: resident from load, n_seq_max streams of the context
the model will get, as context_size.py chooses it. Compute buffers are sized by the
batch: llama.cpp reserves a graph of n_batch output rows (n_batch x vocabulary floats,
96 MiB for SmolLM2, 512 MiB for Gemma 3's 262k vocabulary), plus the output buffer of
n_seq_max rows and the layers' activations.
"""

from __future__ import annotations

import logging
from pathlib import Path

import llama_cpp as lc

from edge_server.engine.backend.context_size import cell_bytes, request_context, stream_cells
from edge_server.engine.backend.gguf_header import GGUFHeader
from edge_server.engine.backend.llama_model import KV_CACHE_TYPES, ContextSettings

log = logging.getLogger(__name__)

_FLOAT = 4
_ACTIVATION_WIDTHS = 16  # activations of a batch row: up to this many n_embd-wide tensors
_MARGIN = 8 << 20


def estimated_bytes(path: Path, settings: ContextSettings) -> int:
    """Weights (the file) + KV streams + compute buffers the model will take when loaded
    with `settings`; where the header cannot be read, the file's size and a margin."""
    size = path.stat().st_size
    try:
        header = GGUFHeader(path)
    except (OSError, ValueError) as exc:
        log.warning("%s: %s; its memory is estimated from its size", path.name, exc)
        return int(size * 1.25) + (64 << 20)
    arch = str(header.values.get("general.architecture", ""))
    n_embd = header.number(f"{arch}.embedding_length")
    n_head = max(1, header.number(f"{arch}.attention.head_count", 1))
    head = n_embd // n_head
    types = (settings.cache_type_k, settings.cache_type_v)
    per_cell = cell_bytes(
        header.number(f"{arch}.block_count"),
        header.number(f"{arch}.attention.head_count_kv", n_head),
        header.number(f"{arch}.attention.key_length", head),
        header.number(f"{arch}.attention.value_length", head),
        *(t if t in KV_CACHE_TYPES else "f32" for t in types))
    n_seq = max(1, min(settings.n_seq_max, lc.llama_max_parallel_sequences()))
    n_ctx = request_context(settings.n_ctx, header.number(f"{arch}.context_length"),
                            per_cell, settings.kv_budget_bytes, n_seq)
    cells = stream_cells(n_ctx, n_seq)
    n_vocab = (header.number(f"{arch}.vocab_size")
               or header.lengths.get("tokenizer.ggml.tokens", 0))
    compute = (settings.n_batch * (n_vocab + _ACTIVATION_WIDTHS * n_embd)
               + n_seq * n_vocab) * _FLOAT + _MARGIN
    if settings.flash_attn == "off":  # attention scores of a whole batch, materialised
        compute += settings.n_batch * cells * n_head * _FLOAT
    return size + cells * n_seq * per_cell + compute
