"""Stored Responses: an SQLite file (standard library) holding each stored response, the
turn it adds to the conversation it continues, and the tokens a follow-up turn can
continue from (the file: store_db.py; its rows: store_codec.py).

Bounded per tenant (an API key's id, "" without keys), least recently used first: at most
`max_count` responses and `max_bytes` of data each, so one key's traffic evicts only its
own; responses unused for `max_age_s` go. A lookup names its tenant, so another key's
ids are unknown.

sqlite3 calls block: they run on the store's worker thread, one at a time (one
connection, one limiter), and only move bytes there. JSON is made and parsed on the
preparation threads, so no tenant's large conversation holds up another's store call,
and the event loop never waits on the disk or the parsing.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from edge_server.api.http.dependencies import off_loop
from edge_server.api.openai.responses.store_codec import decode, encode
from edge_server.api.openai.responses.store_db import Database, Put
from edge_server.api.openai.responses.store_types import (
    Continuation,
    ResponseRecord,
    StoredResponse,
    StoreError,
)

__all__ = [
    "FILE_NAME",
    "Continuation",
    "ResponseRecord",
    "ResponseStore",
    "StoreError",
    "StoredResponse",
]

log = logging.getLogger(__name__)

FILE_NAME = "responses.sqlite3"

Result = TypeVar("Result")


class ResponseStore:
    """The store as the HTTP layer uses it. sqlite3 errors, and rows that cannot be read
    (a corrupt file), become StoreError."""

    def __init__(self, path: Path, *, max_count: int, max_bytes: int,
                 max_age_s: float) -> None:
        try:
            self._db = Database(path, max_count, max_bytes, max_age_s)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"the response store {path} cannot be opened: {exc}") from exc
        self._limiter: anyio.CapacityLimiter | None = None

    async def put(self, record: ResponseRecord, *, max_bytes: int | None = None) -> bool:
        """False where the record was not stored: larger than its tenant may keep, or
        its response and turn larger than `max_bytes` (what its model could render)."""
        encoded = await self._parse(encode, record)
        if max_bytes is not None and len(encoded.response) + len(encoded.turns) > max_bytes:
            log.warning("response %s not stored: %d bytes is more than its model could "
                        "render", record.id, len(encoded.response) + len(encoded.turns))
            return False
        outcome = await self._run(self._db.put, encoded)
        if outcome is Put.PARENT_GONE:
            # The response it continues went meanwhile (deleted, evicted): this one
            # keeps the whole conversation itself.
            encoded = await self._parse(lambda r: encode(r, whole=True), record)
            outcome = await self._run(self._db.put, encoded)
        return outcome is Put.STORED

    async def response_json(self, tenant: str, response_id: str) -> bytes | None:
        """The stored response object, as answered (JSON bytes, checked to be one)."""
        found = await self._run(self._db.response, tenant, response_id)
        return None if found is None else await self._parse(_checked_object, found)

    async def conversation(self, tenant: str, response_id: str, *,
                           with_tokens: bool = True) -> StoredResponse | None:
        """`with_tokens`: with the tokens a follow-up continues (input_items needs none)."""
        chain = await self._run(self._db.chain, tenant, response_id, with_tokens)
        if chain is None:
            return None
        return await self._parse(lambda c: decode(c, with_tokens=with_tokens), chain)

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await self._run(self._db.delete, tenant, response_id)

    def close(self) -> None:
        self._db.close()

    async def _run(self, fn: Callable[..., Result], *args: Any) -> Result:
        if self._limiter is None:  # made on the event loop that uses it
            self._limiter = anyio.CapacityLimiter(1)
        try:
            return await anyio.to_thread.run_sync(lambda: fn(*args), limiter=self._limiter)
        except (sqlite3.Error, ValueError) as exc:
            log.error("response store: %s", exc)
            raise StoreError("the response store failed") from exc

    @staticmethod
    async def _parse(fn: Callable[[Any], Result], value: Any) -> Result:
        try:
            return await off_loop(fn, value)
        except (ValueError, TypeError, KeyError) as exc:
            log.error("response store: a stored response cannot be read: %s", exc)
            raise StoreError("the response store failed") from exc


def _checked_object(text: bytes) -> bytes:
    """The text as it is, once it proved to be a JSON object (a row of a corrupt file is
    an error, not an answer)."""
    if not isinstance(json.loads(text), dict):
        raise ValueError("a stored response is not a JSON object")
    return text
