"""Stored Responses as the store's file holds them, and back: JSON bytes and token blobs.

These run on a preparation thread, never on the store's own thread (which only moves
bytes in and out of SQLite) nor on the event loop: a large conversation parses without
holding up any other tenant's store call.

A chained record holds only its own turn and names its parent (the response it
continues); its tokens, where they extend the parent's (a continued turn, see
continuation.py), are only those past the parent's. A chain is read back root first.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edge_server.api.openai.responses.store_types import (
    Continuation,
    ResponseRecord,
    StoredResponse,
)

_TOKEN = array("i").itemsize  # 4: every token id of llama.cpp is an int32


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass
class EncodedRecord:
    """A record as one row of the store."""

    id: str
    tenant: str
    parent: str | None  # None: the record holds its whole conversation
    response: bytes  # the response object as answered (JSON)
    turns: bytes  # JSON array of the turns this row adds to its parent's
    fingerprint: str | None
    prompt_key: str | None
    tokens: bytes | None  # int32 ids: all of them, or those past the parent's (`extends`)
    extends: bool

    @property
    def size(self) -> int:
        return len(self.response) + len(self.turns) + len(self.tokens or b"")


def encode(record: ResponseRecord, *, whole: bool = False) -> EncodedRecord:
    """`whole`: the record holds the whole conversation (its parent is gone), else only
    its own turn below its parent."""
    previous = record.previous
    chained = previous is not None and not whole
    turns = [record.turn] if chained or previous is None else [*previous.turns, record.turn]
    cont = record.continuation
    tokens, extends = None, False
    if cont is not None:
        ids = cont.tokens
        before = previous.continuation if chained and previous is not None else None
        if (before is not None and before.fingerprint == cont.fingerprint
                and len(ids) >= len(before.tokens) and ids[:len(before.tokens)] == before.tokens):
            ids, extends = ids[len(before.tokens):], True
        tokens = array("i", ids).tobytes()
    return EncodedRecord(
        record.id, record.tenant, previous.id if chained and previous is not None else None,
        dumps(record.response), dumps(turns), cont.fingerprint if cont else None,
        cont.key if cont else None, tokens, extends)


@dataclass
class ChainRow:
    """One row of a chain as the store reads it."""

    turns: bytes | str  # str: a row written before the store kept bytes
    tokens: bytes | None
    extends: bool


@dataclass
class ChainRead:
    """A stored response's chain, root first, with the newest row's own fields."""

    id: str
    tenant: str
    rows: Sequence[ChainRow]
    fingerprint: str | None
    prompt_key: str | None
    chain_bytes: int


def decode(chain: ChainRead, *, with_tokens: bool = True) -> StoredResponse:
    """The conversation a chain holds; ValueError where a row is not one this store
    wrote (a corrupt file)."""
    turns: list[dict[str, Any]] = []
    for row in chain.rows:
        part = json.loads(row.turns)
        if not isinstance(part, list) or not all(_is_turn(t) for t in part):
            raise ValueError(f"the stored response {chain.id[:64]!r} holds no turns")
        turns += part
    if not turns:
        raise ValueError(f"the stored response {chain.id[:64]!r} holds no turns")
    cont = None
    if with_tokens and chain.fingerprint is not None and chain.prompt_key is not None:
        blob = _tokens(chain.rows)
        if blob is not None:
            if len(blob) % _TOKEN:
                raise ValueError(f"the stored tokens of {chain.id[:64]!r} are cut short")
            ids = array("i")
            ids.frombytes(blob)
            cont = Continuation(chain.fingerprint, chain.prompt_key, ids.tolist())
    return StoredResponse(chain.id, chain.tenant, turns, cont, chain.chain_bytes)


def _is_turn(turn: Any) -> bool:
    return (isinstance(turn, dict) and isinstance(turn.get("id"), str)
            and isinstance(turn.get("input"), list) and isinstance(turn.get("output"), list))


def _tokens(rows: Sequence[ChainRow]) -> bytes | None:
    """The newest row's tokens: its own, after those of the rows it extends."""
    parts: list[bytes] = []
    for row in reversed(rows):
        if row.tokens is None:
            return None
        parts.append(row.tokens)
        if not row.extends:
            return b"".join(reversed(parts))
    return None  # the root extends nothing: a row that says so is not this store's


def joined_turns(first: bytes | str, then: bytes | str) -> bytes:
    """Two rows' turn arrays as one (a parent folded into its child), without parsing
    either: both are JSON arrays this store wrote."""
    a = first.encode() if isinstance(first, str) else first
    b = then.encode() if isinstance(then, str) else then
    if not (a.startswith(b"[") and a.endswith(b"]") and b.startswith(b"[")
            and b.endswith(b"]")):
        raise ValueError("a stored row's turns are not a JSON array")
    if a == b"[]":
        return b
    if b == b"[]":
        return a
    return a[:-1] + b"," + b[1:]
