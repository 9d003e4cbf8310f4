"""POST /v1/chat/completions: messages rendered with the model's chat template."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from edge_server.api.common.bounds.prompt_bounds import check_prompt_bytes, check_token_count
from edge_server.api.common.bounds.response_bounds import (
    OFF_LOOP_ENTRIES,
    AnswerShape,
    check_answer_size,
)
from edge_server.api.common.bounds.truncation import Truncated, answer_reserve, fit_messages, wanted
from edge_server.api.common.draft_stats import draft_stats
from edge_server.api.common.llama_fields import grammar_conflict
from edge_server.api.common.logprobs_format import chat_logprobs
from edge_server.api.common.sampling_fields import (
    answer_ceiling_s,
    budgets,
    max_tokens_for,
    sampling_params,
)
from edge_server.api.common.serving import (
    ChoiceResult,
    cancel_on_disconnect,
    collect,
    new_id,
    now,
    submit,
    usage_info,
    wait_started,
)
from edge_server.api.common.sse import sse_response, sse_with_errors
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import invalid, unsupported
from edge_server.api.openai.chat import tools as tooling
from edge_server.api.openai.chat.choice_output import ChoiceOutput, ToolMode
from edge_server.api.openai.chat.control_text import ControlTexts, control_texts
from edge_server.api.openai.chat.family_grammar import family_call_grammar
from edge_server.api.openai.chat.prompt import (
    ChatPrompt,
    MakePrompt,
    PromptRender,
    chat_prompt,
    render_chat,
)
from edge_server.api.openai.chat.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    NamedToolChoice,
)
from edge_server.api.openai.chat.streaming import stream_chat
from edge_server.api.openai.chat.tool_parsers import FORCED, format_for_template, think_markers
from edge_server.api.openai.chat.tool_schema import call_grammar
from edge_server.engine import Engine, GenerationRequest
from edge_server.engine.chat_template import RenderedChat
from edge_server.engine.multimodal.projector import Media
from edge_server.engine.request import RequestHandle


@dataclass
class _Plan:
    """What this request needs beyond plain generation."""

    tools: ToolMode | None  # how the answer is read for calls; None: it is all content
    split_reasoning: bool
    reasoning_opened: bool  # the prompt already opened a <think> block
    think: tuple[str, str]  # the family's reasoning markers
    # The model's control-token texts, where the answer is parsed: the engine renders
    # them for the parsers, and they are taken out of what the caller is shown.
    controls: ControlTexts | None = None

    def outputs(self, n: int) -> list[ChoiceOutput]:
        return [
            ChoiceOutput(
                split_reasoning=self.split_reasoning,
                reasoning_opened=self.reasoning_opened,
                tools=self.tools,
                think=self.think,
                controls=self.controls,
            )
            for _ in range(n)
        ]


@dataclass
class PreparedChat:
    request: GenerationRequest
    plan: _Plan
    truncated: Truncated = field(default_factory=Truncated)  # what the prompt lost to fit


def _check_openai_fields(req: ChatCompletionRequest) -> None:
    """OpenAI's fields for what this server does not do, at values that ask for it."""
    if req.store:
        raise unsupported("store", "must be false: this server stores no completions")
    if req.service_tier not in (None, "auto", "default"):
        raise unsupported("service_tier", f"{req.service_tier!r} is not served: one tier")
    if req.verbosity not in (None, "medium"):
        raise unsupported("verbosity", "other than `medium` is not served")
    if req.modalities is not None and req.modalities != ["text"]:
        raise unsupported("modalities", "may only be [\"text\"]: this server writes text")
    if req.audio is not None:
        raise unsupported("audio", "is not served: this server writes text")
    if req.web_search_options is not None:
        raise unsupported("web_search_options", "is not served: this server does not "
                          "search the web")


def _check_fields(req: ChatCompletionRequest) -> None:
    _check_openai_fields(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs", "top_logprobs needs logprobs: true")
    choice = req.tool_choice
    if choice is not None and choice != "none" and not req.tools:
        raise invalid("tool_choice", "tool_choice needs `tools`")
    if isinstance(choice, NamedToolChoice):
        name = choice.function.get("name")
        if name not in {t.function.name for t in req.tools or []}:
            raise invalid("tool_choice", f"no tool named {name!r} in `tools`")


def prediction_tokens(req: ChatCompletionRequest, engine: Engine) -> list[int]:
    """The predicted output's tokens, read as plain text (control-token text included),
    bounded as prompts are."""
    if req.prediction is None:
        return []
    text = req.prediction.text
    check_prompt_bytes(text, engine, "prediction")
    tokens = engine.tokenize(text, add_special=False, parse_special=False)
    check_token_count(len(tokens), engine, "prediction")
    return tokens


def _fitted_prompt(req: ChatCompletionRequest, engine: Engine, render: PromptRender,
                   n_ctx: int | None) -> tuple[ChatPrompt, Truncated]:
    """The chat's prompt, its oldest turns dropped to fit where truncation is asked for
    (the request's `truncation`, else the server's)."""
    def build(messages: list[ChatMessage]) -> ChatPrompt:
        return chat_prompt(*render(messages), engine)

    asked = None if req.truncation is None else req.truncation == "auto"
    if not wanted(asked, engine):
        return build(req.messages), Truncated()
    context = engine.n_ctx if n_ctx is None else min(n_ctx, engine.n_ctx)
    budget = context - answer_reserve(context, req.max_tokens)
    return fit_messages(req.messages, budget, build)


def prepare(req: ChatCompletionRequest, engine: Engine,
            make_prompt: MakePrompt | None = None, *, n_ctx: int | None = None
            ) -> PreparedChat:
    """Everything before the engine: checks, grammars, the rendered and tokenized prompt.
    CPU-bound (templates, tokenizer, schema conversion), so it runs off the event loop.
    `make_prompt`: how the messages become the prompt, where not simply rendered and
    tokenized (a stored Responses turn continued: responses/continuation.py). `n_ctx`:
    the request's own context where smaller than one sequence's (Ollama's num_ctx)."""
    legacy = tooling.apply_legacy_functions(req)
    _check_fields(req)
    sampling = sampling_params(req, engine)
    tools = tooling.active_tools(req)
    forced = bool(tools) and req.tool_choice not in (None, "auto")
    template = engine.chat_template
    fmt = format_for_template(template.source, template.renders_tools)
    if forced:
        if sampling.grammar is not None:
            raise grammar_conflict("tool_choice")
        # The call is written the family's way where this server knows it, else bare.
        grammar = family_call_grammar(tools, fmt, call_grammar(tools))
        fmt = fmt if grammar is not None else FORCED
        sampling = dataclasses.replace(sampling, grammar=grammar or call_grammar(tools))

    def render(messages: list[ChatMessage]) -> tuple[RenderedChat, dict[str, Media]]:
        return render_chat(messages, engine, tools, template_kwargs=req.template_kwargs)

    truncated = Truncated()
    if make_prompt is not None:
        prompt = make_prompt(req.messages, render)
    else:
        prompt, truncated = _fitted_prompt(req, engine, render, n_ctx)
    request = GenerationRequest(
        prompt_tokens=prompt.tokens,
        max_tokens=max_tokens_for(req, len(prompt.tokens), engine, None),
        sampling=sampling,
        stop=req.stop_list,
        include_stop=bool(req.include_stop_str_in_output),
        n=req.n or 1,
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        images=prompt.images,
        draft=req.draft is not False,
        prediction=prediction_tokens(req, engine),
        max_answer_s=answer_ceiling_s(req, engine, None),
        **budgets(req),
    )
    check_answer_size(AnswerShape(prompts=1, choices=request.n, echoed_tokens=0,
                                  echoed_bytes=0, max_tokens=request.max_tokens,
                                  alternatives=request.logprobs),
                      engine.max_token_bytes, logprobs_param="top_logprobs")
    mode = None
    if tools:
        mode = ToolMode(
            names=tuple(t.function.name for t in tools),
            fmt=fmt,
            forced=forced,
            # A forced call's grammar allows one call; the legacy API had no parallel calls.
            max_calls=1 if forced or legacy or req.parallel_tool_calls is False else None,
            legacy=legacy,
            schemas={t.function.name: t.function.parameters or {} for t in tools},
        )
    think = think_markers(template.source)
    # A forced call's grammar starts the answer with the call, never inside reasoning.
    opened = prompt.text.rstrip().endswith(think[0].rstrip()) and not forced
    plan = _Plan(mode, bool(req.separate_reasoning), opened, think)
    if mode is not None or plan.split_reasoning:
        # Call markers (and some families' reasoning markers) are control tokens.
        request.render_control = True
        plan.controls = control_texts(engine.vocab)
    return PreparedChat(request, plan, truncated)


class ChatServing:
    async def create(self, req: ChatCompletionRequest, engine: Engine, http: Request) -> Response:
        prepared = await off_loop(prepare, req, engine)
        plan = prepared.plan
        n = prepared.request.n
        handle = submit(engine, prepared.request, http)
        meta: dict[str, Any] = {
            "id": new_id("chatcmpl"), "created": now(), "model": engine.model_id
        }
        if req.stream:
            await wait_started(http, [handle])
            events = stream_chat(req, engine, http, handle, meta, plan.outputs(n))
            return prepared.truncated.apply(sse_response(sse_with_errors(events), [handle]))
        async with cancel_on_disconnect(http, [handle]):
            results = await collect(handle, n)
        entries = sum(len(r.token_ids) for r in results) * (1 + (req.top_logprobs or 0))
        if entries < OFF_LOOP_ENTRIES:
            body = _body(req, engine, plan, handle, results, meta)
        else:  # megabytes of JSON: built where it stalls no stream
            body = await off_loop(_body, req, engine, plan, handle, results, meta)
        return prepared.truncated.apply(Response(body, media_type="application/json"))


def _body(req: ChatCompletionRequest, engine: Engine, plan: _Plan, handle: RequestHandle,
          results: list[ChoiceResult], meta: dict[str, Any]) -> bytes:
    n = len(results)
    choices = []
    for i, (result, output) in enumerate(zip(results, plan.outputs(n), strict=True)):
        output.push(result.text)
        output.finish()
        choices.append(
            ChatChoice(
                index=i,
                message=output.message(),
                finish_reason=output.finish_reason(result.finish_reason),
                logprobs=chat_logprobs(result.logprobs, engine.vocab) if req.logprobs else None,
            )
        )
    body = ChatCompletionResponse(
        **meta,
        system_fingerprint=engine.fingerprint,
        choices=choices,
        usage=usage_info(handle.usage),
    )
    payload = body.model_dump(exclude_none=True)
    if req.draft_model is not None:
        payload["stats"] = draft_stats(req.draft_model, handle.usage)
    for choice in payload["choices"]:
        choice.setdefault("logprobs", None)
        choice["message"].setdefault("content", None)
    return json.dumps(payload, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode()
