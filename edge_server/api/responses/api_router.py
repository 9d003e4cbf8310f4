"""HTTP route of /v1/responses."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..common.image_fetch import with_image_urls
from ..http.dependencies import parse_body, serve_with_model
from ..http.errors import APIError, from_validation_error
from .protocol import ITEM_TAGS, ResponsesRequest
from .serving import ResponsesServing, check_fields

_serving = ResponsesServing()
def _named(exc: ValidationError) -> APIError:
    """The error of the deepest field: `input` is a string or a list of items, and the
    list's error is the one that names what is wrong. An item's own kind (the tag that
    picked its schema) is no part of the field's name."""
    errors = exc.errors(include_url=False)
    deepest = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = deepest.get("loc", ())
    kept = tuple(
        part for k, part in enumerate(loc)
        if not (part in ITEM_TAGS and k >= 2 and loc[0] == "input" and isinstance(loc[k - 1], int))
    )
    found: dict[str, Any] = dict(deepest)
    error = {key: found[key] for key in ("type", "input", "ctx") if key in found}
    line_errors: list[Any] = [{**error, "loc": kept}]
    single = ValidationError.from_exception_data(exc.title, line_errors)
    return from_validation_error(single)


async def create_response(request: Request) -> Response:
    body = await parse_body(request, ResponsesRequest, on_invalid=_named)
    check_fields(body)  # before a model is leased (or loaded) for a request it cannot serve
    return await serve_with_model(
        request, body.model, lambda engine: with_image_urls(
            body, engine, lambda: _serving.create(body, engine, request))
    )


routes = [Route("/v1/responses", create_response, methods=["POST"])]
