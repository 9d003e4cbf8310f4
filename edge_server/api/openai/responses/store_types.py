"""What the Responses store keeps and answers, apart from how (store.py, store_db.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class StoreError(Exception):
    """The store's file cannot be opened or used, or a row of it cannot be read (said
    without the file's path)."""


@dataclass
class Continuation:
    """What a follow-up turn needs to continue this response's tokens instead of
    evaluating the conversation again (see continuation.py)."""

    fingerprint: str  # the engine's: tokens of another model or build are never reused
    key: str  # digest of the prompt as rendered with earlier outputs as markers
    tokens: list[int]  # prompt plus generated tokens


@dataclass
class StoredResponse:
    """A stored response's conversation, as a follow-up turn or input_items reads it."""

    id: str
    tenant: str
    # One turn per response of the chain: {"id": response id, "input": [items],
    # "output": [items]}, oldest first, this response's last.
    turns: list[dict[str, Any]]
    continuation: Continuation | None = None
    # Bytes of the stored conversation (its turns' JSON): what the chain bound counts.
    chain_bytes: int = 0


@dataclass
class ResponseRecord:
    """A response to store: its object as answered, its own turn, and the stored
    response it continues (whose turns it does not copy: the store links to them)."""

    id: str
    tenant: str
    response: dict[str, Any]
    turn: dict[str, Any]
    previous: StoredResponse | None = None
    continuation: Continuation | None = None
