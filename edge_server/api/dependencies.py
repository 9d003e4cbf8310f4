"""What every route needs before it serves: a parsed body and the engine of its model."""

from __future__ import annotations

import logging
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from ..engine import Engine
from ..model_registry import ModelNotReady, ModelRegistry, UnknownModel
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


def registry(request: Request) -> ModelRegistry:
    return request.app.state.registry  # type: ignore[no-any-return]


def engine_for(request: Request, model: str) -> Engine:
    try:
        return registry(request).get(model)
    except UnknownModel as exc:
        raise APIError(
            404,
            f"The model `{model}` does not exist on this server.",
            type="not_found_error",
            param="model",
            code="model_not_found",
        ) from exc
    except ModelNotReady as exc:
        raise APIError(
            503,
            f"The model `{model}` is still loading; retry shortly.",
            type="server_error",
            code="model_loading",
            headers={"Retry-After": "2"},
        ) from exc
