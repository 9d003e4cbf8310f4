"""How many tokens one request may use on a model, chosen before its context is made,
and the bytes its KV streams take.

Each slot has a KV stream of that many cells (llama_model.py). llama.cpp clears every
stream's whole buffer when it creates the context, so all of it is resident from then
on, used or not: eight 8,192-cell streams of SmolLM2 are 1,440 MiB at idle. The default
is therefore the model's trained context only where the streams of all slots fit
KV_SHARE_OF_BUDGET of the memory budget, else as many cells as fit (never fewer than
2,048, or the trained context if smaller).
"""

from __future__ import annotations

import llama_cpp as lc

# Bytes per element of each KV cache type (block types: block bytes / 32 elements).
_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
               "q4_1": 20 / 32, "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
# The default context's KV streams, resident from load, may take this share of the memory
# budget: the rest is for weights, compute buffers, the prompt store and other models.
# With 75% of 24 GiB as the budget, eight SmolLM2 streams get 3,072 cells each (540 MiB);
# 8,192 each (the trained context) from 64 GiB of RAM; 2,048 (the floor) below 16 GiB.
KV_SHARE_OF_BUDGET = 1 / 32
# llama.cpp sizes caches in multiples of 256 cells.
CELL_GRANULE = 256
# Never below this by default (today's per-request context), budget or not.
_MIN_DEFAULT = 2048


def cell_bytes(n_layer: int, n_head_kv: int, key: int, value: int, type_k: str,
               type_v: str) -> int:
    """KV bytes of one token over all layers."""
    per_layer = n_head_kv * (key * _TYPE_BYTES[type_k] + value * _TYPE_BYTES[type_v])
    return max(1, int(n_layer * per_layer))


def bytes_per_cell(model: lc.llama_model_p, metadata: dict[str, str], type_k: str,
                   type_v: str) -> int:
    """KV bytes of one token over all layers of a loaded model: an upper bound where some
    layers slide (those keep only their window's cells; llama.cpp tells not which)."""
    arch = metadata.get("general.architecture", "")
    n_head = max(1, lc.llama_model_n_head(model))
    head = lc.llama_model_n_embd(model) // n_head
    key = int(metadata.get(f"{arch}.attention.key_length", head) or head)
    value = int(metadata.get(f"{arch}.attention.value_length", head) or head)
    return cell_bytes(lc.llama_model_n_layer(model), lc.llama_model_n_head_kv(model),
                      key, value, type_k, type_v)


def default_context(n_ctx_train: int, per_cell: int, budget_bytes: int,
                    n_streams: int = 1) -> int:
    """The model's trained context, or as many cells per stream as KV_SHARE_OF_BUDGET of
    the budget holds for `n_streams` streams, in whole granules, at least 2,048 or the
    trained context if smaller."""
    trained = n_ctx_train if n_ctx_train > 0 else _MIN_DEFAULT
    if budget_bytes <= 0:
        return trained
    fits = int(budget_bytes * KV_SHARE_OF_BUDGET) // (per_cell * max(1, n_streams))
    fits -= fits % CELL_GRANULE
    return min(trained, max(fits, _MIN_DEFAULT))


def request_context(n_ctx: int, n_ctx_train: int, per_cell: int, budget_bytes: int,
                    n_streams: int) -> int:
    """Tokens one request may use: `n_ctx` as asked (0: the default), capped at the
    trained context (past it a model's positions mean nothing it learned)."""
    return min(n_ctx, n_ctx_train or n_ctx) or default_context(
        n_ctx_train, per_cell, budget_bytes, n_streams)


def stream_cells(n_ctx: int, n_streams: int) -> int:
    """The cells llama.cpp gives each stream for `n_ctx` a request (its context is
    n_ctx x n_streams, rounded up to granules, split, and each share rounded up)."""
    total = -(-n_ctx * n_streams // CELL_GRANULE) * CELL_GRANULE
    per_stream = total // max(1, n_streams)
    return -(-per_stream // CELL_GRANULE) * CELL_GRANULE
