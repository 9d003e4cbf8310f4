"""Schemas of POST /infill (llama-server's infill API, as llama.vscode and llama.vim call
it). Sampling fields, `n_predict`, `n_indent`, `t_max_prompt_ms`, `t_max_predict_ms`,
`stream` and `return_progress` are those of completions (SamplingRequest)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edge_server.api.common.protocol import SamplingRequest

MAX_EXTRA_CHUNKS = 1024  # llama.vscode's ring buffer holds 16 by default


class ExtraChunk(BaseModel):
    """A chunk of another file (or of this one, away from the cursor)."""

    model_config = ConfigDict(extra="forbid")
    text: str
    filename: str = Field(default="tmp", max_length=1024)


class InfillRequest(SamplingRequest):
    input_prefix: str  # the file's text before the cursor
    input_suffix: str  # and after it
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=MAX_EXTRA_CHUNKS)
    prompt: str = ""  # text at the cursor the completion must start with


class InfillTimings(BaseModel):
    """llama-server's `timings` (what the editor plugins show)."""

    cache_n: int  # prompt tokens read from the prefix cache
    prompt_n: int  # prompt tokens evaluated
    prompt_ms: float
    predicted_n: int
    predicted_ms: float


class InfillResponse(BaseModel):
    content: str
    stop: Literal[True] = True
    stop_type: Literal["eos", "word", "limit"]
    model: str
    tokens_predicted: int
    tokens_evaluated: int  # prompt tokens, cached or not
    tokens_cached: int
    truncated: bool  # the prefix, suffix or extra context was cut to fit its window
    timings: InfillTimings
