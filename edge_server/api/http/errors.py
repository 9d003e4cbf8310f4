"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}.

Every failure a client can see goes through here, so no response ever carries a
traceback or a file path.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge_server.engine import EngineError, EngineOverloaded

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error body; also the schema /openapi.json gives for error answers."""

    error: ErrorDetail


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
        # A plain dict: making an error answer must never raise (ErrorResponse is the
        # schema of this shape, checked against real answers by the tests).
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


def model_not_found(name: str) -> APIError:
    # OpenAI's answer for an unknown model: 404, invalid_request_error, model_not_found.
    return APIError(404, f"The model `{name[:256]}` does not exist on this server.",
                    param="model", code="model_not_found")


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
    # llama.cpp refusing a grammar: generated grammars always parse, so it was `grammar`;
    # a model refusing the kind of work asked of it (a reranker asked to generate).
    param = {"invalid_grammar": "grammar", "model_not_supported": "model"}.get(exc.code)
    return APIError(exc.status, str(exc), type=kind, code=exc.code, param=param)


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


def served_routes(routes: list[BaseRoute]) -> list[tuple[str, str]]:
    """(method, path template) of every route, in the order they are registered; HEAD
    goes without saying where GET is served."""
    return [
        (method, route.path_format)
        for route in routes if isinstance(route, Route)
        for method in sorted(route.methods or ()) if method != "HEAD"
    ]


def _shown(path: str) -> str:
    # The path is the client's own text; cut so a huge one does not bloat the answer.
    return path if len(path) <= 200 else path[:200] + "…"


def _unknown_route(request: Request) -> APIError:
    served = ", ".join(f"{m} {p}" for m, p in served_routes(request.app.routes))
    return APIError(
        404,
        f"Unknown route {request.method} {_shown(request.url.path)}. This server serves: "
        f"{served} (see /openapi.json).",
        code="unknown_url",
    )


def _wrong_method(request: Request) -> APIError:
    path = request.url.path
    allowed = sorted({
        method for route in request.app.routes
        if isinstance(route, Route) and route.path_regex.match(path)
        for method in route.methods or ()
    })
    shown = " or ".join(m for m in allowed if m != "HEAD")
    return APIError(
        405,
        f"Method {request.method} is not allowed on {_shown(path)}; it answers {shown}.",
        code="method_not_allowed",
        headers={"Allow": ", ".join(allowed)},
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return _unknown_route(request).response()
    if exc.status_code == 405:
        return _wrong_method(request).response()
    return APIError(exc.status_code, str(exc.detail), code=str(exc.status_code),
                    headers=dict(exc.headers) if exc.headers else None).response()


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
