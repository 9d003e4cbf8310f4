"""Prompts that outgrow the context, cut to fit where the request or the server asks for
it (off by default: such a prompt is a 400, `context_length_exceeded`).

One rule for every door: a chat loses its oldest whole turns, a turn being a user
message and the answers, tool calls and tool results after it; system (and developer)
messages and the latest turn always stay. A raw prompt keeps its first `n_keep` tokens
and its tail. Cutting leaves room for the answer (`answer_reserve`), and what was
dropped is said in the response's headers (X-Truncated-Messages, X-Truncated-Tokens).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from starlette.responses import Response

from edge_server.api.http.errors import APIError
from edge_server.engine import Engine

log = logging.getLogger(__name__)

# The server's --truncation values: "disabled" refuses a prompt that does not fit,
# "auto" cuts it as above (OpenAI's Responses API spells its field so).
MODES = ("disabled", "auto")
_KEPT_ROLES = ("system", "developer")


class _Message(Protocol):
    @property
    def role(self) -> str: ...


class _Prompt(Protocol):
    @property
    def tokens(self) -> list[int]: ...


M = TypeVar("M", bound=_Message)
P = TypeVar("P", bound=_Prompt)


@dataclass(frozen=True)
class Truncated:
    """What a prompt lost to fit the context."""

    messages: int = 0  # whole messages dropped (chat)
    tokens: int = 0  # prompt tokens dropped (raw prompts)

    def __bool__(self) -> bool:
        return bool(self.messages or self.tokens)

    def apply(self, response: Response) -> Response:
        """The counts as response headers (streamed responses too: headers go first)."""
        if self.messages:
            response.headers["X-Truncated-Messages"] = str(self.messages)
        if self.tokens:
            response.headers["X-Truncated-Tokens"] = str(self.tokens)
        return response


def wanted(request_value: bool | None, engine: Engine) -> bool:
    """Whether to cut: the request's own choice, else the server's --truncation."""
    if request_value is not None:
        return request_value
    return engine.settings.truncation == "auto"


def answer_reserve(n_ctx: int, max_tokens: int | None) -> int:
    """Room a cut prompt leaves for the answer: what the request asked for, else a
    quarter of the context; never more than half of it, never none."""
    wanted_room = max_tokens if max_tokens is not None and max_tokens > 0 else n_ctx // 4
    return max(1, min(wanted_room, n_ctx // 2))


def _turn_starts(messages: Sequence[_Message]) -> list[int]:
    """Where each turn begins: the first message that is not a system one, then each
    user message after it. All but the last may be dropped."""
    first = next((i for i, m in enumerate(messages) if m.role not in _KEPT_ROLES), None)
    if first is None:
        return []
    return [first] + [i for i, m in enumerate(messages) if m.role == "user" and i > first]


def _without_turns(messages: Sequence[M], starts: list[int], k: int) -> list[M]:
    """`messages` less their first `k` turns (system messages stay where they were)."""
    cut = range(starts[0], starts[k]) if k else range(0)
    return [m for i, m in enumerate(messages) if i not in cut or m.role in _KEPT_ROLES]


def fit_messages(messages: Sequence[M], budget: int,
                 build: Callable[[list[M]], P]) -> tuple[P, Truncated]:
    """The prompt `build` makes of the fewest oldest turns dropped that leaves it within
    `budget` tokens. Prompts that cannot fit stay as they were past dropping every turn
    but the last: building them again raises the door's usual 400."""
    def attempt(k: int) -> P | None:
        try:
            prompt = build(_without_turns(messages, starts, k))
        except APIError as exc:
            if exc.code != "context_length_exceeded":
                raise
            return None
        return prompt if len(prompt.tokens) <= budget else None

    starts = _turn_starts(messages)
    whole = attempt(0)
    if whole is not None or len(starts) < 2:
        return whole if whole is not None else build(list(messages)), Truncated()
    # Fewer tokens with each turn dropped: the least k that fits, by bisection.
    low, high = 1, len(starts) - 1
    best: tuple[int, P] | None = None
    while low <= high:
        mid = (low + high) // 2
        prompt = attempt(mid)
        if prompt is not None:
            best, high = (mid, prompt), mid - 1
        else:
            low = mid + 1
    if best is None:
        return build(list(messages)), Truncated()  # its own 400
    k, prompt = best
    dropped = len(messages) - len(_without_turns(messages, starts, k))
    log.info("prompt cut to fit the context: %d oldest messages dropped", dropped)
    return prompt, Truncated(messages=dropped)


def fit_tokens(tokens: list[int], budget: int, n_keep: int) -> tuple[list[int], Truncated]:
    """A raw prompt within `budget` tokens: its first `n_keep` and its tail (as
    llama-server's n_keep); unchanged where it fits or where the head alone fills it."""
    if len(tokens) <= budget or n_keep < 0 or n_keep >= budget:
        return tokens, Truncated()
    tail = budget - n_keep
    dropped = len(tokens) - budget
    log.info("prompt cut to fit the context: %d tokens dropped after the first %d",
             dropped, n_keep)
    return tokens[:n_keep] + tokens[len(tokens) - tail:], Truncated(tokens=dropped)
