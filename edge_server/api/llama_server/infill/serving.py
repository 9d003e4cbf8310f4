"""POST /infill: the FIM prompt (common/fim.py) cut to llama-server's windows, generated
whole or streamed in llama-server's own (non-OpenAI) shape."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_server.api.common.bounds.prompt_bounds import check_prompt_bytes
from edge_server.api.common.fim import (
    ExtraChunk,
    extra_context,
    fim_prompt,
    fim_tokens,
    text_tokens,
)
from edge_server.api.common.sampling_fields import (
    answer_ceiling_s,
    budgets,
    max_tokens_for,
    sampling_params,
)
from edge_server.api.common.serving import (
    cancel_on_disconnect,
    collect,
    stream_events,
    submit,
    wait_started,
)
from edge_server.api.common.sse import progress_json, sse_event, sse_response, sse_with_errors
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import invalid
from edge_server.api.llama_server.infill.protocol import (
    InfillRequest,
    InfillResponse,
    InfillTimings,
)
from edge_server.engine import Engine, GenerationRequest
from edge_server.engine.request import PromptProgress, RequestHandle


@dataclass
class PreparedInfill:
    request: GenerationRequest
    truncated: bool


def _prefix_window(engine: Engine, text: str, keep: int) -> tuple[list[int], bool]:
    """The prefix's last `keep` tokens at most, starting at a line start chosen from the
    lines before the cursor's line, with a quarter of the window kept for that line:
    while the user types on it, the window's start stays put, so the prompt up to the
    edit stays a cached prefix (llama-server's token-exact window slides every
    keystroke). A cursor line longer than the window is cut token by token."""
    tokens = text_tokens(engine, text)
    if len(tokens) <= keep:
        return tokens, False
    lines = text.splitlines(keepends=True)
    current = "" if text.endswith(("\n", "\r")) else lines.pop()
    room = keep - max(len(text_tokens(engine, current)), keep // 4)
    counts = [len(text_tokens(engine, line)) for line in lines]
    total, first = sum(counts), 0
    while first < len(lines) and total > room:
        total -= counts[first]
        first += 1
    tokens = text_tokens(engine, "".join(lines[first:]) + current)
    return tokens[len(tokens) - min(len(tokens), keep):], True


def _windows(req: InfillRequest, engine: Engine) -> tuple[list[int], list[int], list[int],
                                                          list[int], bool]:
    """Extra, prefix, prompt and suffix tokens in llama-server's windows: the prefix's
    last 3/4 of a batch (from a line start), the suffix's first 1/4 (less the prompt),
    the extra context's last n_ctx - n_batch - 2 x n_predict tokens (its newest chunks)."""
    n_batch, n_ctx = engine.model.n_batch, engine.n_ctx
    for name, text in (("input_prefix", req.input_prefix), ("input_suffix", req.input_suffix),
                       ("prompt", req.prompt)):
        check_prompt_bytes(text, engine, name)
    check_prompt_bytes("".join(c.text + c.filename for c in req.input_extra), engine,
                       "input_extra")
    chunks = [ExtraChunk(c.text, c.filename) for c in req.input_extra]
    extra = extra_context(engine, chunks)
    suffix = text_tokens(engine, req.input_suffix)
    prompt = text_tokens(engine, req.prompt)
    n_predict = max(req.max_tokens or 0, 0)
    keep_prefix = 3 * (n_batch // 4)
    keep_suffix = max(0, n_batch // 4 - (2 + len(prompt)))
    keep_extra = max(0, n_ctx - n_batch - 2 * n_predict)
    prefix, cut = _prefix_window(engine, req.input_prefix, keep_prefix)
    truncated = cut or len(suffix) > keep_suffix or len(extra) > keep_extra
    extra = extra[len(extra) - min(len(extra), keep_extra):]
    return extra, prefix, prompt, suffix[:keep_suffix], truncated


def prepare(req: InfillRequest, engine: Engine) -> PreparedInfill:
    """Checks, windows and the prompt; CPU-bound (tokenizer), so off the event loop."""
    fim = fim_tokens(engine, "model")
    if (req.n or 1) != 1:
        raise invalid("n", "infill makes one completion per request")
    sampling = sampling_params(req, engine)
    extra, prefix, prompt, suffix, truncated = _windows(req, engine)
    tokens = fim_prompt(engine, fim, extra=extra, prefix=prefix, suffix=suffix, prompt=prompt)
    request = GenerationRequest(
        prompt_tokens=tokens,
        max_tokens=max_tokens_for(req, len(tokens), engine, None),
        sampling=sampling,
        stop=req.stop_list,
        include_stop=bool(req.include_stop_str_in_output),
        max_answer_s=answer_ceiling_s(req, engine, None),
        **budgets(req),
    )
    return PreparedInfill(request, truncated)


def _stop_type(req: InfillRequest, finish_reason: str | None) -> str:
    if finish_reason == "length":
        return "limit"
    return "word" if req.stop_list else "eos"


class _Clock:
    """Prompt and generation times as the client sees them: until the first token, then
    until the end."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.first: float | None = None

    def token(self) -> None:
        if self.first is None:
            self.first = time.monotonic()

    def timings(self, handle: RequestHandle) -> InfillTimings:
        end = time.monotonic()
        first = self.first or end
        usage = handle.usage
        return InfillTimings(
            cache_n=usage.cached_tokens, prompt_n=usage.prompt_tokens - usage.cached_tokens,
            prompt_ms=round((first - self.start) * 1000, 3),
            predicted_n=usage.completion_tokens, predicted_ms=round((end - first) * 1000, 3))


class InfillServing:
    async def create(self, req: InfillRequest, engine: Engine, http: Request) -> Response:
        prepared = await off_loop(prepare, req, engine)
        clock = _Clock()
        handle = submit(engine, prepared.request, http)
        if req.stream:
            await wait_started(http, [handle])
            events = self._stream(req, engine, http, handle, prepared, clock)
            return sse_response(sse_with_errors(events), [handle])
        async with cancel_on_disconnect(http, [handle]):
            [result] = await collect(handle, 1)
        clock.token()
        return JSONResponse(self._final(req, engine, handle, prepared, clock, result.text,
                                        result.finish_reason).model_dump())

    @staticmethod
    def _final(req: InfillRequest, engine: Engine, handle: RequestHandle,
               prepared: PreparedInfill, clock: _Clock, content: str,
               finish_reason: str | None) -> InfillResponse:
        usage = handle.usage
        return InfillResponse(
            content=content, stop_type=_stop_type(req, finish_reason),  # type: ignore[arg-type]
            model=engine.model_id, tokens_predicted=usage.completion_tokens,
            tokens_evaluated=usage.prompt_tokens, tokens_cached=usage.cached_tokens,
            truncated=prepared.truncated, timings=clock.timings(handle))

    async def _stream(self, req: InfillRequest, engine: Engine, http: Request,
                      handle: RequestHandle, prepared: PreparedInfill, clock: _Clock
                      ) -> AsyncIterator[str]:
        """llama-server's stream: `{"content", "stop": false}` events, then the whole
        answer's fields with `stop: true` (no `[DONE]`)."""
        async with cancel_on_disconnect(http, [handle]):
            async for event in stream_events(handle):
                if isinstance(event, PromptProgress):
                    yield sse_event({"content": "", "stop": False,
                                     "prompt_progress": progress_json(event)})
                    continue
                clock.token()
                if event.finish_reason is None:
                    yield sse_event({"content": event.text, "stop": False})
                    continue
                final = self._final(req, engine, handle, prepared, clock, event.text,
                                    event.finish_reason)
                yield sse_event(final.model_dump())
