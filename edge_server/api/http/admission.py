"""Cheap refusal: generation requests beyond what the engines can seat or queue are
refused before their body is read, parsed or validated.

The engine's own queue answers 429 too, but only after the request was read, parsed,
validated, rendered and tokenized: in a retry storm (150 clients retrying at once on a
429) that work took the two cores of a small box, and goodput fell to half. Here the
refusal is a counter comparison and a canned answer, so a storm costs little; the
engine's check stays behind it for what this count cannot see (`n`, several prompts).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError

# The doors that queue for a slot of a model's engine.
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses",
                              "/v1/messages", "/api/chat", "/api/generate", "/completions",
                              "/chat/completions", "/infill"})
RETRY_AFTER_SECONDS = 1


class Admission:
    """Generation requests admitted and not yet answered, and how many were refused."""

    def __init__(self, capacity: Callable[[], int]) -> None:
        self.capacity = capacity  # slots plus queue places of the loaded engines
        self.admitted = 0
        self.refused = 0


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
            admission.refused += 1
            await _refusal().response()(scope, receive, send)
            return
        admission.admitted += 1
        try:
            await self.app(scope, receive, send)
        finally:
            admission.admitted -= 1
