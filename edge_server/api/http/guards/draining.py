"""Draining: after SIGTERM a replica finishes what it serves and takes nothing new.

/health answers 503 so that a load balancer's checks mark the replica down; requests
that still arrive before it does get a 503 with Retry-After (HAProxy retries them on
another replica); the server stops once nothing is in flight.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from edge_server.api.http.errors import APIError

# Probes and scrapes are answered while draining: they are how the drain is watched.
_EXEMPT_PATHS = frozenset({"/health", "/metrics"})


class Drain:
    """Whether the server drains, and how many requests it still serves."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self.refused = 0

    def start(self) -> None:
        self.draining = True

    async def wait_idle(self, timeout: float) -> bool:
        """True once no request is in flight; False if `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.in_flight == 0


def _refusal() -> APIError:
    return APIError(
        503, "This server is shutting down; retry the request (another replica serves it).",
        type="server_error", code="draining",
        # Closing the connection makes a pooling proxy open its next one elsewhere.
        headers={"Retry-After": "1", "Connection": "close"},
    )


class DrainGate:
    """ASGI middleware: counts requests in flight; refuses new ones while draining."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in _EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            self.drain.refused += 1
            await _refusal().response()(scope, receive, send)
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1
