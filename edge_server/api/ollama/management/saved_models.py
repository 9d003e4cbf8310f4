"""Models made by /api/create and names made by /api/copy, kept in `ollama-models.json` in
the models directory so that they are served again after a restart (the registry file is
the operator's and is never written).

Each saved model has a source, served under its own name: a model the pool serves (its
name then answers for that model's engine, as an alias), or an uploaded GGUF blob (a
model of its own). With LoRA adapters (uploaded blobs too) it is a model of its own
either way: its source's file loaded with them. What a Modelfile adds (a system
prompt, a prompt template, default options) is its profile, applied by the Ollama
routes.

An entry this version cannot read (a key it does not know, a newer server's, or a name
outside Ollama's grammar) is not served, is logged with the reason, and stays in the file
as it is; its name stays taken until /api/delete removes it. Serving it without what it
says would answer differently from the model its maker made. Changes go to the file as
changes (saved_file): replicas sharing the models directory keep each other's names.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

from edge_server.api.http.errors import APIError
from edge_server.api.http.io_threads import run_io
from edge_server.api.ollama import names
from edge_server.api.ollama.management import saved_file
from edge_server.catalogue.pool import ModelPool
from edge_server.catalogue.spec import ModelSpec, UnknownModel
from edge_server.catalogue.store import ModelStore, RegistryEntry
from edge_server.engine.backend.lora import LoraSpec

log = logging.getLogger(__name__)

FILE_NAME = "ollama-models.json"
BLOB_PREFIX = "sha256:"
MAX_SAVED = 256
_ENTRY_KEYS = {"name", "source", "profile", "adapters"}
_PROFILE_KEYS = {"system", "template", "parameters"}


def check_new_name(name: str, saved: int, param: str = "model") -> None:
    """The bound on names clients may add (/api/copy, /api/create): their grammar, how
    many."""
    names.check_name(name, param)
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
    adapters: tuple[str, ...] = ()  # LoRA blobs ("sha256:<hex>") loaded with its source

    @property
    def from_blob(self) -> bool:
        return self.source.startswith(BLOB_PREFIX)

    @property
    def own_engine(self) -> bool:
        """Served by an engine of its own (not as another model's name)."""
        return self.from_blob or bool(self.adapters)

    @property
    def blobs(self) -> tuple[str, ...]:
        return ((self.source,) if self.from_blob else ()) + self.adapters


def blob_path(store: ModelStore, digest: str) -> Path:
    """Where the blob `sha256:<hex>` is kept (the caller checked the digest's form)."""
    return store.models_dir / "blobs" / f"sha256-{digest.removeprefix(BLOB_PREFIX)}"


# --- entries of the file ---------------------------------------------------------------

def encode(model: SavedModel) -> dict[str, Any]:
    entry = {"name": model.name, "source": model.source,
             "profile": asdict(model.profile) if model.profile else None}
    # Only where there are some: earlier versions refuse keys they do not know.
    return {**entry, "adapters": list(model.adapters)} if model.adapters else entry


def decode(raw: Any) -> SavedModel:
    """The entry as a saved model; a ValueError saying why when this version cannot read
    all of it."""
    if not isinstance(raw, dict):
        raise ValueError("it is not an object")
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    profile = raw.get("profile")
    if isinstance(profile, dict):
        unknown += sorted(f"profile.{k}" for k in set(profile) - _PROFILE_KEYS)
    if unknown:
        raise ValueError(f"it holds keys this server does not know: {', '.join(unknown)}")
    name, source = raw.get("name"), raw.get("source")
    if not isinstance(name, str) or not isinstance(source, str) or not source:
        raise ValueError("its `name` and `source` are not both text")
    problem = names.name_problem(name)
    if problem is not None:
        raise ValueError(f"its name is not one clients may give: {problem}")
    adapters = raw.get("adapters", [])
    if not isinstance(adapters, list) or not all(
            isinstance(a, str) and a.startswith(BLOB_PREFIX) for a in adapters):
        raise ValueError("its `adapters` are not blob digests")
    if profile is None:
        return SavedModel(name, source, None, tuple(adapters))
    if not isinstance(profile, dict) or not all(
            isinstance(profile.get(k), str | None) for k in ("system", "template")) \
            or not isinstance(profile.get("parameters", {}), dict):
        raise ValueError("its `profile` is not one this server reads")
    return SavedModel(name, source, Profile(**profile), tuple(adapters))


def _name_of(raw: Any) -> str | None:
    name = raw.get("name") if isinstance(raw, dict) else None
    return name if isinstance(name, str) else None


def _source_of(raw: Any) -> str | None:
    source = raw.get("source") if isinstance(raw, dict) else None
    return source if isinstance(source, str) else None


def _blobs_of(raw: Any) -> list[str]:
    """The blobs an entry of the file (readable or not) is made from."""
    if not isinstance(raw, dict):
        return []
    source, adapters = raw.get("source"), raw.get("adapters")
    found = [source] if isinstance(source, str) and source.startswith(BLOB_PREFIX) else []
    return found + ([a for a in adapters if isinstance(a, str)]
                    if isinstance(adapters, list) else [])


def _file_error(exc: Exception) -> APIError | None:
    """What a client is told when the file could not be changed (None: not such a case)."""
    if isinstance(exc, saved_file.Unreadable):
        return APIError(503, f"{FILE_NAME} cannot be read ({exc}), and nothing is saved over "
                        "it: the operator fixes or moves it (see the server log)",
                        type="server_error", code="saved_models_unreadable")
    if isinstance(exc, saved_file.Busy):
        return APIError(503, "another process keeps the saved models locked; retry",
                        type="server_error", code="saved_models_busy")
    if isinstance(exc, OSError):
        return APIError(507, "the change could not be saved in the models directory",
                        type="server_error", code="insufficient_storage")
    return None


class SavedModels:
    def __init__(self, store: ModelStore, make_spec: Callable[[RegistryEntry], ModelSpec]
                 ) -> None:
        self.store = store
        self.make_spec = make_spec
        self.path = store.models_dir / FILE_NAME
        self.models: dict[str, SavedModel] = {}
        self.unread: dict[str, str] = {}  # names of entries not read: why (kept in the file)

    def restore(self, pool: ModelPool) -> None:
        """Serves again what the file holds; a model whose source is gone is skipped
        (and kept in the file: it serves again once its source is back)."""
        try:
            entries = saved_file.read(self.path)["models"]
        except saved_file.Unreadable as exc:
            log.error("%s is unreadable (%s): no created or copied model is served, and no "
                      "name is saved over it until it is fixed or moved away", FILE_NAME, exc)
            return
        for i, raw in enumerate(entries):
            try:
                model = decode(raw)
            except ValueError as exc:
                name = _name_of(raw)
                if name is not None:
                    self.unread[name] = str(exc)
                log.warning("saved model %s is not served, and is kept in %s as it is: %s",
                            repr(name[:200]) if name else f"#{i}", FILE_NAME, exc)
                continue
            if model.name in self.models:
                log.warning("saved model %r is in %s twice: the first is served",
                            model.name, FILE_NAME)
                continue
            try:
                self._serve(pool, model)
            except (ValueError, UnknownModel) as exc:
                log.warning("saved model %s is not served: %s", model.name, exc)
            self.models[model.name] = model

    def taken(self, name: str) -> bool:
        return name in self.models or name in self.unread

    # --- the pool ----------------------------------------------------------------------

    def _serve(self, pool: ModelPool, model: SavedModel) -> None:
        if not model.own_engine:
            pool.add_name(model.source, model.name)
            return
        path = blob_path(self.store, model.source) if model.from_blob \
            else pool.spec(model.source).path
        if path is None or not path.is_file():
            raise ValueError(f"the file of its source {model.source} is missing")
        adapters = [blob_path(self.store, digest) for digest in model.adapters]
        missing = [d for d, p in zip(model.adapters, adapters, strict=True) if not p.is_file()]
        if missing:
            raise ValueError(f"its adapter {missing[0]} is missing")
        pool.add_model(self.make_spec(RegistryEntry(
            model.name, path=path, lora=tuple(LoraSpec(p) for p in adapters))))

    @staticmethod
    def _unserve(pool: ModelPool, model: SavedModel) -> bool:
        """Whether it was served (not since the start when its source was gone)."""
        try:
            pool.spec(model.name)
        except UnknownModel:
            return False
        if model.own_engine:
            pool.remove_model(model.name)
        elif model.name in pool.runtime_names:
            pool.remove_name(model.name)
        return True

    # --- changes: the pool on the loop, the file on an I/O thread ----------------------

    async def _change(self, change: Callable[[dict[str, Any]], Any],
                      written: Callable[[Any], None] | None = None) -> Any:
        try:
            # Shielded: a client that leaves does not part the pool from the file.
            with anyio.CancelScope(shield=True):
                return await run_io(saved_file.update, self.path, change, written)
        except (saved_file.Unreadable, OSError) as exc:
            log.error("%s was not changed: %s", FILE_NAME, exc)
            error = _file_error(exc)
            assert error is not None
            raise error from exc

    async def add(self, pool: ModelPool, model: SavedModel) -> None:
        """Serves and saves `model`; a ValueError when its name is taken."""
        if model.name in self.unread:
            raise ValueError(f"`{model.name}` names a saved model this server cannot read")
        self._serve(pool, model)
        try:
            await self._change(functools.partial(self._added, model))
        except BaseException:
            self._unserve(pool, model)
            raise
        self.models[model.name] = model

    def _added(self, model: SavedModel, document: dict[str, Any]) -> None:
        entries: list[Any] = document["models"]
        if any(_name_of(raw) == model.name for raw in entries):
            raise ValueError(f"`{model.name}` was saved by another process")
        for digest in model.blobs:
            if not blob_path(self.store, digest).is_file():
                raise ValueError(f"its file {digest} was deleted")  # by another process
        entries.append(encode(model))

    def dependents(self, name: str) -> list[str]:
        return [m.name for m in self.models.values() if m.source == name]

    async def forget(self, pool: ModelPool, name: str) -> None:
        """Stops serving a saved model (not loaded: the caller unloaded it) and removes it
        from the file, and its blob where no other entry is made from that; a ValueError
        naming another entry made from it (one another process saved)."""
        model = self.models.get(name)
        # First: no request loads it while the file changes.
        served = model is not None and self._unserve(pool, model)
        try:
            await self._change(functools.partial(self._removed, name),
                               functools.partial(self._drop_blob, model))
        except BaseException:
            if model is not None and served:
                with contextlib.suppress(ValueError, UnknownModel):
                    self._serve(pool, model)
            raise
        self.models.pop(name, None)
        self.unread.pop(name, None)

    @staticmethod
    def _removed(name: str, document: dict[str, Any]) -> list[Any]:
        entries: list[Any] = document["models"]
        made_from = [n for raw in entries if _source_of(raw) == name
                     and (n := _name_of(raw)) is not None and n != name]
        if made_from:
            raise ValueError(made_from[0])
        entries[:] = [raw for raw in entries if _name_of(raw) != name]
        return entries

    def _drop_blob(self, model: SavedModel | None, entries: list[Any]) -> None:
        """The blob's last model is gone (from the file, under its lock): the upload goes
        with it. Another process's model made from it keeps it."""
        if model is None:
            return
        kept = {b for raw in entries for b in _blobs_of(raw)}
        for digest in model.blobs:
            if digest in kept:
                continue
            try:
                blob_path(self.store, digest).unlink(missing_ok=True)
            except OSError as exc:  # the model is gone all the same
                log.warning("a blob of %s was not removed: %s", model.name, exc)

    def profile(self, name: str) -> Profile | None:
        model = self.models.get(name)
        return model.profile if model else None
