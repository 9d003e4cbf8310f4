"""What every route needs before it serves: a parsed body and a lease on its model."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..engine import Engine
from ..model_pool import Lease, ModelPool, ModelUnavailable, UnknownModel
from .errors import APIError, from_validation_error, read_json_object

log = logging.getLogger(__name__)

RequestModel = TypeVar("RequestModel", bound=BaseModel)


async def parse_body(request: Request, model: type[RequestModel]) -> RequestModel:
    body = await read_json_object(request)
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from exc
    if parsed.model_extra:
        # OpenAI ignores fields it does not know; we do too, but say so in the log.
        log.info("ignored unknown fields on %s: %s", request.url.path, sorted(parsed.model_extra))
    return parsed


def pool(request: Request) -> ModelPool:
    return request.app.state.pool  # type: ignore[no-any-return]


async def acquire(request: Request, model: str) -> Lease:
    try:
        return await pool(request).acquire(model)
    except UnknownModel as exc:
        raise APIError(
            404,
            f"The model `{model}` does not exist on this server.",
            type="not_found_error",
            param="model",
            code="model_not_found",
        ) from exc
    except ModelUnavailable as exc:
        raise APIError(
            503, str(exc), type="server_error", code="model_unavailable",
            headers={"Retry-After": "5"},
        ) from exc


async def serve_with_model(
    request: Request, model: str, serve: Callable[[Engine], Awaitable[Response]]
) -> Response:
    """Runs `serve` with the model's engine, holding the lease until the response (a
    stream included) is finished."""
    lease = await acquire(request, model)
    try:
        response = await serve(lease.engine)
    except BaseException:
        lease.release()
        raise
    if isinstance(response, StreamingResponse):
        response.body_iterator = _released_after(response.body_iterator, lease)
    else:
        lease.release()
    return response


async def _released_after(body: AsyncIterator[str | bytes], lease: Lease) -> AsyncIterator[
        str | bytes]:
    try:
        async for chunk in body:
            yield chunk
    finally:
        lease.release()
