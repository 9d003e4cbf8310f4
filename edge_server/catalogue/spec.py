"""What the server knows of a model before loading it: its id, names, file and engine
settings (a spec), and which spec answers to the `default` alias."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
from dataclasses import dataclass, field
from pathlib import Path

from edge_server.catalogue.default_model import DEFAULT_ALIAS
from edge_server.catalogue.store import is_name_pattern
from edge_server.engine import EngineSettings
from edge_server.engine.backend.load_estimate import estimated_bytes
from edge_server.engine.multimodal.projector_check import projector_modalities


class UnknownModel(LookupError):
    pass


@dataclass
class ModelSpec:
    id: str
    path: Path | None  # None: not on disk (missing_reason says why)
    aliases: tuple[str, ...] = ()
    settings: EngineSettings = field(default_factory=EngineSettings)
    keep_alive: float | None = None  # None: the pool's default
    missing_reason: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)

    def matches_pattern(self, name: str) -> bool:
        """Whether one of its glob aliases matches `name` (case-sensitive, as names are)."""
        return any(fnmatch.fnmatchcase(name, alias) for alias in self.aliases
                   if is_name_pattern(alias))

    def created(self) -> int:
        """The file's modification time (OpenAI's `created`), 0 when there is no file."""
        try:
            return int(self.path.stat().st_mtime) if self.path else 0
        except OSError:  # deleted or unreadable since start: still listed, never a 500
            return 0

    def modalities(self) -> tuple[str, ...]:
        """What the model reads: text, plus what its projector file declares."""
        mmproj = self.settings.mmproj
        if mmproj is None:
            return ("text",)
        return ("text", *_projector_modalities(mmproj))

    def estimated_bytes(self) -> int:
        """What the model will hold once loaded (weights, KV streams, compute buffers,
        projector, LoRA adapters, draft model), from its file's header: blocking, call it
        off the event loop."""
        try:
            if self.path is None or not self.path.is_file():
                return 0
            mmproj = self.settings.mmproj
            projector = mmproj.stat().st_size if mmproj is not None and mmproj.is_file() else 0
            adapters = sum(a.path.stat().st_size for a in self.settings.lora if a.path.is_file())
            draft = self.settings.draft_model
            drafter = (estimated_bytes(draft, self.settings.context)
                       if draft is not None and draft.is_file() else 0)
            return (estimated_bytes(self.path, self.settings.context) + projector + adapters
                    + drafter)
        except OSError:
            return 0  # gone since: the load says why


@functools.lru_cache(maxsize=64)
def _projector_modalities(path: Path) -> tuple[str, ...]:
    return projector_modalities(path)


def with_default(specs: list[ModelSpec], default: str | None) -> list[ModelSpec]:
    """The specs with the default model (named by id or alias; None: the first) listed
    first, answering to the `default` alias: clients that take the first listed model, or
    ask for `default`, get the model the server was started to serve."""
    if not specs:
        return []
    chosen = specs[0] if default is None else next(
        (s for s in specs if default in s.names), None)
    if chosen is None:
        raise UnknownModel(default)
    first = dataclasses.replace(chosen, aliases=(*chosen.aliases, DEFAULT_ALIAS))
    return [first, *(s for s in specs if s is not chosen)]
