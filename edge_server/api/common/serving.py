"""Running requests on the engine while watching the client: ids, submitting (with the
caller's tenant), cancelling on disconnect, collecting whole answers, streaming deltas,
and usage. The request's fields become engine parameters in sampling_fields and
grammars; streams are written as server-sent events by sse."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from starlette.requests import Request

from edge_server.api.common.protocol import (
    CompletionTokensDetails,
    PromptTokensDetails,
    UsageInfo,
)
from edge_server.api.http.errors import from_engine_error
from edge_server.api.http.guards.auth import tenant_of
from edge_server.engine import (
    ChoiceDelta,
    Engine,
    EngineError,
    FinishReason,
    GenerationRequest,
    Usage,
)
from edge_server.engine.request import PromptProgress, RequestHandle
from edge_server.engine.sampling.logprobs import TokenLogprob


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage_info(usage: Usage) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens,
                                                  audio_tokens=usage.audio_tokens),
        completion_tokens_details=None if not usage.prediction_tokens else (
            CompletionTokensDetails(
                accepted_prediction_tokens=min(usage.prediction_accepted,
                                               usage.prediction_tokens),
                rejected_prediction_tokens=max(usage.prediction_tokens
                                               - usage.prediction_accepted, 0))),
    )


def sum_usage(handles: list[RequestHandle]) -> Usage:
    """Every count of the requests' usage added up (drafts and predictions too)."""
    total = Usage()
    for handle in handles:
        for name in (f.name for f in dataclasses.fields(Usage)):
            setattr(total, name, getattr(total, name) + getattr(handle.usage, name))
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
