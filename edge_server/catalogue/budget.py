"""The model pool's memory budget: its size, what models being loaded or freed hold of
it, and what each model held when it was last loaded.

A loaded model is charged what llama.cpp allocated for it (Engine.held_bytes: weights,
KV streams, which are resident from load, compute buffers, projector, embedding
context). A model about to load is charged what it took the last time it was loaded
with the same file and settings, else what its file's header says it will take
(ModelSpec.estimated_bytes); that charge holds its place in the budget while it loads.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from edge_server.catalogue.spec import ModelSpec


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def memory_budget_bytes(configured: int) -> int:
    """The memory for loaded models: `configured` bytes, else 75% of RAM."""
    return configured if configured > 0 else int(physical_memory() * 0.75)


def _load_identity(spec: ModelSpec) -> tuple[object, ...]:
    """What a model's memory at load follows: its file (and version) and its settings."""
    try:
        stat = spec.path.stat() if spec.path is not None else None
    except OSError:
        stat = None
    version = (stat.st_size, stat.st_mtime_ns) if stat is not None else None
    return (spec.path, version, spec.settings.context, spec.settings.mmproj, spec.settings.lora,
            spec.settings.draft_model)


class Budget:
    def __init__(self, configured: int) -> None:
        self.total = memory_budget_bytes(configured)
        # Held by models not loaded: being loaded (their charge), being freed (what they
        # held, until llama.cpp has given it back).
        self.reserved: dict[str, int] = {}
        self._held_at_load: dict[str, tuple[tuple[object, ...], int]] = {}

    @contextlib.contextmanager
    def holding(self, key: str, size: int) -> Iterator[None]:
        """`size` bytes held under `key` meanwhile (a model being freed)."""
        self.reserved[key] = size
        try:
            yield
        finally:
            self.reserved.pop(key, None)

    def remembered(self, spec: ModelSpec) -> int | None:
        """What the model held when last loaded with this file and these settings."""
        held = self._held_at_load.get(spec.id)
        return held[1] if held is not None and held[0] == _load_identity(spec) else None

    def remember(self, spec: ModelSpec, held: int) -> None:
        self._held_at_load[spec.id] = (_load_identity(spec), held)

    def too_big(self, need: int, model_id: str) -> str | None:
        """Why a model needing `need` bytes can never load here (None: it could)."""
        if need <= self.total:
            return None
        return (f"model `{model_id}` needs {need >> 20} MiB (weights, KV cache for its "
                f"context and slots, compute buffers), more than the whole memory budget "
                f"({self.total >> 20} MiB); a smaller context or fewer slots would fit")
