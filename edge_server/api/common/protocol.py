"""Request and response fields shared by /v1/completions and /v1/chat/completions.

Ranges follow ../shared/api/FIELDS.md. Unknown fields are accepted (as OpenAI does) and
logged by the router, never silently acted on.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edge_server.api.http.limits import (
    INT32_MAX,
    MAX_CACHE_KEY_CHARS,
    MAX_LOGIT_BIAS,
    MAX_STOP,
    MAX_STOP_CHARS,
)
from edge_server.catalogue.default_model import DEFAULT_ALIAS
from edge_server.engine.backend.lora import MAX_ADAPTERS, MAX_SCALE
from edge_server.engine.grammar.limits import MAX_GRAMMAR_CHARS

# Longest time budget a request may set (t_max_prompt_ms, t_max_predict_ms): a day.
MAX_BUDGET_MS = 86_400_000

# Token ids as OpenAI writes them: ASCII digits only (str.isdigit() also takes "²").
_TOKEN_ID = re.compile(r"-?[0-9]{1,10}")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field(default="response", max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = False


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JSONSchemaFormat | None = None
    # Fireworks' json_object may carry a schema of its own.
    object_schema: dict[str, Any] | None = Field(default=None, alias="schema")


class LoraChoice(BaseModel):
    """One adapter of llama-server's per-request `lora` list: its id (GET /lora-adapters)
    and scale; adapters the list leaves out are off for the request."""

    model_config = ConfigDict(extra="forbid")

    id: int = Field(ge=0, lt=MAX_ADAPTERS)
    scale: float = Field(ge=-MAX_SCALE, le=MAX_SCALE, allow_inf_nan=False)


class SamplingRequest(BaseModel):
    """Fields both endpoints accept."""

    model_config = ConfigDict(extra="allow")

    # Optional, as llama-server has it: absent means the model served by default.
    model: str = DEFAULT_ALIAS
    max_tokens: int | None = Field(default=None, ge=1)
    context_length_exceeded_behavior: Literal["truncate", "error"] = "truncate"
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=1, ge=1, le=128)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1, le=INT32_MAX)  # a C int32
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, lt=2.0)
    mirostat_target: float | None = Field(default=None, gt=0.0, le=100.0)
    mirostat_lr: float | None = Field(default=None, gt=0.0, le=1.0)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    include_stop_str_in_output: bool | None = False  # opt-in: keep the stop text (Novita)
    ignore_eos: bool | None = False
    # false: no lookup drafting while this request generates (one-row numerics).
    draft: bool | None = True
    response_format: ResponseFormat | None = None
    user: str | None = None
    # OpenAI's routing hint: a load balancer hashes it to keep a conversation on the replica
    # that caches its prefix (here the KV cache already matches prefixes by content).
    prompt_cache_key: str | None = Field(default=None, max_length=MAX_CACHE_KEY_CHARS)

    # llama-server's fields (see llama_fields.py for the ones not declared here).
    grammar: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)  # GBNF text
    json_schema: dict[str, Any] | None = None  # as response_format's schema, not strict
    n_predict: int | None = Field(default=None, ge=-1, le=INT32_MAX)  # -1: what fits
    repeat_penalty: float | None = Field(default=None, gt=0.0, lt=2.0)
    # Tokens the penalties look back over (-1: the whole context); at most the context's
    # (model_bounds).
    repeat_last_n: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    mirostat: Literal[0, 2] | None = None  # 2: mirostat v2 with tau and eta below
    mirostat_tau: float | None = Field(default=None, gt=0.0, le=100.0)
    mirostat_eta: float | None = Field(default=None, gt=0.0, le=1.0)
    n_cmpl: int | None = Field(default=None, ge=1, le=128)  # llama-server's `n`
    # The prefix cache is always on: `false` cannot be honoured.
    cache_prompt: Literal[True] | None = None
    return_progress: bool | None = False  # streams: prompt_progress events
    n_indent: int | None = Field(default=None, ge=0, le=256)
    t_max_prompt_ms: int | None = Field(default=None, ge=-1, le=MAX_BUDGET_MS)
    t_max_predict_ms: int | None = Field(default=None, ge=-1, le=MAX_BUDGET_MS)
    lora: list[LoraChoice] | None = Field(default=None, max_length=MAX_ADAPTERS)
    # LM Studio's: the model's draft model by name; the answer then carries `stats`.
    draft_model: str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _llama_server_aliases(self) -> SamplingRequest:
        """llama-server's names for fields this request already has."""
        # (n_predict 0 stays as it is: see prompt_only.)
        if self.n_predict and self.n_predict > 0 and self.max_tokens is None:
            self.max_tokens = self.n_predict
        if self.repeat_penalty is not None and self.repetition_penalty is None:
            self.repetition_penalty = self.repeat_penalty
        if self.mirostat == 2:
            self.mirostat_target = self.mirostat_tau or 5.0  # llama-server's defaults
            self.mirostat_lr = self.mirostat_eta or 0.1
        if self.n_cmpl is not None and "n" not in self.model_fields_set:
            self.n = self.n_cmpl
        return self

    @field_validator("lora")
    @classmethod
    def _each_adapter_once(cls, v: list[LoraChoice] | None) -> list[LoraChoice] | None:
        ids = [choice.id for choice in v or []]
        if len(set(ids)) < len(ids):
            raise ValueError("each adapter id may appear once")
        return v

    @property
    def lora_scales(self) -> dict[int, float] | None:
        """The adapters asked for (None: the model's default scales, as for an empty list
        in llama-server)."""
        return {c.id: c.scale for c in self.lora} if self.lora else None

    @property
    def prompt_only(self) -> bool:
        """n_predict 0: evaluate (and cache) the prompt, generate nothing."""
        return self.n_predict == 0 and self.max_tokens is None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        for stop in stops:
            if not stop:
                raise ValueError("a stop sequence may not be empty")
            if len(stop) > MAX_STOP_CHARS:
                raise ValueError(f"a stop sequence may be at most {MAX_STOP_CHARS} characters")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (v or {}).items():
            if not _TOKEN_ID.fullmatch(key):
                raise ValueError(f"keys must be token ids, got {key[:32]!r}")
            if not math.isfinite(value) or not -100.0 <= value <= 100.0:
                raise ValueError(f"bias for token {key} must be between -100 and 100")
        return v

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0
    audio_tokens: int = 0  # of audio clips (as OpenAI counts them)


class CompletionTokensDetails(BaseModel):
    # With a prediction: its tokens the answer followed, and the rest.
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None
