"""Cheap refusal: generation requests beyond what the engines can seat or queue are
refused before their body is read, parsed or validated.

The engine's own queue answers 429 too, but only after the request was read, parsed,
validated, rendered and tokenized: in a retry storm (150 clients retrying at once on a
429) that work took the two cores of a small box, and goodput fell to half. Here the
refusal is a counter comparison and a canned answer, so a storm costs little; the
engine's check stays behind it for what this count cannot see (`n`, several prompts).

A canned answer is still an HTTP exchange in Python: 150 clients retrying at once sent
21,000 a minute, and with the clients on the same two cores goodput fell to 27% of 8
clients'. So once refusals come faster than STORM_REFUSALS_PER_SECOND, each is held for
Retry-After before it is sent (the time a polite client would wait anyway): a client
that retries at once then retries once a second, and a held refusal costs a sleeping
coroutine, not CPU. At most MAX_HELD are held; beyond that they are answered at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from edge_server.api.http.errors import APIError
from edge_server.api.http.guards.hold import hold_of

# The doors that queue for a slot of a model's engine.
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses",
                              "/v1/messages", "/api/chat", "/api/generate", "/completions",
                              "/chat/completions", "/infill", "/completion"})
RETRY_AFTER_SECONDS = 1
STORM_REFUSALS_PER_SECOND = 20
MAX_HELD = 1024


class Admission:
    """Generation requests admitted whose engine work is not yet done, and how many
    were refused."""

    def __init__(self, capacity: Callable[[], int]) -> None:
        self.capacity = capacity  # slots plus queue places of the loaded engines
        self.admitted = 0
        self.refused = 0
        self.held = 0  # refusals being held (a storm)
        # When the latest refusals were made: a full window within a second is a storm.
        self._recent: deque[float] = deque(maxlen=STORM_REFUSALS_PER_SECOND)

    def leave(self) -> None:
        """An admitted request's place is free again."""
        self.admitted -= 1

    def refuse(self) -> float:
        """Counts a refusal; the seconds to hold it before answering."""
        self.refused += 1
        now = time.monotonic()
        recent = self._recent
        storm = len(recent) == recent.maxlen and now - recent[0] < 1.0
        recent.append(now)
        if storm and self.held < MAX_HELD:
            return float(RETRY_AFTER_SECONDS)
        return 0.0


def _refusal() -> APIError:
    return APIError(
        429, "Too many requests are waiting for this server; retry after `Retry-After` "
        "seconds.", type="server_overloaded", code="server_overloaded",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


class AdmissionGate:
    """ASGI middleware: a generation request beyond the capacity gets a 429 at once."""

    def __init__(self, app: ASGIApp, admission: Admission) -> None:
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST"
                or scope.get("path") not in GENERATION_PATHS):
            await self.app(scope, receive, send)
            return
        admission = self.admission
        if admission.admitted >= admission.capacity():
            hold = admission.refuse()
            if hold:
                admission.held += 1
                try:
                    await asyncio.sleep(hold)
                finally:
                    admission.held -= 1
            await _refusal().response()(scope, receive, send)
            return
        # The place is part of the request's hold: freed once the engine is done with
        # the request (hold.py), not when a slow client has read the answer.
        admission.admitted += 1
        request_hold = hold_of(scope)
        request_hold.add(admission.leave)
        try:
            await self.app(scope, receive, send)
        finally:
            request_hold.release()
