"""The errors the engine reports to its callers; `status` suggests the HTTP answer.

Below every other engine module, so that any of them may raise these.
"""

from __future__ import annotations


class EngineError(RuntimeError):
    """A request the engine could not serve; `status` suggests the HTTP answer."""

    def __init__(self, message: str, *, status: int = 503, code: str = "engine_error") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class EngineOverloaded(EngineError):
    """Too much work queued: 429 when refused at the door, 503 after waiting too long."""

    def __init__(self, message: str, retry_after: int = 1, status: int = 429) -> None:
        super().__init__(message, status=status, code="server_overloaded")
        self.retry_after = retry_after


class EngineCancelled(EngineError):
    """The request was cancelled (its client left): what ends its handle's stream."""

    def __init__(self) -> None:
        super().__init__("the request was cancelled", status=499, code="request_cancelled")
