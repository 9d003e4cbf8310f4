"""One request's hold on the server's capacity: its admission place (admission.py) and
its model lease (dependencies.py), released together once the engine is done with the
request, not once its last byte is sent.

A client that stops reading a long stream must not keep a slot's admission place or
keep its model from unloading: all the engine made for it is already buffered (an
answer built whole, or a stream read ahead, read_ahead.py), and what is left is a
connection that --send-timeout closes.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import Scope

# Where the hold lives in the request's ASGI scope (middleware and route share it).
SCOPE_KEY = "edge_server.hold"


class RequestHold:
    """What a request holds, each part released once however often release() is called
    (when the engine is done, and again when the response ends)."""

    def __init__(self) -> None:
        self._parts: list[Callable[[], None]] = []

    def add(self, release: Callable[[], None]) -> None:
        self._parts.append(release)

    def release(self) -> None:
        parts, self._parts = self._parts, []
        for release in reversed(parts):
            release()


def hold_of(scope: Scope) -> RequestHold:
    """The request's hold, made on first use."""
    hold: RequestHold | None = scope.get(SCOPE_KEY)
    if hold is None:
        hold = scope[SCOPE_KEY] = RequestHold()
    return hold
