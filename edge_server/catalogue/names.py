"""Which model each name answers for: ids, aliases and glob aliases of the configured
models, and the names and models added while serving (Ollama's /api/copy, /api/pull,
/api/create). Knows nothing of what is loaded; the model pool (pool.py) builds on
it.
"""

from __future__ import annotations

from edge_server.catalogue.spec import ModelSpec, UnknownModel, with_default
from edge_server.catalogue.store import is_name_pattern


class TooManyNames(ValueError):
    """add_name past MAX_RUNTIME_NAMES."""


# Names added while serving (/api/copy): each is listed by /v1/models and /api/tags.
MAX_RUNTIME_NAMES = 256


class ModelNames:
    def __init__(self, specs: list[ModelSpec], *, default: str | None = None,
                 serve_unknown: bool = False) -> None:
        """`default`: id or alias of the model served by default (None: the first spec).
        `serve_unknown`: names no model answers to are served by the default model."""
        self.specs = with_default(specs, default)
        self.serve_unknown = serve_unknown
        self._by_name: dict[str, ModelSpec] = {}
        for spec in self.specs:
            for name in spec.names:
                if is_name_pattern(name):
                    continue  # matched by resolve(), never a name of its own
                if self._by_name.setdefault(name, spec) is not spec:
                    raise ValueError(f"model name `{name}` is used twice")
        self.runtime_names: set[str] = set()  # aliases added while serving (add_name)

    def spec(self, name: str) -> ModelSpec:
        """The model `name` names exactly: its id or an alias (Ollama's routes, which
        answer 404 for anything else, and model management)."""
        spec = self._by_name.get(name)
        if spec is None:
            raise UnknownModel(name)
        return spec

    def resolve(self, name: str) -> ModelSpec:
        """The model that serves requests for `name`: the one it names; else the first
        whose glob alias matches it; else, with serve_unknown, the default model. Answers
        carry the model's own id, so callers see which model answered."""
        spec = self._by_name.get(name)
        if spec is None:
            spec = next((s for s in self.specs if s.matches_pattern(name)), None)
        if spec is None and self.serve_unknown and self.specs:
            spec = self.specs[0]
        if spec is None:
            raise UnknownModel(name)
        return spec

    @property
    def default_id(self) -> str | None:
        return self.specs[0].id if self.specs else None

    def add_name(self, name: str, alias: str) -> ModelSpec:
        """`alias` answers for the model `name` names from now on (not kept across
        restarts)."""
        spec = self.spec(name)
        if alias in self._by_name:
            raise ValueError(f"model name `{alias}` is already used")
        if len(self.runtime_names) >= MAX_RUNTIME_NAMES:
            raise TooManyNames(f"{MAX_RUNTIME_NAMES} names were added already; remove one "
                               "first")
        spec.aliases = (*spec.aliases, alias)
        self._by_name[alias] = spec
        self.runtime_names.add(alias)
        return spec

    def remove_name(self, alias: str) -> None:
        """Removes an alias add_name gave."""
        if alias not in self.runtime_names:
            raise ValueError(f"`{alias}` was not added while serving")
        spec = self.spec(alias)
        spec.aliases = tuple(a for a in spec.aliases if a != alias)
        del self._by_name[alias]
        self.runtime_names.discard(alias)

    def add_model(self, spec: ModelSpec) -> None:
        """A model that came to be served at run time (a pulled file)."""
        taken = [n for n in spec.names if n in self._by_name]
        if taken:
            raise ValueError(f"model name `{taken[0]}` is already used")
        self.specs.append(spec)
        for name in spec.names:
            self._by_name[name] = spec

    def remove_model(self, model_id: str) -> None:
        """Stops serving a model add_model gave, and its names."""
        spec = self.spec(model_id)
        for name in spec.names:
            self._by_name.pop(name, None)
            self.runtime_names.discard(name)
        self.specs.remove(spec)
