"""Schemas of llama-server's native POST /completion: the fields of /v1/completions
(llama-server's included), with llama-server's defaults where a request sets nothing."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from edge_server.api.openai.completions.protocol import CompletionRequest

# What llama-server samples with when a request says nothing (its common_params_sampling).
LLAMA_SERVER_SAMPLER = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


class NativeCompletionRequest(CompletionRequest):
    return_tokens: bool = False  # each result's token ids in `tokens`
    # Each token's logprob and the n most likely in its place (completion_probabilities).
    n_probs: int = Field(default=0, ge=0, le=20)

    @field_validator("top_k", mode="before")
    @classmethod
    def _top_k_off(cls, v: Any) -> Any:
        """llama-server's top_k 0 (or below) is no top-k: the whole vocabulary."""
        return None if type(v) is int and v <= 0 else v

    @model_validator(mode="after")
    def _llama_server_defaults(self) -> NativeCompletionRequest:
        for name, value in LLAMA_SERVER_SAMPLER.items():
            if name not in self.model_fields_set:
                setattr(self, name, value)
        if self.max_tokens is None and self.n_predict is None:
            self.n_predict = -1  # until the end of generation or of the context
        return self


class NativeResult(BaseModel):
    """One completion as llama-server answers it (the last event of a stream, too)."""

    index: int
    content: str
    tokens: list[int]
    id_slot: int = -1  # slots are not exposed: each choice has a KV stream of its own
    stop: bool = True
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    generation_settings: dict[str, Any]
    prompt: str
    has_new_line: bool
    truncated: bool = False
    stop_type: str  # eos, word (a stop string), limit (n_predict or the context)
    stopping_word: str
    tokens_cached: int
    timings: dict[str, float]
    completion_probabilities: list[dict[str, Any]] | None = None  # with n_probs
