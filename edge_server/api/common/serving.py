"""Serving logic both endpoints share: sampling parameters, token budgets, running a
request on the engine while watching the client, and server-sent events."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from edge_server.api.common.llama_fields import (
    check_llama_server_fields,
    grammar_conflict,
    user_grammar,
)
from edge_server.api.common.model_bounds import ModelBounds
from edge_server.api.common.protocol import (
    CompletionTokensDetails,
    PromptTokensDetails,
    SamplingRequest,
    UsageInfo,
)
from edge_server.api.http.errors import APIError, from_engine_error, invalid
from edge_server.api.http.guards.auth import tenant_of
from edge_server.api.http.read_ahead import ReadAheadStream
from edge_server.engine import (
    ChoiceDelta,
    Engine,
    EngineError,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    Usage,
)
from edge_server.engine.grammar.json_grammar import (
    ANY_JSON_OBJECT,
    SchemaError,
    compile_schema,
    name_tool_paths,
)
from edge_server.engine.request import PromptProgress, RequestHandle
from edge_server.engine.sampling.logprobs import TokenLogprob

log = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def request_grammar(req: SamplingRequest) -> str | None:
    """The grammar the request asks for: `grammar` (GBNF text), `json_schema` (llama-
    server's) or `response_format`; at most one of them."""
    given = [name for name in ("grammar", "json_schema") if getattr(req, name) is not None]
    if req.response_format is not None and req.response_format.type != "text":
        given.append("response_format")
    if len(given) > 1:
        raise grammar_conflict(given[1])
    if req.grammar is not None:
        return user_grammar(req.grammar)
    if req.json_schema is not None:
        return schema_grammar(req.json_schema, strict=False, param="json_schema")
    return response_grammar(req)


def response_grammar(req: SamplingRequest) -> str | None:
    """The GBNF grammar that response_format asks for, or None for free text."""
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        schema, strict = fmt.object_schema, False
    else:
        if fmt.json_schema is None:
            raise invalid("response_format.json_schema", "json_schema needs a `json_schema` object")
        schema, strict = fmt.json_schema.json_schema, bool(fmt.json_schema.strict)
    if schema is None:
        return ANY_JSON_OBJECT
    return schema_grammar(schema, strict=strict, param="response_format")


def schema_grammar(schema: dict[str, Any], *, strict: bool, param: str) -> str:
    """The grammar for the schema that `param` gave (for `tools`, the schema of a call to
    one of them). A malformed schema, or a strict one past the grammar limits, is a 400
    naming `param`; a non-strict one is relaxed to the limits (logged)."""
    try:
        compiled = compile_schema(schema, strict=strict)
    except SchemaError as exc:
        message = name_tool_paths(str(exc), schema) if param == "tools" else str(exc)
        raise invalid(param, f"{param}: {message}", "unsupported_schema") from exc
    if compiled.relaxed:
        log.info("%s: best effort, not enforced: %s", param, "; ".join(compiled.relaxed))
    return compiled.grammar


def sampling_params(req: SamplingRequest, engine: Engine) -> SamplingParams:
    """The request's samplers, their sizes held to the model's (model_bounds)."""
    check_llama_server_fields(req.model_extra)
    bounds = ModelBounds.of(engine)
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        token = int(key)
        bounds.check_token_id(token, "logit_bias")
        bias[token] = value
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=bounds.top_k(req.top_k or 0),
        min_p=req.min_p or 0.0,
        seed=req.seed,
        frequency_penalty=req.frequency_penalty or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        penalty_last_n=bounds.repeat_window(req.repeat_last_n),
        logit_bias=bias,
        mirostat_target=req.mirostat_target,
        mirostat_lr=req.mirostat_lr,
        ignore_eos=bool(req.ignore_eos),
        grammar=request_grammar(req),
    )


def budgets(req: SamplingRequest) -> dict[str, Any]:
    """GenerationRequest's fields from llama-server's budgets and limits (-1 or 0: off)."""
    def ms(value: int | None) -> float | None:
        return float(value) if value is not None and value > 0 else None

    return {
        "return_progress": bool(req.return_progress) and bool(req.stream),
        "max_prompt_ms": ms(req.t_max_prompt_ms),
        "max_predict_ms": ms(req.t_max_predict_ms),
        "min_indent": req.n_indent or 0,
    }


def max_tokens_for(req: SamplingRequest, prompt_len: int, engine: Engine,
                   default: int | None) -> int:
    """Applies context_length_exceeded_behavior; None as default means 'what fits' (the
    room the prompt leaves in one sequence's context: every choice has a KV stream of its
    own)."""
    n_ctx = engine.n_ctx
    room = ModelBounds.of(engine).answer_room(
        prompt_len, "messages" if hasattr(req, "messages") else "prompt")
    if req.prompt_only:
        return 0
    wanted = req.max_tokens if req.max_tokens is not None else default
    if req.max_tokens is None and req.n_predict == -1:
        wanted = None  # llama-server's "until the context is full"
    if wanted is None:
        return room
    if wanted > room and req.context_length_exceeded_behavior == "error":
        raise APIError(
            400,
            f"The prompt ({prompt_len} tokens) plus max_tokens ({wanted}) exceeds the "
            f"context of {n_ctx} tokens.",
            type="invalid_request_error",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return min(wanted, room)


def usage_info(usage: Usage) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
        completion_tokens_details=None if not usage.prediction_tokens else (
            CompletionTokensDetails(
                accepted_prediction_tokens=min(usage.prediction_accepted,
                                               usage.prediction_tokens),
                rejected_prediction_tokens=max(usage.prediction_tokens
                                               - usage.prediction_accepted, 0))),
    )


def sum_usage(handles: list[RequestHandle]) -> Usage:
    total = Usage()
    for handle in handles:
        total.prompt_tokens += handle.usage.prompt_tokens
        total.completion_tokens += handle.usage.completion_tokens
        total.cached_tokens += handle.usage.cached_tokens
    return total


def submit(engine: Engine, request: GenerationRequest, http: Request) -> RequestHandle:
    """Hands the request to the engine, in its caller's cache partition (its API key)."""
    request.partition = tenant_of(http)
    try:
        return engine.submit(request)
    except EngineError as exc:
        raise from_engine_error(exc) from exc


def submit_all(engine: Engine, requests: list[GenerationRequest], http: Request
               ) -> list[RequestHandle]:
    """Submits every request (one per prompt), or none: those submitted before one is
    refused are cancelled."""
    handles: list[RequestHandle] = []
    try:
        for request in requests:
            handles.append(submit(engine, request, http))
    except Exception:
        for handle in handles:
            handle.cancel()
        raise
    return handles


@asynccontextmanager
async def cancel_on_disconnect(
    http: Request, handles: list[RequestHandle], *, cancel_on_exit: bool = True
) -> AsyncIterator[None]:
    """Cancels the engine work the moment the client goes away, and (unless told
    otherwise) when the block is left, normally or not."""

    async def watch() -> None:
        while True:
            message = await http.receive()
            if message["type"] == "http.disconnect":
                for handle in handles:
                    handle.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        yield
    except BaseException:
        for handle in handles:
            handle.cancel()
        raise
    finally:
        watcher.cancel()
        if cancel_on_exit:
            for handle in handles:
                handle.cancel()


async def wait_started(http: Request, handles: list[RequestHandle]) -> None:
    """Before a stream's headers go out: wait for the engine's first answer, so that an
    error (queue timeout, bad grammar) is still a proper HTTP status."""
    async with cancel_on_disconnect(http, handles, cancel_on_exit=False):
        try:
            for handle in handles:
                await handle.started()
        except EngineError as exc:
            raise from_engine_error(exc) from exc


@dataclass
class ChoiceResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def mean_logprob(self) -> float:
        if not self.logprobs:
            return float("-inf")
        return sum(e.logprob for e in self.logprobs) / len(self.logprobs)


async def collect(handle: RequestHandle, n: int) -> list[ChoiceResult]:
    """Waits for all choices of a request; the texts joined, finish reasons set."""
    results = [ChoiceResult() for _ in range(n)]
    parts: list[list[str]] = [[] for _ in range(n)]
    try:
        async for delta in handle.deltas():
            result = results[delta.index]
            parts[delta.index].append(delta.text)
            result.token_ids.extend(delta.token_ids)
            if delta.logprobs:
                result.logprobs.extend(delta.logprobs)
            if delta.finish_reason:
                result.finish_reason = delta.finish_reason
    except EngineError as exc:
        raise from_engine_error(exc) from exc
    for result, texts in zip(results, parts, strict=True):
        result.text = "".join(texts)
    return results


async def stream_deltas(handle: RequestHandle) -> AsyncIterator[ChoiceDelta]:
    try:
        async for delta in handle.deltas():
            yield delta
    except EngineError as exc:
        raise from_engine_error(exc) from exc


async def stream_events(handle: RequestHandle) -> AsyncIterator[ChoiceDelta | PromptProgress]:
    """stream_deltas with the prompt progress of a `return_progress` request."""
    try:
        async for event in handle.events():
            yield event
    except EngineError as exc:
        raise from_engine_error(exc) from exc


def progress_json(progress: PromptProgress) -> dict[str, Any]:
    """llama-server's `prompt_progress` object: `processed` counts cached tokens too."""
    return {"total": progress.total, "cache": progress.cached,
            "processed": progress.processed, "time_ms": progress.time_ms}


def sse_event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class EngineStream(ReadAheadStream):
    """A streamed answer (server-sent events, or NDJSON lines), read ahead of the client,
    whose engine work is cancelled however sending ends: the client may leave before
    the events are all read."""

    def __init__(self, events: AsyncIterator[str], handles: list[RequestHandle],
                 media_type: str = "text/event-stream") -> None:
        super().__init__(
            events,
            media_type=media_type,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.handles = handles

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for handle in self.handles:
                handle.cancel()


def sse_response(events: AsyncIterator[str], handles: list[RequestHandle]) -> StreamingResponse:
    return EngineStream(events, handles)


async def sse_with_errors(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """An error after the stream began can only travel as an event of its own."""
    try:
        async for event in events:
            yield event
    except APIError as exc:
        yield sse_event(exc.body())
        yield SSE_DONE


async def merged_events(
    handles: list[RequestHandle],
) -> AsyncIterator[tuple[int, ChoiceDelta | PromptProgress]]:
    """Deltas of several requests as they come, tagged with the request's position."""
    if len(handles) == 1:
        async for delta in stream_events(handles[0]):
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    end = object()

    async def pump(i: int, handle: RequestHandle) -> None:
        try:
            async for delta in stream_events(handle):
                await queue.put((i, delta))
        except Exception as exc:
            await queue.put((i, exc))
        await queue.put((i, end))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
