"""Stored Responses: an SQLite file (standard library) holding each stored response, the
conversation it ends, and the tokens a follow-up turn can continue from.

Bounded three ways, least recently used first: responses unused for `max_age_s`, more
than `max_count`, more than `max_bytes` of data. Every row belongs to a tenant (an API
key's id, "" without keys); a lookup names its tenant, so another key's ids are unknown.

sqlite3 calls block: the async methods run them on a worker thread, one at a time (one
connection, one limiter), so the event loop never waits on the disk.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread

log = logging.getLogger(__name__)

FILE_NAME = "responses.sqlite3"
_SCHEMA_VERSION = 1
# Tries at opening a file other processes are opening too (5 s of waits in all).
_OPEN_ATTEMPTS = 50
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_used REAL NOT NULL,
    size INTEGER NOT NULL,
    response TEXT NOT NULL,
    turns TEXT NOT NULL,
    fingerprint TEXT,
    prompt_key TEXT,
    tokens BLOB
);
CREATE INDEX IF NOT EXISTS responses_by_last_use ON responses (last_used);
"""

Result = TypeVar("Result")


class StoreError(Exception):
    """The store's file cannot be opened or used (said without the file's path)."""


@dataclass
class Continuation:
    """What a follow-up turn needs to continue this response's tokens instead of
    evaluating the conversation again (see continuation.py)."""

    fingerprint: str  # the engine's: tokens of another model or build are never reused
    key: str  # digest of the prompt as rendered with earlier outputs as markers
    tokens: list[int]  # prompt plus generated tokens


@dataclass
class StoredResponse:
    id: str
    tenant: str
    response: dict[str, Any]  # the response object as answered
    # The conversation this response ends, one turn per response of the chain:
    # {"id": response id, "input": [items], "output": [items]}, this response's last.
    turns: list[dict[str, Any]]
    continuation: Continuation | None = None


class _Database:
    """The synchronous store; one connection, used by one thread at a time."""

    def __init__(self, path: Path, max_count: int, max_bytes: int, max_age_s: float) -> None:
        self.max_count, self.max_bytes, self.max_age_s = max_count, max_bytes, max_age_s
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        # Conversations are private: the file is the owner's alone (SQLite gives its
        # journal files the same mode).
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=5.0)
        # Replicas on one box may share the file and start together: switching a new file
        # to WAL and creating the schema can answer "locked" at once (no busy wait there),
        # so the opening steps are tried again for a while.
        for attempt in range(_OPEN_ATTEMPTS):
            try:
                self._prepare()
                break
            except sqlite3.OperationalError as exc:
                if attempt == _OPEN_ATTEMPTS - 1 or "locked" not in str(exc):
                    raise
                time.sleep(0.1)

    def _prepare(self) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, _SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"schema version {version} is not this server's")
        with self._db:
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        # Committed at once: an open write would lock out every other replica's store.
        with self._db:
            self._expire(time.time())

    def put(self, record: StoredResponse) -> bool:
        response = json.dumps(record.response, ensure_ascii=False, separators=(",", ":"))
        turns = json.dumps(record.turns, ensure_ascii=False, separators=(",", ":"))
        cont = record.continuation
        tokens = array("i", cont.tokens).tobytes() if cont is not None else None
        size = len(response.encode()) + len(turns.encode()) + len(tokens or b"")
        if size > self.max_bytes:
            log.warning("response %s not stored: %d bytes is over the store's size cap",
                        record.id, size)
            return False
        now = time.time()
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (record.id, record.tenant, now, now, size, response, turns,
                 cont.fingerprint if cont else None, cont.key if cont else None, tokens))
            self._expire(now)
            self._evict()
        return True

    def response(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        row = self._touch(tenant, response_id, "response")
        return None if row is None else json.loads(row[0])

    def conversation(self, tenant: str, response_id: str) -> StoredResponse | None:
        row = self._touch(tenant, response_id, "response, turns, fingerprint, prompt_key, "
                          "tokens")
        if row is None:
            return None
        response, turns, fingerprint, key, blob = row
        cont = None
        if blob is not None:
            tokens = array("i")
            tokens.frombytes(blob)
            cont = Continuation(fingerprint, key, tokens.tolist())
        return StoredResponse(response_id, tenant, json.loads(response), json.loads(turns), cont)

    def delete(self, tenant: str, response_id: str) -> bool:
        with self._lock, self._db:
            cursor = self._db.execute("DELETE FROM responses WHERE id = ? AND tenant = ?",
                                      (response_id, tenant))
        return cursor.rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _touch(self, tenant: str, response_id: str, columns: str) -> tuple[Any, ...] | None:
        """The row's columns, if the tenant's and not expired; its use is recorded."""
        now = time.time()
        with self._lock, self._db:
            row = self._db.execute(
                f"SELECT {columns} FROM responses WHERE id = ? AND tenant = ? "
                "AND last_used >= ?", (response_id, tenant, now - self.max_age_s)).fetchone()
            if row is not None:
                self._db.execute("UPDATE responses SET last_used = ? WHERE id = ?",
                                 (now, response_id))
        return row

    def _expire(self, now: float) -> None:
        self._db.execute("DELETE FROM responses WHERE last_used < ?", (now - self.max_age_s,))

    def _evict(self) -> None:
        count, total = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses").fetchone()
        doomed: list[tuple[str]] = []
        rows = self._db.execute("SELECT id, size FROM responses ORDER BY last_used, created_at")
        for response_id, size in rows:
            if count <= self.max_count and total <= self.max_bytes:
                break
            doomed.append((response_id,))
            count, total = count - 1, total - size
        self._db.executemany("DELETE FROM responses WHERE id = ?", doomed)


class ResponseStore:
    """The store as the HTTP layer uses it: each call on a worker thread, one at a time.
    sqlite3 errors become StoreError."""

    def __init__(self, path: Path, *, max_count: int, max_bytes: int,
                 max_age_s: float) -> None:
        try:
            self._db = _Database(path, max_count, max_bytes, max_age_s)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"the response store {path} cannot be opened: {exc}") from exc
        self._limiter: anyio.CapacityLimiter | None = None

    async def put(self, record: StoredResponse) -> bool:
        """False where the record is larger than the whole store may be."""
        return await self._run(self._db.put, record)

    async def response(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        return await self._run(self._db.response, tenant, response_id)

    async def conversation(self, tenant: str, response_id: str) -> StoredResponse | None:
        return await self._run(self._db.conversation, tenant, response_id)

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await self._run(self._db.delete, tenant, response_id)

    def close(self) -> None:
        self._db.close()

    async def _run(self, fn: Callable[..., Result], *args: Any) -> Result:
        if self._limiter is None:  # made on the event loop that uses it
            self._limiter = anyio.CapacityLimiter(1)
        try:
            return await anyio.to_thread.run_sync(lambda: fn(*args), limiter=self._limiter)
        except sqlite3.Error as exc:
            log.error("response store: %s", exc)
            raise StoreError("the response store failed") from exc
