"""Models made by /api/create and names made by /api/copy, kept in `ollama-models.json` in
the models directory so that they are served again after a restart (the registry file is
the operator's and is never written).

Each saved model has a source, served under its own name: a model the pool serves (its
name then answers for that model's engine, as an alias), or an uploaded GGUF blob (a
model of its own). What a Modelfile adds (a system prompt, a prompt template, default
options) is its profile, applied by the Ollama routes.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...model_pool import ModelPool
from ...model_spec import ModelSpec, UnknownModel
from ...model_store import ModelStore, RegistryEntry
from ..http.errors import APIError, invalid

log = logging.getLogger(__name__)

FILE_NAME = "ollama-models.json"
BLOB_PREFIX = "sha256:"
MAX_SAVED = 256
MAX_NAME_CHARS = 200


def check_new_name(name: str, saved: int) -> None:
    """The bound on names clients may add (/api/copy, /api/create): how many, how long."""
    if len(name) > MAX_NAME_CHARS or not name.isprintable() or any(c.isspace() for c in name):
        raise invalid("model", f"a model name has at most {MAX_NAME_CHARS} printable "
                      "characters and no spaces")
    if saved >= MAX_SAVED:
        raise APIError(409, f"this server keeps at most {MAX_SAVED} models made by /api/copy "
                       "and /api/create; delete one first", code="too_many_names")


@dataclass
class Profile:
    """What a Modelfile adds to the model it names in FROM."""

    system: str | None = None
    template: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    def over(self, base: Profile | None) -> Profile:
        """This profile on top of its base's (a model made FROM a made model)."""
        if base is None:
            return self
        return Profile(self.system if self.system is not None else base.system,
                       self.template if self.template is not None else base.template,
                       {**base.parameters, **self.parameters})


@dataclass
class SavedModel:
    name: str
    source: str  # a pool model's name, or "sha256:<hex>": a blob of its own
    profile: Profile | None = None  # None: a copy of a model that has none

    @property
    def from_blob(self) -> bool:
        return self.source.startswith(BLOB_PREFIX)


def blob_path(store: ModelStore, digest: str) -> Path:
    """Where the blob `sha256:<hex>` is kept (the caller checked the digest's form)."""
    return store.models_dir / "blobs" / f"sha256-{digest.removeprefix(BLOB_PREFIX)}"


class SavedModels:
    def __init__(self, store: ModelStore, make_spec: Callable[[RegistryEntry], ModelSpec]
                 ) -> None:
        self.store = store
        self.make_spec = make_spec
        self.path = store.models_dir / FILE_NAME
        self.models: dict[str, SavedModel] = {}

    # --- the file ----------------------------------------------------------------------

    def _read(self) -> list[SavedModel]:
        if not self.path.is_file():
            return []
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return [SavedModel(m["name"], m["source"],
                               Profile(**m["profile"]) if m.get("profile") else None)
                    for m in raw["models"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("%s is unreadable (%s): no created or copied model is served",
                      self.path.name, exc)
            return []

    def _write(self) -> None:
        body = {"version": 1, "models": [
            {"name": m.name, "source": m.source,
             "profile": asdict(m.profile) if m.profile else None}
            for m in self.models.values()]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(body, indent=1), encoding="utf-8")
        os.replace(temporary, self.path)  # whole or not at all, even on a crash

    def restore(self, pool: ModelPool) -> None:
        """Serves again what the file holds; a model whose source is gone is skipped
        (and kept in the file: it serves again once its source is back)."""
        kept = self._read()
        for model in kept:
            try:
                self._serve(pool, model)
            except (ValueError, UnknownModel) as exc:
                log.warning("saved model %s is not served: %s", model.name, exc)
        self.models = {m.name: m for m in kept}

    # --- the pool ----------------------------------------------------------------------

    def _serve(self, pool: ModelPool, model: SavedModel) -> None:
        if not model.from_blob:
            pool.add_name(model.source, model.name)
            return
        path = blob_path(self.store, model.source)
        if not path.is_file():
            raise ValueError(f"its file {model.source} is missing")
        pool.add_model(self.make_spec(RegistryEntry(model.name, path=path)))

    def add(self, pool: ModelPool, model: SavedModel) -> None:
        self._serve(pool, model)
        self.models[model.name] = model
        self._write()

    def dependents(self, name: str) -> list[str]:
        return [m.name for m in self.models.values() if m.source == name]

    def forget(self, pool: ModelPool, name: str) -> None:
        """Stops serving a saved model (not loaded: the caller unloaded it)."""
        model = self.models.pop(name)
        self._write()
        try:
            pool.spec(name)
        except UnknownModel:
            return  # not served since the start (its source was gone): the file only
        if model.from_blob:
            pool.remove_model(name)
        elif name in pool.runtime_names:
            pool.remove_name(name)

    def profile(self, name: str) -> Profile | None:
        model = self.models.get(name)
        return model.profile if model else None
