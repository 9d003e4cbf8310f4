"""What every route needs before it serves: a parsed body, a lease on its model, and a
place off the event loop for CPU-heavy preparation."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread
from pydantic import BaseModel, RootModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from edge_server.api.http.body import parse_json, parse_json_object
from edge_server.api.http.errors import APIError, from_validation_error, model_not_found
from edge_server.api.http.guards.auth import require_admin, role_of
from edge_server.api.http.guards.hold import RequestHold, hold_of
from edge_server.api.http.read_ahead import ReadAheadStream
from edge_server.catalogue.pool import Lease, ModelPool, ModelUnavailable
from edge_server.catalogue.spec import UnknownModel
from edge_server.engine import Engine
from edge_server.engine.multimodal.image_scope import images_scope

log = logging.getLogger(__name__)

RequestModel = TypeVar("RequestModel", bound=BaseModel)
Params = ParamSpec("Params")
Result = TypeVar("Result")

# Bodies this small parse in well under a millisecond: not worth a thread hop.
_INLINE_BODY_BYTES = 64 * 1024
_PREPARE_THREADS = max(2, min(8, os.cpu_count() or 2))
_limiter: anyio.CapacityLimiter | None = None


async def off_loop(
    fn: Callable[Params, Result], *args: Params.args, **kwargs: Params.kwargs
) -> Result:
    """Runs CPU-heavy request preparation (parsing, template rendering, tokenizing,
    grammar building) on a worker thread, so one huge request cannot stall every stream
    the event loop serves. A few at a time: the rest wait their turn."""
    global _limiter
    if _limiter is None:
        _limiter = anyio.CapacityLimiter(_PREPARE_THREADS)
    return await anyio.to_thread.run_sync(
        functools.partial(fn, *args, **kwargs), limiter=_limiter
    )


InvalidBody = Callable[[ValidationError], APIError]


def _validated(raw: bytes, model: type[RequestModel], on_invalid: InvalidBody) -> RequestModel:
    # A RootModel's body is what its root says (an array); every other body an object.
    body = parse_json(raw) if issubclass(model, RootModel) else parse_json_object(raw)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise on_invalid(exc) from exc


async def parse_body(request: Request, model: type[RequestModel],
                     on_invalid: InvalidBody = from_validation_error) -> RequestModel:
    """The body parsed and validated (off the event loop when large); `on_invalid` turns
    a validation error into the 400 a door answers with."""
    raw = await request.body()
    if len(raw) <= _INLINE_BODY_BYTES:
        parsed = _validated(raw, model, on_invalid)
    else:
        parsed = await off_loop(_validated, raw, model, on_invalid)
    if parsed.model_extra:
        # OpenAI ignores fields it does not know; we do too, but say so in the log.
        log.info("ignored unknown fields on %s: %s", request.url.path, sorted(parsed.model_extra))
    return parsed


def pool(request: Request) -> ModelPool:
    return request.app.state.pool


async def acquire(request: Request, model: str) -> Lease:
    try:
        return await pool(request).acquire(model)
    except UnknownModel as exc:
        raise model_not_found(model) from exc
    except ModelUnavailable as exc:
        raise APIError(
            503, str(exc), type="server_error", code="model_unavailable",
            headers={"Retry-After": str(max(1, exc.retry_after))},
        ) from exc


class ModelLease:
    """A request's lease on its model's engine, inside `leased_model`."""

    def __init__(self, engine: Engine, hold: RequestHold) -> None:
        self.engine = engine
        self._hold = hold
        self.answered = False

    def answer(self, response: Response) -> Response:
        """The route's answer, holding the model until the engine is done with it: at
        once for an answer built whole; for a stream, once its events are all read ahead
        (read_ahead.py), and however sending ends, for a client that vanished first."""
        self.answered = True
        if not isinstance(response, ReadAheadStream):
            self._hold.release()
            return response
        response.when_read(self._hold.release)
        return _HeldResponse(response, self._hold)  # type: ignore[return-value]


@asynccontextmanager
async def leased_model(request: Request, model: str) -> AsyncIterator[ModelLease]:
    """The model's engine for the block, loading it on first use. The lease joins the
    request's hold, released when the block fails or once its answer (ModelLease.answer)
    no longer needs the engine: a lease is never kept."""
    lease = await acquire(request, model)
    hold = hold_of(request.scope)
    hold.add(lease.release)
    leased = ModelLease(lease.engine, hold)
    try:
        # Images prepared for the request and not handed to the engine (a 400 after
        # preparation, a full queue, a client gone) are freed here, not by a later GC.
        with images_scope():
            yield leased
    except BaseException:
        hold.release()
        raise
    if not leased.answered:
        hold.release()


async def serve_with_model(
    request: Request, model: str, serve: Callable[[Engine], Awaitable[Response]]
) -> Response:
    """`serve(engine)`'s answer, within `leased_model`."""
    async with leased_model(request, model) as lease:
        return lease.answer(await serve(lease.engine))


async def serve_on_get(request: Request, model: str,
                       serve: Callable[[Engine], Awaitable[Response]]) -> Response:
    """`serve_with_model` for a GET (/props, /slots), which never loads a model other
    than the default one (any web page can make a browser send a GET): one not loaded
    answers 409 `model_not_loaded`, or is loaded for an admin key (where keys are set);
    an ordinary key gets a 403 for it."""
    models = pool(request)
    try:
        spec = models.spec(model)
    except UnknownModel as exc:
        raise model_not_found(model) from exc
    if spec.id == models.default_id or role_of(request) == "admin":
        return await serve_with_model(request, model, serve)
    lease = models.lease_if_loaded(model)
    if lease is None:
        require_admin(request, "loading a model by a GET")
        raise APIError(409, f"model `{spec.id}` is not loaded, and a GET does not load it: "
                       "send it a request (POST) first", param="model",
                       code="model_not_loaded")
    try:
        return await serve(lease.engine)
    finally:
        lease.release()


class _HeldResponse:
    """The stream as an ASGI app that releases the request's hold however sending ends
    (a stream whose client vanished before its first byte included)."""

    def __init__(self, inner: Response, hold: RequestHold) -> None:
        self.inner = inner
        self.hold = hold

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            self.hold.release()
