"""POST /v1/responses: a Responses request read as the chat request it means, run through
the chat preparation (template, grammars, tool parsing, reasoning split) and the engine,
and the chat layer's output turned back into Responses output items."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_server.api.common.protocol import JSONSchemaFormat, ResponseFormat
from edge_server.api.common.serving import (
    cancel_on_disconnect,
    collect,
    stream_deltas,
    submit,
    wait_started,
)
from edge_server.api.common.sse import sse_response
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import APIError, invalid, unsupported
from edge_server.api.http.guards.auth import tenant_of
from edge_server.api.openai.chat.choice_output import ChoiceOutput
from edge_server.api.openai.chat.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    NamedToolChoice,
    Tool,
)
from edge_server.api.openai.chat.serving import PreparedChat, prepare
from edge_server.api.openai.responses import response_object
from edge_server.api.openai.responses.chain_bound import chain_limit, check_chain
from edge_server.api.openai.responses.continuation import Continuing
from edge_server.api.openai.responses.conversation import chat_messages
from edge_server.api.openai.responses.items import stored_input
from edge_server.api.openai.responses.protocol import InputTokens, ResponsesRequest
from edge_server.api.openai.responses.store import (
    Continuation,
    ResponseRecord,
    ResponseStore,
    StoredResponse,
    StoreError,
)
from edge_server.api.openai.responses.store_codec import dumps
from edge_server.api.openai.responses.streaming import EventWriter, OutputItems, with_error_event
from edge_server.engine import Engine
from edge_server.engine.request import RequestHandle

log = logging.getLogger(__name__)

# Fields of the API this server does not serve: 400 naming them whenever they are set.
_REFUSED = ("conversation", "prompt", "max_tool_calls", "top_logprobs", "context_management",
            "moderation", "prompt_cache_options")
# Chat parameter names in errors, as this API calls them.
_PARAMS = {"messages": "input", "response_format": "text.format", "max_tokens": "max_output_tokens"}


def check_fields(req: ResponsesRequest, *, stateful: bool) -> None:
    """`stateful`: this server keeps responses (a store is configured)."""
    for name in sorted(req.model_extra or {}):
        how = "is not supported by this server" if name in _REFUSED else "is not a known field"
        raise unsupported(name, how)
    if not stateful and req.previous_response_id is not None:
        raise unsupported("previous_response_id", "needs stored responses, and this server "
                          "stores none: send the whole conversation as `input`")
    if not stateful and req.store:
        raise unsupported("store", "must be false: this server stores no responses")
    if req.background:
        raise unsupported("background", "must be false: responses are answered in the request")
    if req.truncation == "auto":
        raise unsupported("truncation", "`auto` is not served; use `disabled`")
    if req.include:
        raise unsupported("include[0]", f"({req.include[0][:64]!r}) is not served")
    if req.text is not None and req.text.verbosity not in (None, "medium"):
        raise unsupported("text.verbosity", "other than `medium` is not served")
    if req.reasoning is not None and (req.reasoning.summary or req.reasoning.generate_summary):
        raise unsupported("reasoning.summary", "is not served: reasoning comes back whole, as "
                          "`reasoning_text` content, never summarized")
    if req.service_tier not in (None, "auto", "default"):
        raise unsupported("service_tier", f"{req.service_tier!r} is not served")


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format if req.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    if fmt.json_schema is None:
        raise invalid("text.format.schema", "a json_schema format needs `schema`")
    return ResponseFormat(type="json_schema", json_schema=JSONSchemaFormat(
        name=fmt.name or "response", description=fmt.description, schema=fmt.json_schema,
        strict=bool(fmt.strict)))


def _tools(req: ResponsesRequest) -> list[Tool] | None:
    if req.tools is None:
        return None
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise unsupported(f"tools[{i}].type", f"({tool.type[:64]!r}) is not served: only "
                              "function tools are")
        if tool.name is None:
            raise invalid(f"tools[{i}].name", "a function tool needs `name`")
        tools.append(Tool.model_validate({"function": {
            "name": tool.name, "description": tool.description,
            "parameters": tool.parameters, "strict": tool.strict}}))
    return tools


def to_chat(req: ResponsesRequest, reads: tuple[str, ...] = (),
            messages: list[ChatMessage] | None = None) -> ChatCompletionRequest:
    """The chat request a Responses request means (its fields checked by check_fields);
    `reads`: what the model reads besides text ("image", "audio": Engine.modalities);
    `messages`: the conversation (default: the request's own, conversation.chat_messages)."""
    if messages is None:
        messages = chat_messages(req, [], reads)
    choice: Any = req.tool_choice
    if choice is not None and not isinstance(choice, str):
        if choice.type != "function" or not choice.name:
            raise unsupported("tool_choice", "other than auto, none, required or "
                              "{\"type\": \"function\", \"name\": …} is not served")
        choice = NamedToolChoice(function={"name": choice.name})
    effort = req.reasoning.effort if req.reasoning else None
    try:
        return ChatCompletionRequest(
            model=req.model, messages=messages, tools=_tools(req),
            tool_choice=choice,
            parallel_tool_calls=req.parallel_tool_calls, response_format=_response_format(req),
            max_tokens=req.max_output_tokens, temperature=req.temperature, top_p=req.top_p,
            user=req.user, separate_reasoning=True, reasoning_effort=effort,
            draft=req.draft,
            # The Responses API's own default, whatever the server's --truncation: a
            # stored conversation is continued whole or refused (`auto` is not served).
            truncation="disabled",
        )
    except ValidationError as exc:
        raise invalid("input", f"Invalid input: {exc.errors()[0].get('msg', '')}") from exc


def renamed(exc: APIError) -> APIError:
    """An error of the chat layer, naming the field as this API calls it."""
    param = exc.param or ""
    for chat, ours in _PARAMS.items():
        if param == chat or param.startswith((chat + "[", chat + ".")):
            if chat == "messages":  # its indices are not the input's: name all of it
                exc.param = ours
            else:
                exc.param = ours + param[len(chat):]
                exc.message = exc.message.replace(chat, ours)
    return exc


@dataclass
class _Turn:
    """A request prepared for the engine, and what keeping its answer needs."""

    prepared: PreparedChat
    continuing: Continuing
    stored_input: list[dict[str, Any]]  # its input as the store keeps it


def _prepare(req: ResponsesRequest, engine: Engine, previous: StoredResponse | None) -> _Turn:
    reads = engine.modalities
    turns = previous.turns if previous else []
    kept_input = stored_input(req)
    # Before any rendering: a conversation past what the model could render is refused
    # whole, however it would tokenize.
    check_chain(engine, previous.chain_bytes if previous else 0, len(dumps(kept_input)),
                chained=previous is not None)
    try:
        messages = chat_messages(req, turns, reads)
        marked = chat_messages(req, turns, reads, marked=True) if turns else None
        continuing = Continuing(engine, marked, previous)
        prepared = prepare(to_chat(req, reads, messages), engine, continuing)
    except APIError as exc:
        raise renamed(exc) from exc
    if previous is not None:
        log.debug("previous_response_id %s: %s", previous.id, "its tokens continued"
                  if continuing.continued else "the conversation rendered whole")
    return _Turn(prepared, continuing, kept_input)


@dataclass
class _Keeper:
    """Stores a finished response with its turn (linked to the conversation it
    continues), and the tokens a chained turn can continue from (none for prompts with
    images: their tokens are not plain)."""

    store: ResponseStore
    tenant: str
    engine: Engine
    turn: _Turn
    previous: StoredResponse | None

    async def keep(self, response: dict[str, Any], generated: list[int]) -> None:
        """Stores the response; where that fails, it says `"store": false`, honestly:
        its id would be a 404."""
        request = self.turn.prepared.request
        key = self.turn.continuing.key
        continuation = None if key is None or request.images else Continuation(
            self.engine.fingerprint, key, [*request.prompt_tokens, *generated])
        record = ResponseRecord(
            response["id"], self.tenant, response,
            {"id": response["id"], "input": self.turn.stored_input,
             "output": response["output"]}, self.previous, continuation)
        try:
            stored = await self.store.put(record, max_bytes=chain_limit(self.engine))
        except StoreError:  # logged by the store
            stored = False
        if not stored:
            log.warning("response %s answered with store: false: the store did not keep "
                        "it", response["id"])
            response["store"] = False


class ResponsesServing:
    async def create(self, req: ResponsesRequest, engine: Engine, http: Request, *,
                     previous: StoredResponse | None, store: ResponseStore | None
                     ) -> Response:
        """`previous`: the stored response `previous_response_id` names; `store`: where
        the answer is kept (None: not kept)."""
        turn = await off_loop(_prepare, req, engine, previous)
        handle = submit(engine, turn.prepared.request, http)
        keeper = _Keeper(store, tenant_of(http), engine, turn, previous) \
            if store is not None else None
        shell = response_object.shell(req, engine, stored=keeper is not None)
        output = turn.prepared.plan.outputs(1)[0]
        if req.stream:
            await wait_started(http, [handle])
            write = EventWriter()
            events = _stream(http, handle, shell, output, engine, write, keeper)
            return sse_response(with_error_event(events, write), [handle])
        async with cancel_on_disconnect(http, [handle]):
            result = (await collect(handle, 1))[0]
        items = OutputItems()
        items.push(output.push(result.text))
        items.push(output.finish())
        items.finish(incomplete=result.finish_reason == "length")
        final = response_object.final(shell, items, handle, engine, result.finish_reason)
        if keeper is not None:
            await keeper.keep(final, result.token_ids)
        return JSONResponse(final)


    async def input_tokens(self, req: ResponsesRequest, engine: Engine, *,
                           previous: StoredResponse | None) -> Response:
        """POST /v1/responses/input_tokens: the tokens the request's input (with the
        conversation `previous` continues, its instructions and tools) would evaluate,
        prepared exactly as `create` prepares it; nothing is generated or stored."""
        turn = await off_loop(_prepare, req, engine, previous)
        counted = InputTokens(input_tokens=len(turn.prepared.request.prompt_tokens))
        return JSONResponse(counted.model_dump())


async def _stream(http: Request, handle: RequestHandle, shell: dict[str, Any],
                  output: ChoiceOutput, engine: Engine, write: EventWriter,
                  keeper: _Keeper | None) -> AsyncIterator[str]:
    items = OutputItems()
    generated: list[int] = []
    async with cancel_on_disconnect(http, [handle]):
        yield write({"type": "response.created", "response": shell})
        yield write({"type": "response.in_progress", "response": shell})
        finish_reason = None
        async for delta in stream_deltas(handle):
            generated += delta.token_ids
            events = items.push(output.push(delta.text))
            if delta.finish_reason is not None:
                finish_reason = delta.finish_reason
                events += items.push(output.finish())
                events += items.finish(incomplete=finish_reason == "length")
            for event in events:
                yield write(event)
        final = response_object.final(shell, items, handle, engine, finish_reason)
        if keeper is not None:  # kept before the client hears of it: it may chain at once
            await keeper.keep(final, generated)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield write({"type": kind, "response": final})
