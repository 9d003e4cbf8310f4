"""POST /v1/responses: a Responses request read as the chat request it means, run through
the chat preparation (template, grammars, tool parsing, reasoning split) and the engine,
and the chat layer's output turned back into Responses output items."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...engine import Engine
from ...engine.request import RequestHandle
from ..chat.choice_output import ChoiceOutput
from ..chat.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    NamedToolChoice,
    Tool,
    ToolCall,
)
from ..chat.serving import PreparedChat, prepare
from ..common.protocol import JSONSchemaFormat, ResponseFormat
from ..common.serving import (
    cancel_on_disconnect,
    collect,
    now,
    sse_response,
    stream_deltas,
    submit,
    wait_started,
)
from ..http.dependencies import off_loop
from ..http.errors import APIError, invalid, unsupported
from .protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputPart,
    MessageItem,
    ResponsesRequest,
)
from .streaming import EventWriter, OutputItems, item_id, with_error_event

# Fields of the API this server does not serve: 400 naming them whenever they are set.
_REFUSED = ("conversation", "prompt", "max_tool_calls", "top_logprobs", "context_management",
            "moderation", "prompt_cache_options")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
# Chat parameter names in errors, as this API calls them.
_PARAMS = {"messages": "input", "response_format": "text.format", "max_tokens": "max_output_tokens"}


def check_fields(req: ResponsesRequest) -> None:
    for name in sorted(req.model_extra or {}):
        how = "is not supported by this server" if name in _REFUSED else "is not a known field"
        raise unsupported(name, how)
    if req.previous_response_id is not None:
        raise unsupported("previous_response_id", "needs stored responses; this server is "
                          "stateless: send the whole conversation as `input`")
    if req.store:
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


def _content(parts: str | list[InputPart], where: str, reads_images: bool
             ) -> str | list[ContentPart]:
    """A message's content as chat takes it: its text, or, once it holds an
    `input_image`, its parts in order (image_url parts for the images)."""
    if isinstance(parts, str) or not any(p.type == "input_image" for p in parts):
        return _part_text(parts, where)
    out = []
    for j, part in enumerate(parts):
        if part.type != "input_image":
            out.append(ContentPart(type="text", text=_part_text([part], f"{where}[{j}]")))
            continue
        if not reads_images:
            raise unsupported(f"{where}[{j}]", "needs a model with a multimodal projector; "
                              "this one is text-only")
        extra = part.model_extra or {}
        url = extra.get("image_url")
        if not isinstance(url, str):
            raise unsupported(f"{where}[{j}]", "needs `image_url` (a data URL); file_id "
                              "needs stored files, which this server does not keep")
        out.append(ContentPart(type="image_url", image_url={
            "url": url, "detail": extra.get("detail") or "auto"}))
    return out


def _part_text(parts: str | list[InputPart], where: str) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for j, part in enumerate(parts):
        # A refusal an assistant turn replays carries its text as `refusal`.
        text = (part.model_extra or {}).get("refusal") if part.type == "refusal" else part.text
        if part.type not in _TEXT_PARTS or not isinstance(text, str):
            raise unsupported(f"{where}[{j}]", f"(type `{part.type[:64]}`) is not served: "
                              "only text and image parts are")
        texts.append(text)
    return "\n".join(texts)


def _messages(req: ResponsesRequest, reads_images: bool) -> list[ChatMessage]:
    """The input as chat messages: instructions first, a function_call joins the assistant
    turn before it, a function_call_output is the tool message answering it."""
    out: list[ChatMessage] = []
    if req.instructions:
        out.append(ChatMessage(role="system", content=req.instructions))
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) \
        else req.input
    for i, item in enumerate(items):
        if isinstance(item, MessageItem):
            out.append(ChatMessage(role=item.role,
                                   content=_content(item.content, f"input[{i}].content",
                                                    reads_images)))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name,
                                                                   arguments=item.arguments))
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            text = _part_text(item.output, f"input[{i}].output")
            out.append(ChatMessage(role="tool", content=text, tool_call_id=item.call_id))
        elif item.type == "item_reference":
            raise unsupported(f"input[{i}]", "(an item_reference) needs stored items; this "
                              "server is stateless")
        elif item.type != "reasoning":  # earlier reasoning is not replayed to the model
            raise unsupported(f"input[{i}].type", f"({item.type!r}) is not served")
    if not any(m.role != "system" for m in out):
        raise invalid("input", "`input` needs at least one message")
    return out


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


def to_chat(req: ResponsesRequest, reads_images: bool = False) -> ChatCompletionRequest:
    """The chat request a Responses request means (its fields checked by check_fields);
    `reads_images`: the model has a projector, so `input_image` parts are served."""
    choice: Any = req.tool_choice
    if choice is not None and not isinstance(choice, str):
        if choice.type != "function" or not choice.name:
            raise unsupported("tool_choice", "other than auto, none, required or "
                              "{\"type\": \"function\", \"name\": …} is not served")
        choice = NamedToolChoice(function={"name": choice.name})
    effort = req.reasoning.effort if req.reasoning else None
    try:
        return ChatCompletionRequest(
            model=req.model, messages=_messages(req, reads_images), tools=_tools(req),
            tool_choice=choice,
            parallel_tool_calls=req.parallel_tool_calls, response_format=_response_format(req),
            max_tokens=req.max_output_tokens, temperature=req.temperature, top_p=req.top_p,
            user=req.user, separate_reasoning=True, enable_thinking=effort != "none",
            draft=req.draft,
        )
    except ValidationError as exc:
        raise invalid("input", f"Invalid input: {exc.errors()[0].get('msg', '')}") from exc


def _renamed(exc: APIError) -> APIError:
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


def _prepare(req: ResponsesRequest, engine: Engine) -> PreparedChat:
    try:
        return prepare(to_chat(req, "image" in engine.modalities), engine)
    except APIError as exc:
        raise _renamed(exc) from exc


class ResponsesServing:
    async def create(self, req: ResponsesRequest, engine: Engine, http: Request) -> Response:
        prepared = await off_loop(_prepare, req, engine)
        handle = submit(engine, prepared.request, http)
        shell = _shell(req, engine)
        output = prepared.plan.outputs(1)[0]
        if req.stream:
            await wait_started(http, [handle])
            write = EventWriter()
            events = _stream(http, handle, shell, output, engine, write)
            return sse_response(with_error_event(events, write), [handle])
        async with cancel_on_disconnect(http, [handle]):
            result = (await collect(handle, 1))[0]
        items = OutputItems()
        items.push(output.push(result.text))
        items.push(output.finish())
        items.finish(incomplete=result.finish_reason == "length")
        return JSONResponse(_final(shell, items, handle, engine, result.finish_reason))


async def _stream(http: Request, handle: RequestHandle, shell: dict[str, Any],
                  output: ChoiceOutput, engine: Engine, write: EventWriter
                  ) -> AsyncIterator[str]:
    items = OutputItems()
    async with cancel_on_disconnect(http, [handle]):
        yield write({"type": "response.created", "response": shell})
        yield write({"type": "response.in_progress", "response": shell})
        finish_reason = None
        async for delta in stream_deltas(handle):
            events = items.push(output.push(delta.text))
            if delta.finish_reason is not None:
                finish_reason = delta.finish_reason
                events += items.push(output.finish())
                events += items.finish(incomplete=finish_reason == "length")
            for event in events:
                yield write(event)
        final = _final(shell, items, handle, engine, finish_reason)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield write({"type": kind, "response": final})


def _shell(req: ResponsesRequest, engine: Engine) -> dict[str, Any]:
    """The response before any output: the request's settings echoed as the API does."""
    fmt = req.text.format if req.text and req.text.format else None
    return {
        "id": item_id("resp"), "object": "response", "created_at": now(),
        "status": "in_progress", "error": None, "incomplete_details": None,
        "model": engine.model_id, "output": [], "usage": None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                      "summary": None},
        "store": False, "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt
                 else {"type": "text"}},
        "tool_choice": _echo_choice(req),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled", "user": req.user,
    }


def _echo_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else {"type": "function", "name": choice.name}


def _final(shell: dict[str, Any], items: OutputItems, handle: RequestHandle, engine: Engine,
           finish_reason: str | None) -> dict[str, Any]:
    usage = handle.usage
    reasoning = "".join(part["text"] for item in items.items if item["type"] == "reasoning"
                        for part in item["content"])
    reasoning_tokens = len(engine.tokenize(reasoning, add_special=False)) if reasoning else 0
    incomplete = finish_reason == "length"
    return {
        **shell,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": items.items,
        "output_text": items.output_text,
        "usage": {
            "input_tokens": usage.prompt_tokens,
            # Prompt tokens evaluated now are kept as a reusable prefix: written to cache.
            "input_tokens_details": {
                "cached_tokens": usage.cached_tokens,
                "cache_write_tokens": max(0, usage.prompt_tokens - usage.cached_tokens)},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {
                "reasoning_tokens": min(reasoning_tokens, usage.completion_tokens)},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        },
    }
