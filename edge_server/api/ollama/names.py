"""Model names as Ollama clients write them, `name:tag`, onto the pool's names.

A name resolves as given (registry ids, aliases and names made by /api/copy may carry a
tag of their own), else without its `:latest` tag, which Ollama adds to untagged names.
"""

from __future__ import annotations

from ...model_pool import ModelPool
from ...model_spec import ModelSpec, UnknownModel
from ..http.errors import APIError

LATEST = ":latest"


def not_found(name: str) -> APIError:
    # Ollama's words and status for a model it does not have.
    return APIError(404, f"model \"{name[:256]}\" not found, try pulling it first",
                    param="model", code="model_not_found")


def pool_name(pool: ModelPool, name: str) -> str:
    """The pool's name for `name`; a 404 in Ollama's words when there is none."""
    for candidate in (name, name.removesuffix(LATEST)):
        try:
            pool.spec(candidate)
        except UnknownModel:
            continue
        return candidate
    raise not_found(name)


def spec_of(pool: ModelPool, name: str) -> ModelSpec:
    return pool.spec(pool_name(pool, name))


def tagged(name: str) -> str:
    """The name as Ollama lists it: with a tag, `:latest` where it has none."""
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else name + LATEST
