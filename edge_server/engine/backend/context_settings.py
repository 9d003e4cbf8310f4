"""What a llama.cpp context is made with (ContextSettings) and the checks on it that can
refuse a load: KV cache types, and flash attention, which a quantized V cache needs."""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp as lc

from edge_server.engine.backend.memory_kind import ROLLBACK_TOKENS
from edge_server.engine.backend.rpc.rpc_devices import Endpoint


class ModelLoadError(RuntimeError):
    """The file is missing, unreadable or not a GGUF model llama.cpp can load."""


@dataclass(frozen=True)
class ContextSettings:
    # Tokens one request may use (prompt plus answer): the cells of each sequence's KV
    # stream; 0: the training context, as far as kv_budget_bytes allows (context_size).
    n_ctx: int = 0
    n_seq_max: int = 4  # sequences (slots) decoded together, each with a KV stream
    kv_budget_bytes: int = 0  # memory budget the default context is sized from; 0: none
    n_batch: int = 512  # tokens per llama_decode call
    n_threads: int = 0  # 0: one per CPU core
    n_gpu_layers: int = -1  # -1: offload every layer where a GPU backend exists
    repack: str = "auto"  # CPU extra buffers (AMX/AVX repacked weights): auto, on, off
    flash_attn: str = "auto"  # auto (see flash_attn_type), on, off
    rpc: tuple[Endpoint, ...] = ()  # llama.cpp RPC servers that hold layers too
    cache_type_k: str = "f16"  # KV cache element types (KV_CACHE_TYPES)
    cache_type_v: str = "f16"
    # Tokens of a sequence's last decode its recurrent state may be rolled back by, where
    # the architecture allows it (llama.cpp's n_rs_seq; memory_kind.py); 0: never.
    rollback: int = ROLLBACK_TOKENS


# llama-server's --cache-type-k / --cache-type-v choices, as ggml type ids.
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3,
                  "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
_UNQUANTIZED = ("f32", "f16", "bf16")


def kv_flash_attn(settings: ContextSettings) -> int:
    """flash_attn_type for the settings: llama.cpp stores a quantized V cache only with
    flash attention, so it is turned on for one, and `--flash-attn off` with one is a
    clear refusal rather than a failed context."""
    for name in (settings.cache_type_k, settings.cache_type_v):
        if name not in KV_CACHE_TYPES:
            raise ModelLoadError(f"unknown KV cache type {name!r}; one of "
                                 f"{', '.join(KV_CACHE_TYPES)}")
    if settings.cache_type_v in _UNQUANTIZED:
        return flash_attn_type(settings.flash_attn)
    if settings.flash_attn == "off":
        raise ModelLoadError(f"a quantized V cache ({settings.cache_type_v}) needs flash "
                             "attention, and --flash-attn is off; turn it on (or auto), or "
                             "keep --cache-type-v f16")
    return int(lc.LLAMA_FLASH_ATTN_TYPE_ENABLED)


def flash_attn_type(setting: str) -> int:
    """llama.cpp's flash-attention mode; `auto` lets llama.cpp decide, as llama-server
    does (on wherever the backend has the kernel, which CPU builds have). Measured here
    with this llama.cpp, SmolLM2 (64-wide heads), AVX-512: 14-16% more tokens/s at 8
    clients, 17-20% faster 2,000-token prompts, a shared-prefix burst 10% faster. An
    earlier build's kernel was slower on batches spanning several KV streams, which is
    why it was once off for narrow heads."""
    if setting == "on":
        return int(lc.LLAMA_FLASH_ATTN_TYPE_ENABLED)
    if setting == "off":
        return int(lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    if not lc.llama_supports_gpu_offload():  # llama.cpp's own choice, known in advance
        return int(lc.LLAMA_FLASH_ATTN_TYPE_ENABLED)
    return int(lc.LLAMA_FLASH_ATTN_TYPE_AUTO)
