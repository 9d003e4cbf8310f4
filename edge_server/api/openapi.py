"""GET /openapi.json: an OpenAPI 3.1 document of every route the app serves.

The paths come from the app's own routes and the schemas from the pydantic models that
parse the requests and build the responses, so the document cannot drift from the
server: a new request field appears by itself, and a route with no entry below is left
out of the document (and fails the test that compares it with the routes).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from edge_server import __version__
from edge_server.api.anthropic.messages.protocol import (
    AnthropicErrorResponse,
    CountTokensRequest,
    CountTokensResponse,
    MessagesRequest,
    MessagesResponse,
)
from edge_server.api.http.errors import ErrorResponse
from edge_server.api.llama_server.completion.protocol import NativeCompletionRequest, NativeResult
from edge_server.api.llama_server.infill.protocol import InfillRequest, InfillResponse
from edge_server.api.llama_server.lora_adapters import LoraAdapterList, LoraApplied, LoraScales
from edge_server.api.llama_server.props import PropsResponse
from edge_server.api.llama_server.rerank.protocol import RerankRequest, RerankResponse
from edge_server.api.llama_server.slots import SlotList
from edge_server.api.llama_server.tokenize import (
    ApplyTemplateRequest,
    ApplyTemplateResponse,
    DetokenizeRequest,
    TokenizeRequest,
)
from edge_server.api.ollama import protocol as ollama
from edge_server.api.openai.audio.protocol import Transcription, TranscriptionRequest
from edge_server.api.openai.chat.protocol import ChatCompletionRequest, ChatCompletionResponse
from edge_server.api.openai.completions.protocol import CompletionRequest, CompletionResponse
from edge_server.api.openai.embeddings.protocol import EmbeddingRequest, EmbeddingResponse
from edge_server.api.openai.models import HealthResponse, ModelCard, ModelList
from edge_server.api.openai.responses.protocol import (
    CompactedResponse,
    DeletedResponse,
    InputItemList,
    InputTokens,
    ResponseObject,
    ResponsesRequest,
)
from edge_server.api.unprefixed import UNPREFIXED_PATHS, without_v1

log = logging.getLogger(__name__)

OPENAPI_PATH = "/openapi.json"
_REF = "#/components/schemas/{model}"


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int]  # text, or the bytes of a token holding part of a character


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[TokenPiece]  # pieces with `with_pieces: true`


class DetokenizeResponse(BaseModel):
    content: str


@dataclass(frozen=True)
class Operation:
    id: str
    summary: str
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None  # None: `media_type` text
    media_type: str = "application/json"
    request_type: str = "application/json"  # the body's media type
    streams: bool = False  # `stream: true` answers server-sent events
    errors: tuple[int, ...] = ()
    open: bool = False  # served without an API key
    error: type[BaseModel] = ErrorResponse  # the shape of its error answers
    events: str = "With `stream: true`: `data: {chunk}` events, then `data: [DONE]`"
    stream_type: str = "text/event-stream"
    not_found: str = "Unknown model"  # what its 404 means


_MODEL_ERRORS = (400, 404, 413, 429, 503)
_NO_RESPONSE = "No such stored response (never stored, deleted, expired, or another key's)"
_NDJSON = "application/x-ndjson"
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/v1/completions"): Operation(
        "createCompletion", "Text completion of one or more prompts", CompletionRequest,
        CompletionResponse, streams=True, errors=_MODEL_ERRORS),
    ("POST", "/v1/chat/completions"): Operation(
        "createChatCompletion", "Chat completion of a conversation", ChatCompletionRequest,
        ChatCompletionResponse, streams=True, errors=_MODEL_ERRORS),
    ("POST", "/v1/responses"): Operation(
        "createResponse", "A model response (OpenAI's Responses API), stored unless "
        "`store: false`; `previous_response_id` continues a stored one",
        ResponsesRequest, ResponseObject, streams=True, errors=_MODEL_ERRORS,
        not_found="Unknown model, or unknown previous_response_id"),
    ("POST", "/v1/responses/input_tokens"): Operation(
        "countResponseInputTokens", "Input tokens a Responses request would evaluate (its "
        "conversation, instructions and tools included); nothing is generated or stored",
        ResponsesRequest, InputTokens, errors=_MODEL_ERRORS,
        not_found="Unknown model, or unknown previous_response_id"),
    ("POST", "/v1/responses/compact"): Operation(
        "compactResponse", "A conversation shrunk to its user messages and one compaction "
        "item, the model's summary of the rest (send the output as a later `input`); "
        "nothing is stored", ResponsesRequest, CompactedResponse, errors=_MODEL_ERRORS,
        not_found="Unknown model, or unknown previous_response_id"),
    ("GET", "/v1/responses/{response_id}"): Operation(
        "getResponse", "A stored response, as it was answered", response=ResponseObject,
        errors=(404, 503), not_found=_NO_RESPONSE),
    ("DELETE", "/v1/responses/{response_id}"): Operation(
        "deleteResponse", "Deletes a stored response", response=DeletedResponse,
        errors=(404, 503), not_found=_NO_RESPONSE),
    ("GET", "/v1/responses/{response_id}/input_items"): Operation(
        "listInputItems", "The items a stored response was given, its conversation's "
        "earlier turns included (query: `after` an item id, `limit` 1-100, default 20, "
        "`order` asc or desc, default desc)", response=InputItemList,
        errors=(400, 404, 503), not_found=_NO_RESPONSE),
    **{("POST", f"/v1/audio/{path}"): Operation(
        op_id, summary, TranscriptionRequest, Transcription,
        request_type="multipart/form-data", streams=path == "transcriptions",
        errors=_MODEL_ERRORS,
        events="With `stream: true`: `data: {\"type\": \"transcript.text.delta\", …}` "
               "events, then `transcript.text.done` with the text and usage")
       for path, op_id, summary in (
           ("transcriptions", "createTranscription", "The words of an audio clip, written "
            "by a model whose projector reads audio (`response_format` json, text or "
            "verbose_json)"),
           ("translations", "createTranslation", "An audio clip's speech in English, "
            "written by a model whose projector reads audio"))},
    ("POST", "/v1/embeddings"): Operation(
        "createEmbedding", "L2-normalized embedding vectors of one or more inputs",
        EmbeddingRequest, EmbeddingResponse, errors=_MODEL_ERRORS),
    **{("POST", path): Operation(
        op_id, "Documents ranked by a reranker's relevance scores for a query, best first "
        "(Jina's and Cohere's shape; TEI's with `texts`)" + note, RerankRequest,
        RerankResponse, errors=_MODEL_ERRORS)
       for path, op_id, note in (("/v1/rerank", "rerank", ""),
                                 ("/v1/reranking", "rerankAlias", " (llama-server's alias)"))},
    ("GET", "/v1/models"): Operation(
        "listModels", "Models this server serves, the default model first",
        response=ModelList),
    ("GET", "/v1/models/{model}"): Operation(
        "retrieveModel", "One model, by its id or any alias (`default`: the model served "
        "by default)", response=ModelCard, errors=(404,)),
    ("POST", "/tokenize"): Operation(
        "tokenize", "Text or chat messages to the model's token ids", TokenizeRequest,
        TokenizeResponse, errors=_MODEL_ERRORS),
    ("POST", "/detokenize"): Operation(
        "detokenize", "Token ids back to text", DetokenizeRequest, DetokenizeResponse,
        errors=_MODEL_ERRORS),
    ("POST", "/completion"): Operation(
        "nativeCompletion", "llama-server's native completion: `content`, `stop_type`, "
        "`timings`; an array for several prompts or choices", NativeCompletionRequest,
        NativeResult, streams=True, errors=_MODEL_ERRORS,
        events="With `stream: true`: `data: {partial result}` events, the whole result "
               "last (`stop: true`), no `[DONE]`"),
    ("POST", "/apply-template"): Operation(
        "applyTemplate", "Chat messages to the prompt text the model's chat template "
        "makes of them (llama-server's route)", ApplyTemplateRequest, ApplyTemplateResponse,
        errors=_MODEL_ERRORS),
    ("GET", "/props"): Operation(
        "props", "llama-server's properties of a model: context, slots, chat template, "
        "default sampler (`?model=` for another than the default; a GET loads no other "
        "model: 409 when it is not loaded)", response=PropsResponse,
        errors=(403, 404, 409, 503)),
    ("GET", "/slots"): Operation(
        "slots", "llama-server's read-only view of each slot of a model (with --slots; "
        "`?model=`, `?fail_on_no_slot=1`)", response=SlotList, errors=(404, 501, 503)),
    ("GET", "/lora-adapters"): Operation(
        "listLoraAdapters", "llama-server's list of a model's LoRA adapters and the scales "
        "requests naming none get (`?model=`; a GET loads no other model)",
        response=LoraAdapterList, errors=(403, 404, 409, 503)),
    ("POST", "/lora-adapters"): Operation(
        "setLoraAdapters", "Sets the scales requests naming no adapters get (adapters left "
        "out: 0); an admin key where keys are set", LoraScales, LoraApplied,
        errors=(400, 401, 403, 404, 503)),
    ("POST", "/v1/messages"): Operation(
        "createMessage", "Anthropic Messages API: the next assistant message", MessagesRequest,
        MessagesResponse, streams=True, errors=_MODEL_ERRORS, error=AnthropicErrorResponse,
        events="With `stream: true`: Anthropic's `event: <type>` / `data: {…}` events, "
               "message_start to message_stop"),
    ("POST", "/v1/messages/count_tokens"): Operation(
        "countMessageTokens", "Anthropic Messages API: prompt tokens a message request "
        "would evaluate", CountTokensRequest, CountTokensResponse, errors=_MODEL_ERRORS,
        error=AnthropicErrorResponse),
    **{key: dataclasses.replace(op, error=ollama.OllamaError, stream_type=_NDJSON, events=(
        "Unless `stream: false`: one JSON object per line, the last with `done: true`"))
       for key, op in {
        ("GET", "/api/version"): Operation("ollamaVersion", "Ollama: the API version spoken",
                                           response=ollama.VersionResponse),
        ("GET", "/api/tags"): Operation("ollamaTags", "Ollama: the models present",
                                        response=ollama.TagsResponse),
        ("GET", "/api/ps"): Operation("ollamaRunning", "Ollama: the models loaded",
                                      response=ollama.RunningResponse),
        ("POST", "/api/show"): Operation("ollamaShow", "Ollama: one model's details",
                                         ollama.ModelRequest, ollama.ShowResponse,
                                         errors=(400, 404)),
        ("POST", "/api/chat"): Operation("ollamaChat", "Ollama: the next chat message",
                                         ollama.ChatRequest, ollama.ChatResponse, streams=True,
                                         errors=_MODEL_ERRORS),
        ("POST", "/api/generate"): Operation("ollamaGenerate", "Ollama: a completion",
                                             ollama.GenerateRequest, ollama.GenerateResponse,
                                             streams=True, errors=_MODEL_ERRORS),
        ("POST", "/api/embed"): Operation("ollamaEmbed", "Ollama: embeddings of inputs",
                                          ollama.EmbedRequest, ollama.EmbedResponse,
                                          errors=_MODEL_ERRORS),
        ("POST", "/api/embeddings"): Operation(
            "ollamaEmbeddings", "Ollama (legacy): the embedding of a prompt",
            ollama.EmbeddingsRequest, ollama.EmbeddingsResponse, errors=_MODEL_ERRORS),
        ("POST", "/api/pull"): Operation("ollamaPull", "Ollama: download a model, with "
                                         "progress", ollama.PullRequest,
                                         ollama.ProgressResponse, streams=True,
                                         errors=(400, 403, 404, 409, 502, 503, 507)),
        ("POST", "/api/copy"): Operation("ollamaCopy", "Ollama: another name for a model",
                                         ollama.CopyRequest, errors=(400, 403, 404, 409)),
        ("DELETE", "/api/delete"): Operation("ollamaDelete", "Ollama: remove a copied name "
                                             "or a pulled model's file", ollama.ModelRequest,
                                             errors=(400, 403, 404, 409)),
        ("POST", "/api/create"): Operation("ollamaCreate", "Ollama: a model made from a "
                                           "served model or an uploaded GGUF, with a "
                                           "Modelfile's system prompt, template and options",
                                           ollama.CreateRequest, ollama.ProgressResponse,
                                           streams=True, errors=(400, 404, 409)),
        ("POST", "/api/blobs/{digest}"): Operation(
            "ollamaCreateBlob", "Ollama: upload a GGUF file (the body as is) under its "
            "SHA-256 digest; HEAD says whether it is here", errors=(400, 413)),
        ("POST", "/api/push"): Operation("ollamaPush", "Ollama: refused (400)", errors=(400,)),
    }.items()},
    ("GET", "/health"): Operation(
        "health", "200 once the default model serves; 503 while it loads, failed or stalled",
        response=HealthResponse, errors=(503,), open=True),
    ("GET", "/metrics"): Operation(
        "metrics", "Prometheus metrics", media_type="text/plain; version=0.0.4"),
    ("GET", OPENAPI_PATH): Operation("openapi", "This document", media_type="application/json"),
    ("GET", "/"): Operation("chatPage", "The chat page (off with --no-webui)",
                            media_type="text/html", open=True),
    ("GET", "/webui/{name}"): Operation(
        "chatPageFile", "A script, style sheet, icon or license of the chat page",
        media_type="text/javascript", open=True),
    ("POST", "/infill"): Operation(
        "createInfill", "Code infill at the cursor (llama-server's API, as llama.vscode and "
        "llama.vim send it)", InfillRequest, InfillResponse, streams=True,
        errors=_MODEL_ERRORS,
        events="With `stream: true`: `data: {\"content\", \"stop\": false}` events, then "
               "the whole answer with `stop: true`"),
}
# llama-server's paths of the OpenAI routes (no /v1): the same operations.
for (_method, _path), _op in list(OPERATIONS.items()):
    if _path.replace("{model}", "{model:path}") in UNPREFIXED_PATHS:
        OPERATIONS[(_method, without_v1(_path))] = dataclasses.replace(
            _op, id=_op.id + "Unprefixed", summary=_op.summary + " (llama-server's path)")

_STATUS_TEXT = {400: "Invalid request", 403: "Forbidden: an admin key's, or the operator's model",
                404: "Unknown model", 409: "Conflict", 413: "Request body too large",
                429: "Queue full; retry after `Retry-After` seconds",
                503: "Model loading, not downloaded, or no slot in time",
                507: "Not enough free disk"}


def _schemas(ops: list[Operation]) -> tuple[dict[tuple[Any, JsonSchemaMode], Any],
                                           dict[str, Any]]:
    """JSON schemas of every model the operations use, shared definitions gathered under
    components/schemas (requests as validated, responses as serialized)."""
    wanted: list[tuple[type[BaseModel], JsonSchemaMode]] = [(ErrorResponse, "serialization")]
    for op in ops:
        wanted.append((op.error, "serialization"))
        if op.request is not None:
            wanted.append((op.request, "validation"))
        if op.response is not None:
            wanted.append((op.response, "serialization"))
    refs, defs = models_json_schema(list(dict.fromkeys(wanted)), ref_template=_REF)
    return refs, defs.get("$defs", {})


def _operation(op: Operation, refs: dict[Any, Any], params: list[str],
               secured: bool) -> dict[str, Any]:
    error_ref = {"$ref": _REF.format(model=op.error.__name__)}
    error_body = {"application/json": {"schema": error_ref}}
    if op.response is not None:
        ok: dict[str, Any] = {"application/json": {"schema": refs[(op.response,
                                                                     "serialization")]}}
    else:
        ok = {op.media_type: {"schema": {"type": "object"} if "json" in op.media_type
                              else {"type": "string"}}}
    if op.streams:
        ok[op.stream_type] = {"schema": {
            "type": "string",
            "description": op.events,
        }}
    responses: dict[str, Any] = {"200": {"description": "OK", "content": ok}}
    for status in op.errors:
        text = "Not served now" if op.id == "health" else op.not_found if status == 404 \
            else _STATUS_TEXT.get(status, "Error")
        content = ok if op.id == "health" else error_body
        responses[str(status)] = {"description": text, "content": content}
    if secured and not op.open:
        responses["401"] = {"description": "Missing or wrong API key", "content": error_body}
    shape = {AnthropicErrorResponse: "Anthropic's", ollama.OllamaError: "Ollama's"}.get(
        op.error, "OpenAI's")
    responses["default"] = {"description": f"An error in {shape} shape", "content": error_body}
    out: dict[str, Any] = {"operationId": op.id, "summary": op.summary, "responses": responses}
    if params:
        out["parameters"] = [{"name": p, "in": "path", "required": True,
                              "schema": {"type": "string"}} for p in params]
    if op.request is not None:
        out["requestBody"] = {"required": True, "content": {
            op.request_type: {"schema": refs[(op.request, "validation")]}}}
    if secured and op.open:
        out["security"] = []
    return out


def build_openapi(routes: list[BaseRoute], *, secured: bool = False) -> dict[str, Any]:
    """The document for `routes`. `secured`: API keys are required (all but /health)."""
    found: list[tuple[str, str, Route, Operation]] = []
    for route in routes:
        if not isinstance(route, Route):
            continue
        for method in sorted(route.methods or ()):
            op = OPERATIONS.get((method, route.path_format))
            if op is not None:
                found.append((method, route.path_format, route, op))
            elif method != "HEAD":
                log.warning("route %s %s has no OpenAPI entry", method, route.path_format)
    refs, defs = _schemas([op for *_, op in found])
    paths: dict[str, dict[str, Any]] = {}
    for method, path, route, op in found:
        paths.setdefault(path, {})[method.lower()] = _operation(
            op, refs, list(route.param_convertors), secured)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "edge_server", "version": __version__,
                 "description": "OpenAI-compatible completions and chat completions on "
                                "llama.cpp."},
        "paths": paths,
        "components": {"schemas": defs},
    }
    if secured:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http",
                                                           "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc


def openapi_route(*, secured: bool) -> Route:
    cached: list[bytes] = []

    async def openapi(request: Request) -> Response:
        # Built on first use from the routes the app really has, then kept: it is static.
        if not cached:
            doc = build_openapi(request.app.routes, secured=secured)
            cached.append(json.dumps(doc).encode())
        return Response(cached[0], media_type="application/json")

    return Route(OPENAPI_PATH, openapi, methods=["GET"])
