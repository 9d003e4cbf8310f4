"""How many tokens one request may use on a model, chosen before its context is made.

Each slot has a KV stream of that many cells (llama_model.py). A stream's memory is only
taken as its cells are written (zero_pages.py), so idle and short requests cost little,
but eight slots that all fill their streams hold eight times one: the default is the
model's trained context only where that worst case fits the memory set aside for it.
"""

from __future__ import annotations

import llama_cpp as lc

# Bytes per element of each KV cache type (block types: block bytes / 32 elements).
_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
               "q4_1": 20 / 32, "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
# The default context's KV streams, all full, may take this share of the memory budget:
# the rest is for weights, compute buffers, the prompt store and other models.
KV_SHARE_OF_BUDGET = 0.5
# Where untouched pages cannot be given back (zero_pages.py: Linux only), every stream is
# resident from the start: the streams may then take this share, full or not.
RESIDENT_KV_SHARE_OF_BUDGET = 0.125
# llama.cpp sizes caches in multiples of 256 cells.
CELL_GRANULE = 256
# Never below this by default (today's per-request context), budget or not.
_MIN_DEFAULT = 2048


def bytes_per_cell(model: lc.llama_model_p, metadata: dict[str, str], type_k: str,
                   type_v: str) -> int:
    """KV bytes of one token over all layers (sliding-window layers counted as full ones:
    an upper bound for models that have them)."""
    arch = metadata.get("general.architecture", "")
    n_head = max(1, lc.llama_model_n_head(model))
    head = lc.llama_model_n_embd(model) // n_head
    key = int(metadata.get(f"{arch}.attention.key_length", head) or head)
    value = int(metadata.get(f"{arch}.attention.value_length", head) or head)
    per_layer = lc.llama_model_n_head_kv(model) * (key * _TYPE_BYTES[type_k]
                                                   + value * _TYPE_BYTES[type_v])
    return max(1, int(lc.llama_model_n_layer(model) * per_layer))


def default_context(n_ctx_train: int, per_cell: int, budget_bytes: int,
                    n_streams: int = 1, lazy: bool = True) -> int:
    """The model's trained context, or as many cells per stream as KV_SHARE_OF_BUDGET of
    the budget holds for `n_streams` full streams (RESIDENT_KV_SHARE_OF_BUDGET where the
    streams are not `lazy`: resident whether used or not), in whole granules, at least
    2,048 or the trained context if smaller."""
    trained = n_ctx_train if n_ctx_train > 0 else _MIN_DEFAULT
    if budget_bytes <= 0:
        return trained
    share = KV_SHARE_OF_BUDGET if lazy else RESIDENT_KV_SHARE_OF_BUDGET
    fits = int(budget_bytes * share) // (per_cell * max(1, n_streams))
    fits -= fits % CELL_GRANULE
    return min(trained, max(fits, _MIN_DEFAULT))
