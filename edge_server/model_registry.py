"""The models this server serves, by id and alias, and their loading state."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .engine import Engine, EngineSettings

log = logging.getLogger(__name__)


class UnknownModel(LookupError):
    pass


class ModelNotReady(RuntimeError):
    pass


@dataclass
class ModelSpec:
    id: str
    path: Path
    aliases: tuple[str, ...] = ()
    settings: EngineSettings = field(default_factory=EngineSettings)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)


class ModelRegistry:
    def __init__(self, specs: list[ModelSpec]) -> None:
        self.specs = specs
        self._by_name = {name: spec for spec in specs for name in spec.names}
        self._engines: dict[str, Engine] = {}
        self._lock = threading.Lock()
        self.load_error: str | None = None

    @property
    def ready(self) -> bool:
        return len(self._engines) == len(self.specs)

    def load_all(self) -> None:
        """Loads every model (blocking: run it off the event loop)."""
        for spec in self.specs:
            try:
                engine = Engine(spec.id, spec.path, spec.settings)
            except Exception as exc:
                self.load_error = f"{spec.id}: {exc}"
                log.error("could not load model %s: %s", spec.id, exc)
                raise
            with self._lock:
                self._engines[spec.id] = engine

    def get(self, name: str) -> Engine:
        spec = self._by_name.get(name)
        if spec is None:
            raise UnknownModel(name)
        engine = self._engines.get(spec.id)
        if engine is None:
            raise ModelNotReady(spec.id)
        return engine

    def stats(self) -> dict[str, dict[str, int]]:
        """Per loaded model: slots, busy slots and queue depth."""
        return {model_id: engine.scheduler.stats() for model_id, engine in self._engines.items()}

    def close(self) -> None:
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()
