"""Schemas of POST /v1/completions (OpenAI text completions, with the Fireworks and
Novita extensions of ../shared/api)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from edge_server.api.common.protocol import SamplingRequest, UsageInfo
from edge_server.api.http.limits import MAX_IMAGES, MAX_PROMPTS, token_ids

Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    suffix: str | None = None
    echo: bool | None = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    best_of: int | None = Field(default=None, ge=1, le=128)
    images: list[str] | None = Field(default=None, max_length=MAX_IMAGES)

    # json_schema_input_type: the published schema still says what `prompt` may be.
    @field_validator("prompt", mode="plain", json_schema_input_type=Prompt)
    @classmethod
    def _prompt(cls, v: Any) -> Prompt:
        # Checked here rather than by pydantic's union: that tries each form in turn and
        # reports every item of a long token list that fails one, taking seconds.
        if isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("must be a string, a list of strings or a list of token ids")
        if not v or type(v[0]) is int:
            return token_ids(v, max_items=None)  # one prompt
        if len(v) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request")
        if all(isinstance(p, str) for p in v):
            return v
        return [token_ids(p, max_items=None) for p in v]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
