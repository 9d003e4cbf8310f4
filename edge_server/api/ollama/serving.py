"""POST /api/chat and /api/generate: the request made a chat request (translate) and
prepared exactly as chat completions are, or for raw / `template` / `suffix` generate
requests a text prompt; run on the engine; the answer read through the same
ChoiceOutput and sent as Ollama's objects (streaming.Answer)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_server.api.common.bounds.model_bounds import ModelBounds
from edge_server.api.common.bounds.truncation import Truncated, answer_reserve, fit_tokens, wanted
from edge_server.api.common.protocol import SamplingRequest
from edge_server.api.common.sampling_fields import (
    sampling_params,
    unbounded_answer_s,
    unbounded_answer_tokens,
)
from edge_server.api.common.serving import cancel_on_disconnect, stream_deltas, submit, wait_started
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import APIError, invalid
from edge_server.api.ollama import options as opts
from edge_server.api.ollama import profiles
from edge_server.api.ollama.protocol import ChatRequest, GenerateRequest
from edge_server.api.ollama.streaming import Answer, Clock, line, ndjson_stream, with_error_line
from edge_server.api.ollama.translate import (
    Names,
    chat_request,
    generate_chat_request,
    response_format,
    text_prompt,
)
from edge_server.api.openai.chat.choice_output import ChoiceOutput
from edge_server.api.openai.chat.prompt import ChatPrompt, MakePrompt, PromptRender, chat_prompt
from edge_server.api.openai.chat.protocol import ChatMessage
from edge_server.api.openai.chat.serving import prepare as prepare_chat_completion
from edge_server.engine import Engine, GenerationRequest
from edge_server.engine.request import ImageSpan, RequestHandle


@dataclass
class Prepared:
    request: GenerationRequest
    output: ChoiceOutput
    context: list[int] | None  # generate: the prompt's tokens, given back as `context`
    truncated: Truncated = field(default_factory=Truncated)  # what the prompt lost to fit


def _finish(request: GenerationRequest, sampling: opts.Sampling, engine: Engine) -> None:
    """What the chat request cannot say: Ollama's stop list (longer than OpenAI's), the
    samplers it lacks, and the token budget (num_predict within num_ctx), each held to
    the model's bounds."""
    bounds = ModelBounds.of(engine)
    request.stop = sampling.stop
    request.sampling = dataclasses.replace(
        request.sampling, **sampling.engine_fields,
        penalty_last_n=bounds.repeat_window(sampling.repeat_last_n))
    n_ctx = bounds.context(sampling.num_ctx)
    room = bounds.answer_room(len(request.prompt_tokens),
                              "options.num_ctx" if n_ctx < engine.n_ctx else "prompt", n_ctx)
    wanted = sampling.num_predict
    if sampling.predict_given:
        # -1 (until done) and -2 (fill the context) are bounds the caller chose.
        request.max_answer_s = None
        request.max_tokens = room if wanted is None else min(wanted, room)
    else:
        request.max_tokens = unbounded_answer_tokens(room, engine)
        request.max_answer_s = unbounded_answer_s(engine)


def prepare_chat(req: ChatRequest, engine: Engine, template: str | None = None) -> Prepared:
    """Checks, grammars, the rendered and tokenized prompt; CPU-bound, off the loop.
    `template`: a created model's TEMPLATE, which renders the prompt as text."""
    if template is not None:
        return prepare_generate(profiles.chat_as_text(req, template, engine), engine)
    names = Names()
    try:
        sampling = opts.sampling(req.options)
        chat = chat_request(req, sampling, names)
        chat.max_tokens = sampling.num_predict  # the room a cut to fit leaves
        prepared = prepare_chat_completion(chat, engine, n_ctx=sampling.num_ctx)
        _finish(prepared.request, sampling, engine)
    except APIError as exc:
        raise names.rename(exc) from exc
    return Prepared(prepared.request, prepared.plan.outputs(1)[0], None, prepared.truncated)


def _cut_to_fit(tokens: list[int], sampling: opts.Sampling, engine: Engine
                ) -> tuple[list[int], Truncated]:
    """A generate prompt cut to fit its context, leaving room for the answer: its first
    num_keep tokens (the BOS by default) and its tail."""
    n_ctx = ModelBounds.of(engine).context(sampling.num_ctx)
    bos = int(bool(tokens) and engine.vocab.bos >= 0 and tokens[0] == engine.vocab.bos)
    keep = sampling.num_keep if sampling.num_keep is not None and sampling.num_keep >= 0 \
        else bos
    return fit_tokens(tokens, n_ctx - answer_reserve(n_ctx, sampling.num_predict), keep)


def _fitting_prompt(sampling: opts.Sampling, engine: Engine,
                    truncated: list[Truncated]) -> MakePrompt:
    """chat.serving.prepare's make_prompt for a templated generate asking to truncate:
    its one turn cannot be dropped, so its tokens are cut (not where it holds images: a
    cut could fall inside one; that stays the usual 400)."""
    def make(messages: list[ChatMessage], render: PromptRender) -> ChatPrompt:
        prompt = chat_prompt(*render(messages), engine)
        if not prompt.images:
            prompt.tokens, cut = _cut_to_fit(prompt.tokens, sampling, engine)
            truncated.append(cut)
        return prompt
    return make


def _text_generation(req: GenerateRequest, engine: Engine, sampling: opts.Sampling
                     ) -> tuple[GenerationRequest, ChoiceOutput]:
    tokens = text_prompt(req, engine)
    try:
        fields = SamplingRequest.model_validate(
            {"model": req.model, "response_format": response_format(req.format),
             **sampling.chat_fields})
    except ValidationError as exc:
        raise invalid("format", "`format` must be \"json\" or a JSON schema") from exc
    request = GenerationRequest(
        prompt_tokens=tokens, max_tokens=1, sampling=sampling_params(fields, engine),
        logprobs=(req.top_logprobs or 0) if req.logprobs else None)
    return request, ChoiceOutput(split_reasoning=False, reasoning_opened=False, tools=None)


def _with_context(request: GenerationRequest, context: list[int], engine: Engine) -> None:
    """A previous answer's `context` goes before the new prompt (without a second BOS)."""
    ModelBounds.of(engine).check_token_ids(context, "context")
    tokens = request.prompt_tokens
    if tokens and tokens[0] == engine.vocab.bos and engine.vocab.bos >= 0:
        tokens = tokens[1:]
        request.images = [ImageSpan(s.start - 1, s.chunk) for s in request.images]
    request.prompt_tokens = context + tokens
    request.images = [ImageSpan(s.start + len(context), s.chunk) for s in request.images]


def prepare_generate(req: GenerateRequest, engine: Engine,
                     template: str | None = None) -> Prepared:
    if template is not None and not req.raw and req.template is None and req.suffix is None:
        req = profiles.generate_as_text(req, template, engine)
    names = Names(default="prompt")
    try:
        sampling = opts.sampling(req.options)
        cuts: list[Truncated] = []
        cut = wanted(req.truncate, engine)
        if req.raw or req.template is not None or req.suffix is not None:
            request, output = _text_generation(req, engine, sampling)
        else:
            chat = generate_chat_request(req, sampling, names)
            fitting = _fitting_prompt(sampling, engine, cuts) if cut else None
            prepared = prepare_chat_completion(chat, engine, fitting)
            request, output = prepared.request, prepared.plan.outputs(1)[0]
        if req.context:
            _with_context(request, req.context, engine)
        if cut and not request.images:  # the whole prompt, a previous `context` included
            request.prompt_tokens, last = _cut_to_fit(request.prompt_tokens, sampling, engine)
            cuts.append(last)
        _finish(request, sampling, engine)
    except APIError as exc:
        raise names.rename(exc) from exc
    truncated = Truncated(tokens=sum(c.tokens for c in cuts))
    # Raw prompts give no context back (Ollama's rule: the caller keeps its own).
    return Prepared(request, output, None if req.raw else given_context(request), truncated)


def given_context(request: GenerationRequest) -> list[int]:
    """The prompt's tokens as `context` for the next request: an image's placeholder ids
    (negative, standing for its embedding) are left out, as ids cannot carry the image;
    the next request sends it again to keep it in view."""
    return [t for t in request.prompt_tokens if t >= 0]


async def _objects(answer: Answer, handle: RequestHandle, clock: Clock,
                   context: list[int] | None, http: Request) -> AsyncIterator[str]:
    async with cancel_on_disconnect(http, [handle]):
        async for delta in stream_deltas(handle):
            clock.saw_token()
            obj = answer.feed(delta)
            if obj is not None:
                yield line(obj)
        yield line(answer.final(whole=False, durations=clock.durations(handle.usage),
                                context=context))


async def run(prepared: Prepared, answer: Answer, engine: Engine, http: Request,
              clock: Clock, *, stream: bool) -> Response:
    handle = submit(engine, prepared.request, http)
    clock.mark_submitted()
    if stream:
        await wait_started(http, [handle])
        lines = _objects(answer, handle, clock, prepared.context, http)
        return prepared.truncated.apply(ndjson_stream(with_error_line(lines), [handle]))
    async with cancel_on_disconnect(http, [handle]):
        async for delta in stream_deltas(handle):
            clock.saw_token()
            answer.feed(delta)
    body = answer.final(whole=True, durations=clock.durations(handle.usage),
                        context=prepared.context)
    return prepared.truncated.apply(JSONResponse(body))


class OllamaServing:
    async def chat(self, req: ChatRequest, engine: Engine, http: Request,
                   clock: Clock, template: str | None = None) -> Response:
        prepared = await off_loop(prepare_chat, req, engine, template)
        answer = Answer(chat=True, model=req.model, output=prepared.output,
                        vocab=engine.vocab, logprobs=bool(req.logprobs))
        return await run(prepared, answer, engine, http, clock, stream=req.stream is not False)

    async def generate(self, req: GenerateRequest, engine: Engine, http: Request,
                       clock: Clock, template: str | None = None) -> Response:
        prepared = await off_loop(prepare_generate, req, engine, template)
        answer = Answer(chat=False, model=req.model, output=prepared.output,
                        vocab=engine.vocab, logprobs=bool(req.logprobs))
        return await run(prepared, answer, engine, http, clock, stream=req.stream is not False)
