"""HTTP routes of /v1/responses: create, count input tokens, compact, and (with a store)
retrieve, delete and list the input items of stored responses."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_server.api.common.image_input.image_fetch import fetch_image_urls, fetched_images
from edge_server.api.http.dependencies import leased_model, off_loop, parse_body
from edge_server.api.http.errors import APIError, from_validation_error, invalid
from edge_server.api.http.guards.auth import tenant_of
from edge_server.api.openai.responses.compact_serving import check_compact_fields, compact
from edge_server.api.openai.responses.items import input_items, page
from edge_server.api.openai.responses.protocol import ITEM_TAGS, ResponsesRequest
from edge_server.api.openai.responses.serving import ResponsesServing, check_fields
from edge_server.api.openai.responses.store import ResponseStore, StoredResponse, StoreError
from edge_server.api.openai.responses.store_codec import dumps

_serving = ResponsesServing()
_MAX_PAGE = 100


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


def _store(request: Request) -> ResponseStore | None:
    return getattr(request.app.state, "responses", None)


def _not_found(response_id: str, param: str | None = None) -> APIError:
    # The same answer for an id that never was, was deleted, expired, or is another key's.
    return APIError(404, f"Response with id '{response_id[:128]}' not found.", param=param,
                    code="not_found")


async def _conversation(request: Request, response_id: str, param: str | None = None,
                        *, with_tokens: bool = True) -> StoredResponse:
    store = _store(request)
    try:
        found = await store.conversation(tenant_of(request), response_id,
                                         with_tokens=with_tokens) if store else None
    except StoreError as exc:
        raise _unavailable() from exc
    if found is None:
        raise _not_found(response_id, param)
    return found


def _unavailable() -> APIError:
    return APIError(503, "The response store is unavailable; try again later.",
                    type="server_error", code="store_unavailable")


async def _turn(request: Request) -> tuple[ResponsesRequest, StoredResponse | None]:
    """The body, checked before a model is leased (or loaded) for a request it cannot
    serve, and the stored response its previous_response_id continues."""
    body = await parse_body(request, ResponsesRequest, on_invalid=_named)
    check_fields(body, stateful=_store(request) is not None)
    previous = None
    if body.previous_response_id is not None:
        previous = await _conversation(request, body.previous_response_id,
                                       "previous_response_id")
    return body, previous


async def create_response(request: Request) -> Response:
    body, previous = await _turn(request)
    store = _store(request)
    keep_in = store if body.store is not False else None  # OpenAI stores by default
    # A stored turn's http(s) image URLs are fetched again with the new input's: the
    # conversation is rendered whole, images and all, on every turn that has them.
    stored = previous.turns if previous is not None else None
    async with leased_model(request, body.model) as lease:
        with fetched_images(await fetch_image_urls(body, lease.engine, also=stored)):
            answer = await _serving.create(body, lease.engine, request, previous=previous,
                                           store=keep_in)
        return lease.answer(answer)


async def count_input_tokens(request: Request) -> Response:
    body, previous = await _turn(request)
    stored = previous.turns if previous is not None else None
    async with leased_model(request, body.model) as lease:
        with fetched_images(await fetch_image_urls(body, lease.engine, also=stored)):
            answer = await _serving.input_tokens(body, lease.engine, previous=previous)
        return lease.answer(answer)


async def compact_conversation(request: Request) -> Response:
    body = await parse_body(request, ResponsesRequest, on_invalid=_named)
    check_fields(body, stateful=_store(request) is not None)
    check_compact_fields(body)
    previous = None
    if body.previous_response_id is not None:
        previous = await _conversation(request, body.previous_response_id,
                                       "previous_response_id")
    stored = previous.turns if previous is not None else None
    async with leased_model(request, body.model) as lease:
        with fetched_images(await fetch_image_urls(body, lease.engine, also=stored)):
            answer = await compact(body, lease.engine, request, previous)
        return lease.answer(answer)


async def retrieve_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    store = _store(request)
    try:
        found = await store.response_json(tenant_of(request), response_id) if store else None
    except StoreError as exc:
        raise _unavailable() from exc
    if found is None:
        raise _not_found(response_id)
    # As stored: the JSON is never parsed nor built again on the event loop.
    return Response(found, media_type="application/json")


async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    store = _store(request)
    try:
        deleted = await store.delete(tenant_of(request), response_id) if store else False
    except StoreError as exc:
        raise _unavailable() from exc
    if not deleted:
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


async def list_input_items(request: Request) -> Response:
    query = request.query_params
    limit_text = query.get("limit", "20")
    if not (limit_text.isascii() and limit_text.isdigit() and len(limit_text) <= 3
            and 1 <= int(limit_text) <= _MAX_PAGE):
        raise invalid("limit", f"limit must be an integer from 1 to {_MAX_PAGE}")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", "order must be `asc` or `desc`")
    found = await _conversation(request, request.path_params["response_id"],
                                with_tokens=False)
    ordering: Literal["asc", "desc"] = "asc" if order == "asc" else "desc"
    # A long conversation's page is picked and written on a worker thread.
    body = await off_loop(_page_json, found.turns, query.get("after"), int(limit_text),
                          ordering)
    return Response(body, media_type="application/json")


def _page_json(turns: list[dict[str, Any]], after: str | None, limit: int,
               order: Literal["asc", "desc"]) -> bytes:
    return dumps(page(input_items(turns), after=after, limit=limit, order=order))


routes = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/input_tokens", count_input_tokens, methods=["POST"]),
    Route("/v1/responses/compact", compact_conversation, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
]
