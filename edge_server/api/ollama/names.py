"""Model names as Ollama clients write them, `name:tag`, onto the pool's names.

A name resolves as given (registry ids, aliases and names made by /api/copy may carry a
tag of their own), else without its `:latest` tag, which Ollama adds to untagged names.
Names clients give (/api/copy, /api/create) follow Ollama's grammar (check_name).
"""

from __future__ import annotations

import re

from edge_server.api.http.errors import APIError, invalid
from edge_server.catalogue.pool import ModelPool
from edge_server.catalogue.spec import ModelSpec, UnknownModel

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


# --- names clients may give (/api/copy, /api/create) ------------------------------------

MAX_NAME_CHARS = 200
# Ollama's name grammar, [host/][namespace/]model[:tag]: each part starts with a letter,
# a digit or `_` and holds those, `.` and `-`; a host may end with a port. Nothing else:
# `*`, `?` and `[` would make the name a glob pattern answering for every name it
# matches (catalogue/store.py's is_name_pattern), spaces and slashes beyond three parts no
# client could type back.
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}")
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,349}(:[0-9]{1,5})?")


def name_problem(name: str) -> str | None:
    """Why `name` is not a model name in Ollama's grammar (None: it is one)."""
    if len(name) > MAX_NAME_CHARS:
        return f"it has more than {MAX_NAME_CHARS} characters"
    head, slash, last = name.rpartition("/")
    model, colon, tag = last.partition(":")
    parts = [*head.split("/"), model] if slash else [model]
    if len(parts) > 3:
        return "it has more than three parts (host/namespace/model)"
    host = parts.pop(0) if len(parts) == 3 else None
    if host is not None and not _HOST.fullmatch(host):
        return f"the host `{host[:40]}` is not one"
    for part in [*parts, *([tag] if colon else [])]:
        if not _PART.fullmatch(part):
            return f"the part `{part[:40]}` is not one" if part else "a part is empty"
    return None


def check_name(name: str, param: str) -> None:
    """A 400 naming `param` unless `name` is a model name clients may give."""
    problem = name_problem(name)
    if problem is not None:
        raise invalid(param, f"`{param}` must be a model name as Ollama writes them, "
                      f"[host/][namespace/]model[:tag] in at most {MAX_NAME_CHARS} characters, "
                      "each part of letters, digits, `_`, `.` and `-` (no spaces, no `*`, `?` "
                      f"or `[`): {problem}")
