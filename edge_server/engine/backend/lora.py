"""LoRA adapters loaded beside a model, and the set of them (with scales) a decode uses.

llama.cpp applies adapters per context, not per sequence: every row of one
`llama_decode` runs under the same adapters and scales. So each request carries the
adapter set it asked for (`AdapterSet`: a scale per loaded adapter), the scheduler
decodes one set a step (sched/adapter_turns.py), and a set's KV is its own: a
request's cache partition holds its set's key, so no prefix is shared between sets.

Adapters are loaded once with the model (`--lora FILE[:SCALE]`, a registry entry's
`lora`) and freed with it: llama.cpp frees a model's adapters when it frees the model,
after the context that may still point at them. (llama_cpp is imported where it is
called: the catalogue reads LoraSpec from registry files without loading llama.cpp.)
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_server.engine.backend.context_settings import ModelLoadError

log = logging.getLogger(__name__)

# Scales beyond this multiply an adapter's delta past anything trained: logits overflow
# to inf/NaN, which the samplers cannot order. llama-server leaves them unbounded.
MAX_SCALE = 4.0
# Adapters one model may load (each a weight set in memory; requests name them by id).
MAX_ADAPTERS = 16
# Separates a tenant's partition from its adapter set's key (kv/slots.py partitions).
KEY_SEPARATOR = "\x1flora:"


@dataclass(frozen=True)
class LoraSpec:
    """An adapter to load: its GGUF file and the scale requests get by default."""

    path: Path
    scale: float = 1.0


def parse_lora_spec(text: str) -> LoraSpec:
    """`FILE` or `FILE:SCALE` (llama-server's --lora / --lora-scaled)."""
    head, colon, tail = text.rpartition(":")
    path, scale = (head, tail) if colon and _is_number(tail) else (text, "1")
    value = float(scale)
    if not math.isfinite(value) or abs(value) > MAX_SCALE:
        raise ValueError(f"a LoRA scale must be finite and at most {MAX_SCALE:g} in size")
    return LoraSpec(Path(path).expanduser(), value)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class AdapterSet:
    """A scale for each loaded adapter (0: not applied), in adapter id order."""

    scales: tuple[float, ...] = ()
    key: str = ""  # "" where no adapter applies; else what tells this set's KV apart

    @property
    def empty(self) -> bool:
        return not self.key


NO_ADAPTERS = AdapterSet()


@dataclass
class LoadedAdapter:
    id: int
    name: str  # the file's name: answers never show a path
    handle: Any  # llama.cpp's adapter (a ctypes pointer; freed with the model)
    identity: str  # the file's name, size and mtime: keys saved prefixes across restarts
    n_bytes: int
    scale: float  # applied to requests that name no adapters (POST /lora-adapters)
    task_name: str = ""
    prompt_prefix: str = ""


class LoraAdapters:
    """The adapters of one model, loaded into its llama.cpp model object."""

    def __init__(self, model: ctypes.c_void_p, specs: tuple[LoraSpec, ...]) -> None:
        if len(specs) > MAX_ADAPTERS:
            raise ModelLoadError(f"at most {MAX_ADAPTERS} LoRA adapters per model")
        self.adapters: list[LoadedAdapter] = []
        for i, spec in enumerate(specs):
            self.adapters.append(_load(model, i, spec))
        self._applied = NO_ADAPTERS  # what the context decodes under now

    @property
    def n_bytes(self) -> int:
        return sum(a.n_bytes for a in self.adapters)

    def default_set(self) -> AdapterSet:
        return self._make(tuple(a.scale for a in self.adapters))

    def requested_set(self, scales: dict[int, float]) -> AdapterSet:
        """A request's `lora` list: the adapters it names at its scales, the others off
        (llama-server's per-request rule). Ids and scales were checked (check_request)."""
        return self._make(tuple(scales.get(a.id, 0.0) for a in self.adapters))

    def check_request(self, scales: dict[int, float]) -> str | None:
        """Why a request's `lora` cannot be served, or None."""
        for adapter_id, scale in scales.items():
            if not 0 <= adapter_id < len(self.adapters):
                loaded = len(self.adapters)
                return (f"no LoRA adapter has id {adapter_id}: this model has {loaded} "
                        "(GET /lora-adapters lists them)")
            if not math.isfinite(scale) or abs(scale) > MAX_SCALE:
                return f"a LoRA scale must be finite and at most {MAX_SCALE:g} in size"
        return None

    def set_defaults(self, scales: dict[int, float]) -> None:
        """POST /lora-adapters: the scales of requests that name none (others: 0)."""
        for adapter in self.adapters:
            adapter.scale = scales.get(adapter.id, 0.0)

    def _make(self, scales: tuple[float, ...]) -> AdapterSet:
        if not any(scales):
            return NO_ADAPTERS
        parts = [f"{a.identity}*{s!r}" for a, s in zip(self.adapters, scales, strict=True) if s]
        key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]
        return AdapterSet(tuple(float(s) for s in scales), key)

    def apply(self, ctx: ctypes.c_void_p, wanted: AdapterSet) -> bool:
        """Makes the context decode under `wanted` (nothing to do where it does). The
        next decode then rebuilds its graph (llama.cpp reserves it again)."""
        if wanted == self._applied:
            return True
        import llama_cpp as lc
        chosen = [(a, s) for a, s in zip(self.adapters, wanted.scales, strict=False) if s]
        n = len(chosen)
        handles = (lc.llama_adapter_lora_p_ctypes * max(n, 1))(*(a.handle for a, _ in chosen))
        scales = (ctypes.c_float * max(n, 1))(*(s for _, s in chosen))
        status = lc.llama_set_adapters_lora(ctx, handles if n else None, n,
                                            scales if n else None)
        if status != 0:
            log.error("llama.cpp refused a LoRA adapter set (%d)", status)
            return False
        self._applied = wanted
        return True


def _load(model: ctypes.c_void_p, adapter_id: int, spec: LoraSpec) -> LoadedAdapter:
    import llama_cpp as lc

    path = spec.path
    if not path.is_file():
        raise ModelLoadError(f"LoRA adapter not found: {path}")
    handle = lc.llama_adapter_lora_init(model, str(path).encode())
    if not handle:
        raise ModelLoadError(
            f"llama.cpp could not load the LoRA adapter {path.name}: it must be a LoRA "
            "GGUF (general.type adapter) made for this model's architecture and shapes")
    stat = path.stat()
    identity = f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}"
    adapter = LoadedAdapter(
        id=adapter_id, name=path.name, handle=handle,
        identity=identity, n_bytes=stat.st_size, scale=spec.scale,
        task_name=_meta(handle, b"adapter.lora.task_name"),
        prompt_prefix=_meta(handle, b"adapter.lora.prompt_prefix"))
    log.info("LoRA adapter %d: %s, scale %g", adapter_id, path.name, spec.scale)
    return adapter


def _meta(handle: Any, key: bytes) -> str:
    import llama_cpp as lc

    buf = ctypes.create_string_buffer(512)
    n = lc.llama_adapter_meta_val_str(handle, key, buf, len(buf))
    return buf.value.decode(errors="replace") if n >= 0 else ""
