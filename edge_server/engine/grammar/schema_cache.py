"""Converted schemas, cached by what decides their grammar and bounded in bytes.

Two schemas that differ only in annotations (`description`, `title`, `examples`, ...)
give the same grammar, and annotations are most of a large schema's text: keying on the
whole text let ten 7 MB schemas of differing descriptions pin 70 MB of keys. The key is a
digest of the schema without annotations; the cache holds grammars up to a byte budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from cachetools import LRUCache

# Keywords that describe a schema without constraining its instances.
ANNOTATIONS = frozenset({
    "description", "title", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
})
# Keywords whose value maps names to subschemas, holds a list of them, or is one.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_ONE = frozenset({"items", "additionalProperties", "not", "if", "then", "else",
                         "contains", "propertyNames", "additionalItems",
                         "unevaluatedItems", "unevaluatedProperties"})

# Grammars kept across requests: a finished grammar is at most 512 KiB (limits.py).
CACHE_BYTES = 32 << 20

Value = TypeVar("Value")


def without_annotations(schema: Any) -> Any:
    """The schema less its annotation keywords, at schema positions only: a property
    named `description` and `enum`/`const`/`default` data stay as they are."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ANNOTATIONS:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            value = {name: without_annotations(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            value = [without_annotations(sub) for sub in value]
        elif key in _SCHEMA_ONE:
            value = ([without_annotations(sub) for sub in value] if isinstance(value, list)
                     else without_annotations(value))
        out[key] = value
    return out


def schema_key(schema_text: str, strict: bool) -> bytes:
    """32 bytes naming a (schema text, strict) pair."""
    return hashlib.sha256(schema_text.encode() + (b"\x01" if strict else b"\x00")).digest()


class ByteBoundedCache:
    """An LRU of values whose size `size_of` measures, at most `max_bytes` in all; shared
    by the worker threads that prepare requests."""

    def __init__(self, max_bytes: int, size_of: Callable[[Any], int]) -> None:
        self._lru: LRUCache[bytes, Any] = LRUCache(maxsize=max_bytes, getsizeof=size_of)
        self._lock = threading.Lock()

    def get_or_make(self, key: bytes, make: Callable[[], Value]) -> Value:
        with self._lock:
            found = self._lru.get(key)
        if found is not None:
            return found
        value = make()  # outside the lock: conversions of other schemas go on meanwhile
        # A value larger than the whole cache (ValueError) is served, not kept.
        with self._lock, contextlib.suppress(ValueError):
            self._lru[key] = value
        return value

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return int(self._lru.currsize)

    def __len__(self) -> int:
        with self._lock:
            return len(self._lru)

    def clear(self) -> None:
        with self._lock:
            self._lru.clear()


def canonical_text(schema: dict[str, Any]) -> str:
    """The text a schema is converted from (key order kept: properties are generated in
    the order the schema gives them)."""
    return json.dumps(without_annotations(schema))
