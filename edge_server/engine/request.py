"""What the engine is asked to do, and what it reports back.

These types are the whole interface between the HTTP layer and the engine: the engine
knows nothing of HTTP or of the OpenAI schemas.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from edge_server.engine.backend.lora import KEY_SEPARATOR, NO_ADAPTERS, AdapterSet
from edge_server.engine.errors import EngineCancelled, EngineError
from edge_server.engine.multimodal.projector import ImageChunk
from edge_server.engine.sampling.chain import SamplingParams
from edge_server.engine.sampling.logprobs import TokenLogprob


@dataclass
class ImageSpan:
    """An image inside a prompt: its tokens are `chunk.placeholders`, from `start`."""

    start: int
    chunk: ImageChunk

    @property
    def end(self) -> int:
        return self.start + self.chunk.n_tokens


@dataclass
class GenerationRequest:
    prompt_tokens: list[int]
    max_tokens: int  # 0: evaluate (and cache) the prompt only
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    include_stop: bool = False  # keep the matched stop string in the text
    # Control tokens' texts in the deltas (`<|python_tag|>`, `[TOOL_CALLS]`): for a
    # caller that parses them out (tool calls, reasoning). Stop strings see them too.
    render_control: bool = False
    n: int = 1  # choices sharing this prompt's KV cache
    logprobs: int | None = None  # None: none; k: chosen token's logprob plus the top k
    prompt_logprobs: bool = False  # also score every prompt token (echo with logprobs)
    images: list[ImageSpan] = field(default_factory=list)  # in prompt order
    # False: every step this request takes part in decodes one row per sequence, so its
    # tokens come from one-row kernels (lookup_draft.py on why drafted rows differ).
    draft: bool = True
    # LM Studio's `draft_model`: the model's draft model by name; every step this request
    # generates in drafts with it, paying or not (the engine checks the name).
    draft_model: str | None = None
    # The answer expected (OpenAI's predicted output): drafts are looked up in it first.
    prediction: list[int] = field(default_factory=list)
    # Whose cache this prompt may use and fill: prefixes are shared only between requests
    # of the same partition (an opaque id; "" for all when callers are not told apart).
    partition: str = ""
    # LoRA adapters asked for by id with their scales (llama-server's `lora`: the others
    # off); None: the model's default scales. The engine resolves it into `adapters`.
    lora: dict[int, float] | None = None
    adapters: AdapterSet = NO_ADAPTERS
    # Budgets and limits of code infill (llama-server's fields; any request may set them).
    return_progress: bool = False  # post PromptProgress while the prompt is evaluated
    max_prompt_ms: float | None = None  # prompt evaluation past this ends the request
    max_predict_ms: float | None = None  # generation past this ends at the next newline
    # For an answer nobody bounded (--max-answer-seconds): this long after it was
    # submitted, each unfinished choice ends at its next token, as a length does.
    max_answer_s: float | None = None
    min_indent: int = 0  # a new line indented less than this ends the choice (0: off)

    @property
    def cache_partition(self) -> str:
        """Whose cached prefixes this prompt may use: its partition's, under its adapter
        set (KV computed under other adapters is other KV)."""
        if self.adapters.empty:
            return self.partition
        return f"{self.partition}{KEY_SEPARATOR}{self.adapters.key}"

    def check(self, *, n_ctx: int, n_vocab: int) -> None:
        """Refuses what the engine cannot serve: out-of-vocabulary ids, more tokens than
        one sequence's KV stream holds."""
        tokens = self.prompt_tokens
        if not tokens:
            raise EngineError("the prompt is empty", status=400, code="invalid_prompt")
        if self.images:
            self._check_images()
        text = [t for t in tokens if t >= 0] if self.images else tokens
        if any(not 0 <= t < n_vocab for t in text):
            raise EngineError("the prompt holds a token id outside the vocabulary", status=400)
        if len(self.prediction) > n_ctx or any(not 0 <= t < n_vocab for t in self.prediction):
            raise EngineError("the prediction must be at most the context's tokens, each in "
                              "the vocabulary", status=400)
        if not 1 <= self.n <= 128:
            raise EngineError("n must be between 1 and 128", status=400)
        if self.max_tokens < 0:
            raise EngineError("max_tokens may not be negative", status=400)
        # Every choice runs in a KV stream of its own, of n_ctx cells.
        if len(tokens) + self.max_tokens > n_ctx:
            raise EngineError(
                f"the prompt ({len(tokens)} tokens) plus max_tokens ({self.max_tokens}) "
                f"exceeds the context of {n_ctx} tokens",
                status=400,
                code="context_length_exceeded",
            )

    def _check_images(self) -> None:
        """Image placeholders sit exactly where the spans say, and text ends the prompt
        (its last token's logits give the first completion token)."""
        tokens, at = self.prompt_tokens, 0
        for span in self.images:
            if span.start < at or tokens[span.start : span.end] != span.chunk.placeholders:
                raise EngineError("image spans do not match the prompt", status=400)
            at = span.end
        if at >= len(tokens):
            raise EngineError("the prompt must go on with text after its last image",
                              status=400, code="invalid_prompt")
        if sum(1 for t in tokens if t < 0) != sum(s.chunk.n_tokens for s in self.images):
            raise EngineError("the prompt holds a token id outside the vocabulary", status=400)
        if self.prompt_logprobs:
            raise EngineError("prompt tokens of a prompt with images cannot be scored",
                              status=400, code="invalid_request")

    def take_images(self, taken: bool = True) -> None:
        """Marks the prepared images as the engine's (queued: it frees them when the
        request ends), or, with False, as their preparer's again (see image_scope)."""
        for span in self.images:
            span.chunk.taken = taken

    def close(self) -> None:
        """Frees the prepared images (the engine is done with the request)."""
        for span in self.images:
            span.chunk.close()


# Why a choice ended: a stop (EOS, a stop string or token) or its max_tokens.
FinishReason = Literal["stop", "length"]


@dataclass
class ChoiceDelta:
    """New text of one choice since its last delta; finish_reason set on its last one."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None
    stop_word: str = ""  # on the last delta: the stop string that ended it, if one did


@dataclass
class PromptProgress:
    """How far the prompt's evaluation has come (llama-server's `prompt_progress`)."""

    total: int  # prompt tokens
    cached: int  # read from the prefix cache, not evaluated
    processed: int  # evaluated or cached so far, out of `total`
    time_ms: float  # since the request was admitted


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prediction_tokens: int = 0  # the prediction's tokens, once per choice
    prediction_accepted: int = 0  # of them, those the answer followed
    drafted: int = 0  # draft tokens verified (lookups and the draft model's)
    draft_accepted: int = 0  # of them, those kept
    audio_tokens: int = 0  # of the prompt's, those of audio clips


_DONE = object()


class RequestHandle:
    """The caller's side of a submitted request: an async stream of deltas, and cancel()."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.usage = Usage(prompt_tokens=len(request.prompt_tokens),
                           prediction_tokens=len(request.prediction) * request.n,
                           audio_tokens=sum(span.chunk.n_tokens for span in request.images
                                            if span.chunk.kind == "audio"))
        self.cancelled = False
        # With prompt_logprobs: one entry per prompt token, None for the first.
        self.prompt_logprobs: list[TokenLogprob | None] = []
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._first: list[object] | None = None  # the first step's items, once peeked
        self._finished = False
        self.submitted_at = time.monotonic()

    # Engine thread side --------------------------------------------------------------

    def post(self, items: list[object]) -> None:
        """Called from the engine thread: hand a step's deltas (or an error) to the loop."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, items)

    @staticmethod
    def post_many(batches: list[tuple[RequestHandle, list[object]]]) -> None:
        """Several handles' items in one wake-up of each event loop: a step of eight
        streams costs the loop one callback, not eight."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, list[object]]]] = {}
        for handle, items in batches:
            by_loop.setdefault(handle._loop, []).append((handle, items))
        for loop, group in by_loop.items():
            loop.call_soon_threadsafe(_deliver, group)

    # Event loop side -----------------------------------------------------------------

    def cancel(self) -> None:
        """Ends the request for its caller at once; the engine frees its sequences at
        the next step. Whoever waits on this handle gets EngineCancelled, so no waiter
        (and no model lease it holds) is ever left hanging."""
        if not self.cancelled:
            self.cancelled = True
            self._queue.put_nowait([EngineCancelled()])

    async def started(self) -> None:
        """Waits until the engine answered (first token or error); raises its error.

        Lets a stream choose its HTTP status before sending headers: an error before the
        first token still becomes a proper 4xx/5xx response.
        """
        if self._first is None:
            items = await self._queue.get()
            assert isinstance(items, list)
            self._first = items
        for item in self._first:
            if isinstance(item, EngineError):
                raise item

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """Yields every delta until all choices finish; raises EngineError on failure."""
        async for item in self.events():
            if isinstance(item, ChoiceDelta):
                yield item

    async def events(self) -> AsyncIterator[ChoiceDelta | PromptProgress]:
        """deltas(), with the prompt progress reports of a `return_progress` request."""
        while not self._finished:
            items: object
            if self._first is not None:
                items, self._first = self._first, None
            else:
                items = await self._queue.get()
            assert isinstance(items, list)
            for item in items:
                if item is _DONE:
                    self._finished = True
                elif isinstance(item, EngineError):
                    self._finished = True
                    raise item
                else:
                    assert isinstance(item, ChoiceDelta | PromptProgress)
                    yield item


def _deliver(group: list[tuple[RequestHandle, list[object]]]) -> None:
    for handle, items in group:
        handle._queue.put_nowait(items)


DONE_MARKER = _DONE
