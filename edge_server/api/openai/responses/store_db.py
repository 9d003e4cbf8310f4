"""The Responses store's SQLite file: one row per stored response, used by one thread
at a time (store.py runs every call on its store thread).

A chained response's row holds only its own turn and names its parent (`parent`), so a
chain of n turns is stored once, not n times over; reading it walks the parents. A row
that goes (deleted, expired, evicted) while responses continue it is folded into its
children first: each child takes the row's turns (and the tokens it extends), so every
response still stored keeps its whole conversation and `previous_response_id` keeps
working from it.

Caps hold per tenant (an API key's id, "" without keys): a tenant's rows beyond its
count or bytes go, least recently used first, and no other tenant's row ever does.
Rows unused for `max_age_s` go whoever's they are. Only bytes move through here: JSON
is made and parsed on other threads (store_codec.py).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from enum import Enum
from pathlib import Path
from typing import Any

from edge_server.api.openai.responses.store_codec import (
    ChainRead,
    ChainRow,
    EncodedRecord,
    joined_turns,
)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
# Tries at opening a file other processes are opening too (5 s of waits in all).
_OPEN_ATTEMPTS = 50
# Deeper than any chain a context can render: a guard against a corrupt file's loops.
_MAX_DEPTH = 1_000_000
_TABLE = """
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
    tokens BLOB,
    parent TEXT,
    extends INTEGER NOT NULL DEFAULT 0,
    chain_bytes INTEGER NOT NULL DEFAULT 0
)"""
# Version 1 rows held their whole conversation each: they are roots of version 2.
_FROM_VERSION_1 = (
    "ALTER TABLE responses ADD COLUMN parent TEXT",
    "ALTER TABLE responses ADD COLUMN extends INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE responses ADD COLUMN chain_bytes INTEGER NOT NULL DEFAULT 0",
    "UPDATE responses SET chain_bytes = length(CAST(turns AS BLOB))",
)
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS responses_by_last_use ON responses (last_used)",
    "CREATE INDEX IF NOT EXISTS responses_by_tenant ON responses (tenant, last_used)",
    "CREATE INDEX IF NOT EXISTS responses_by_parent ON responses (parent)",
)
_COLUMNS = ("id, tenant, created_at, last_used, size, response, turns, fingerprint, "
            "prompt_key, tokens, parent, extends, chain_bytes")
_CHAIN = """
WITH RECURSIVE chain(id, parent, turns, tokens, extends, depth) AS (
    SELECT id, parent, turns, {tokens}, extends, 0 FROM responses
    WHERE id = ? AND tenant = ? AND last_used >= ?
    UNION ALL
    SELECT r.id, r.parent, r.turns, {r_tokens}, r.extends, chain.depth + 1
    FROM responses AS r JOIN chain ON r.id = chain.parent
    WHERE r.tenant = ? AND chain.depth < ?
)
SELECT parent, turns, tokens, extends FROM chain ORDER BY depth DESC
"""


class Put(Enum):
    STORED = "stored"
    TOO_LARGE = "too large"  # larger than the tenant may keep
    PARENT_GONE = "parent gone"  # store it whole instead (store_codec.encode)


def _bytes(value: bytes | str | None) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else value


class Database:
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
        # to WAL can answer "locked" at once (no busy wait there), so the opening steps
        # are tried again for a while.
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
        # The version is read inside the write: of replicas opening an old file
        # together, one converts it and the others find it converted.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, 1, SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"schema version {version} is not this server's")
            if version == 0:
                self._db.execute(_TABLE)
            elif version == 1:
                for statement in _FROM_VERSION_1:
                    self._db.execute(statement)
            for statement in _INDEXES:
                self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._db.commit()
        except BaseException:
            self._db.rollback()
            raise
        # Committed at once: an open write would lock out every other replica's store.
        with self._db:
            self._expire(time.time())

    # --- writes -------------------------------------------------------------------------

    def put(self, record: EncodedRecord) -> Put:
        if record.size > self.max_bytes:
            log.warning("response %s not stored: %d bytes is over a key's store cap",
                        record.id, record.size)
            return Put.TOO_LARGE
        now = time.time()
        with self._lock, self._db:
            chain_bytes = len(record.turns)
            if record.parent is not None:
                row = self._db.execute(
                    "SELECT chain_bytes FROM responses WHERE id = ? AND tenant = ?",
                    (record.parent, record.tenant)).fetchone()
                if row is None:
                    return Put.PARENT_GONE
                chain_bytes += row[0]
            self._db.execute(
                f"INSERT OR REPLACE INTO responses ({_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (record.id, record.tenant, now, now, record.size, record.response,
                 record.turns, record.fingerprint, record.prompt_key, record.tokens,
                 record.parent, int(record.extends), chain_bytes))
            self._expire(now)
            self._evict(record.tenant)
            kept = self._db.execute("SELECT 1 FROM responses WHERE id = ?",
                                    (record.id,)).fetchone()
        return Put.STORED if kept is not None else Put.TOO_LARGE

    def delete(self, tenant: str, response_id: str) -> bool:
        with self._lock, self._db:
            if self._find(tenant, response_id, "1") is None:
                return False
            self._remove(response_id)
        return True

    # --- reads --------------------------------------------------------------------------

    def response(self, tenant: str, response_id: str) -> bytes | None:
        """The response object as answered (JSON); its use is recorded."""
        with self._lock, self._db:
            row = self._find(tenant, response_id, "response")
            if row is not None:
                self._touch(response_id)
        return None if row is None else _bytes(row[0])

    def chain(self, tenant: str, response_id: str, with_tokens: bool) -> ChainRead | None:
        """The rows of the response's conversation, root first; its use is recorded.
        ValueError where its parents do not lead to a root (a corrupt file)."""
        cutoff = time.time() - self.max_age_s
        tokens = ("tokens", "r.tokens") if with_tokens else ("NULL", "NULL")
        with self._lock, self._db:
            own = self._find(tenant, response_id, "fingerprint, prompt_key, chain_bytes")
            if own is None:
                return None
            rows = self._db.execute(
                _CHAIN.format(tokens=tokens[0], r_tokens=tokens[1]),
                (response_id, tenant, cutoff, tenant, _MAX_DEPTH)).fetchall()
            self._touch(response_id)
        if not rows or rows[0][0] is not None:
            raise ValueError(f"the stored response {response_id[:64]!r} has lost its "
                             "earlier turns")
        fingerprint, prompt_key, chain_bytes = own
        return ChainRead(response_id, tenant,
                         [ChainRow(turns, tokens_, bool(extends))
                          for _, turns, tokens_, extends in rows],
                         fingerprint, prompt_key, int(chain_bytes))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- inside a write -----------------------------------------------------------------

    def _find(self, tenant: str, response_id: str, columns: str) -> tuple[Any, ...] | None:
        return self._db.execute(
            f"SELECT {columns} FROM responses WHERE id = ? AND tenant = ? AND last_used >= ?",
            (response_id, tenant, time.time() - self.max_age_s)).fetchone()

    def _touch(self, response_id: str) -> None:
        self._db.execute("UPDATE responses SET last_used = ? WHERE id = ?",
                         (time.time(), response_id))

    def _remove(self, response_id: str) -> int:
        """Deletes the row, folded into its children first; the bytes this freed (less
        than its size where children took its turns)."""
        row = self._db.execute(
            "SELECT parent, size, turns, tokens, extends FROM responses WHERE id = ?",
            (response_id,)).fetchone()
        if row is None:
            return 0
        parent, size, turns, tokens, extends = row
        grown = 0
        children = self._db.execute(
            "SELECT id, size, turns, tokens, extends FROM responses WHERE parent = ?",
            (response_id,)).fetchall()
        for child, child_size, child_turns, child_tokens, child_extends in children:
            try:
                new_turns = joined_turns(turns, child_turns)
            except ValueError as exc:
                # A corrupt row: what continues it cannot be read whole either, and
                # would fail every fold of this tenant's rows from now on.
                log.error("response store: %s: %s and what continues it are deleted",
                          exc, response_id)
                return self._remove_below(response_id)
            new_tokens, new_extends = child_tokens, 0
            if child_extends:
                # Its tokens come after the row's: they go together, or not at all.
                new_tokens = None if tokens is None or child_tokens is None \
                    else _bytes(tokens) + _bytes(child_tokens)
                new_extends = extends if new_tokens is not None else 0
            new_size = (child_size + len(new_turns) - len(_bytes(child_turns))
                        + len(_bytes(new_tokens)) - len(_bytes(child_tokens)))
            self._db.execute(
                "UPDATE responses SET turns = ?, tokens = ?, extends = ?, parent = ?, "
                "size = ? WHERE id = ?",
                (new_turns, new_tokens, new_extends, parent, new_size, child))
            grown += new_size - child_size
        self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return int(size) - grown

    def _remove_below(self, response_id: str) -> int:
        """Deletes the row and every row that continues it; the bytes freed."""
        below = ("WITH RECURSIVE below(id) AS (SELECT ? UNION ALL SELECT r.id FROM "
                 "responses AS r JOIN below ON r.parent = below.id) ")
        freed = self._db.execute(below + "SELECT COALESCE(SUM(size), 0) FROM responses "
                                 "WHERE id IN below", (response_id,)).fetchone()[0]
        self._db.execute(below + "DELETE FROM responses WHERE id IN below", (response_id,))
        return int(freed)

    def _expire(self, now: float) -> None:
        # Newest first: a chain that expired whole goes leaf by leaf, nothing folded.
        doomed = self._db.execute(
            "SELECT id FROM responses WHERE last_used < ? ORDER BY created_at DESC",
            (now - self.max_age_s,)).fetchall()
        for (response_id,) in doomed:
            self._remove(response_id)

    def _evict(self, tenant: str) -> None:
        """The tenant's least recently used rows go until it is within its caps."""
        count, total = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses WHERE tenant = ?",
            (tenant,)).fetchone()
        while count > self.max_count or total > self.max_bytes:
            oldest = self._db.execute(
                "SELECT id FROM responses WHERE tenant = ? ORDER BY last_used, created_at "
                "LIMIT 32", (tenant,)).fetchall()
            if not oldest:
                return
            for (response_id,) in oldest:
                if count <= self.max_count and total <= self.max_bytes:
                    return
                total -= self._remove(response_id)
                count -= 1
