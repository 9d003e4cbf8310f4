"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}.

Every failure a client can see goes through here, so no response ever carries a
traceback or a file path.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..engine import EngineError, EngineOverloaded

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(param: str | None, message: str, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def unsupported(param: str, why: str = "is not supported by this server") -> APIError:
    return APIError(400, f"`{param}` {why}", param=param, code="unsupported_parameter")


def from_engine_error(exc: EngineError) -> APIError:
    if isinstance(exc, EngineOverloaded):
        return APIError(
            exc.status,
            str(exc),
            type="server_overloaded",
            code=exc.code,
            headers={"Retry-After": str(exc.retry_after)},
        )
    kind = "invalid_request_error" if exc.status == 400 else "server_error"
    return APIError(exc.status, str(exc), type=kind, code=exc.code)


_UNION_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


def _loc_to_param(loc: tuple[Any, ...]) -> str:
    """('messages', 0, 'role') -> 'messages[0].role'; drops pydantic's union-branch tags."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or part in _UNION_TAGS):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def from_validation_error(exc: ValidationError) -> APIError:
    first = exc.errors(include_url=False)[0]
    param = _loc_to_param(tuple(first.get("loc", ()))) or None
    message = first.get("msg", "invalid value")
    if param:
        message = f"Invalid value for `{param}`: {message}"
    code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_value"
    return APIError(400, message, param=param, code=code)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = "not found" if exc.status_code == 404 else str(exc.detail)
    return APIError(exc.status_code, message, type=kind, code=str(exc.status_code)).response()


def _internal_error() -> APIError:
    return APIError(500, "internal server error", type="server_error")


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return _internal_error().response()


class ErrorBoundary:
    """ASGI middleware: an unexpected exception becomes a 500 in the OpenAI shape and
    ends there. (Starlette's own last-resort handler re-raises after answering, and the
    server then drops the keep-alive connection, failing the client's next request.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log.exception("unhandled error", exc_info=exc)
            if started:
                # Half a response cannot be mended; returning lets the server close it.
                return
            await _internal_error().response()(scope, receive, send)


EXCEPTION_HANDLERS = {
    APIError: _api_error,
    HTTPException: _http_error,
    Exception: _unexpected,
}
