"""Schemas of POST /v1/embeddings (OpenAI's embeddings API)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from edge_server.api.http.limits import token_ids
from edge_server.catalogue.default_model import DEFAULT_ALIAS

MAX_EMBEDDING_INPUTS = 2048  # inputs of one request (OpenAI's limit)

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = DEFAULT_ALIAS  # optional, as llama-server has it: the default model
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] | None = "float"
    # Only the model's own width is served (no truncated vectors); checked per model.
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    # json_schema_input_type: the published schema still says what `input` may be.
    @field_validator("input", mode="plain", json_schema_input_type=EmbeddingInput)
    @classmethod
    def _input(cls, v: Any) -> EmbeddingInput:
        # Checked here rather than by pydantic's union: that tries each form in turn and
        # reports every item of a long token list that fails one, taking seconds. Empty
        # inputs and token counts are refused later, naming the input's index.
        if isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("must be a string, a list of strings, a list of token ids or "
                             "a list of token id lists")
        if not v:
            raise ValueError("must not be an empty list")
        if type(v[0]) is int:
            return token_ids(v, max_items=None)  # one input, bounded by the context later
        if len(v) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs per request")
        if all(isinstance(item, str) for item in v):
            return v
        return [token_ids(item, max_items=None) for item in v]

    @property
    def single(self) -> bool:
        """One input (a string or one token list) rather than a list of them."""
        raw = self.input
        return isinstance(raw, str) or type(raw[0]) is int

    @property
    def inputs(self) -> list[str] | list[list[int]]:
        """Every input as a list item: one string or one token list becomes a list of one."""
        return [self.input] if self.single else self.input  # type: ignore[return-value]


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    # A list of floats, or with encoding_format "base64" the little-endian float32 bytes.
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
