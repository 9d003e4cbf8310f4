"""A request's sampling fields as the engine's SamplingParams, and its token budgets
(`max_tokens` held to the context, time budgets)."""

from __future__ import annotations

from typing import Any

from edge_server.api.common.bounds.model_bounds import ModelBounds
from edge_server.api.common.grammars import request_grammar
from edge_server.api.common.llama_fields import (
    check_llama_server_fields,
)
from edge_server.api.common.protocol import (
    SamplingRequest,
)
from edge_server.api.http.errors import APIError
from edge_server.engine import (
    Engine,
    SamplingParams,
)


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
    """GenerationRequest's fields from llama-server's budgets and limits (-1 or 0: off),
    its per-request LoRA adapters and LM Studio's per-request draft model."""
    def ms(value: int | None) -> float | None:
        return float(value) if value is not None and value > 0 else None

    return {
        "return_progress": bool(req.return_progress) and bool(req.stream),
        "max_prompt_ms": ms(req.t_max_prompt_ms),
        "max_predict_ms": ms(req.t_max_predict_ms),
        "min_indent": req.n_indent or 0,
        "lora": req.lora_scales,
        "draft_model": req.draft_model,
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
        return room  # llama-server's "until the context is full", asked for
    if wanted is None:
        return unbounded_answer_tokens(room, engine)
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


def unbounded_answer_tokens(room: int, engine: Engine) -> int:
    """Tokens an answer whose request set no bound may take: the room its context leaves,
    at most --default-max-tokens where set."""
    ceiling = engine.settings.default_max_tokens
    return min(room, ceiling) if ceiling > 0 else room


def answer_ceiling_s(req: SamplingRequest, engine: Engine, default: int | None) -> float | None:
    """Seconds after submission an answer may run where nobody bounded it (no max_tokens,
    n_predict or t_max_predict_ms, and no protocol default such as /v1/completions' 16
    tokens): --max-answer-seconds, so a request nobody bounded cannot outlast its
    client's timeout on a slow machine; None where bounded, or the ceiling is off."""
    bounded = (default is not None or req.max_tokens is not None or req.n_predict is not None
               or (req.t_max_predict_ms is not None and req.t_max_predict_ms > 0))
    return None if bounded else unbounded_answer_s(engine)


def unbounded_answer_s(engine: Engine) -> float | None:
    """--max-answer-seconds, the time ceiling of an answer nobody bounded (None: off)."""
    ceiling = engine.settings.max_answer_seconds
    return ceiling if ceiling > 0 else None
