"""Schemas of the Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens).

Unknown top-level fields are refused by name, as Anthropic does. Content blocks accept
fields they do not know (a replayed response block may carry newer ones) and ignore
them, as they ignore `cache_control` (the prefix cache works without hints).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edge_server.api.http.limits import (
    INT32_MAX,
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_STOP,
    MAX_TOOLS,
    check_stops,
)

_BLOCK = ConfigDict(extra="allow")


class TextBlock(BaseModel):
    model_config = _BLOCK
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ImageBlock(BaseModel):
    """An image block (its `source`: base64 data or a URL) becomes an image_url part of
    the chat request; the other kinds are recognized only to be refused by name."""

    model_config = _BLOCK
    type: Literal["image", "document", "search_result", "container_upload"]


ResultPart = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolUseBlock(BaseModel):
    model_config = _BLOCK
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(BaseModel):
    model_config = _BLOCK
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[ResultPart] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


class ThinkingBlock(BaseModel):
    """Earlier reasoning, replayed: an assistant turn's `reasoning_content`, which the
    templates that keep earlier reasoning render (redacted thinking has no text)."""

    model_config = _BLOCK
    type: Literal["thinking", "redacted_thinking"]
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock,
    Field(discriminator="type"),
]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str | Annotated[list[ContentBlock], Field(max_length=MAX_CONTENT_PARTS)]


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Anthropic's server tools (bash_20250124, web_search_…) have a type and no schema.
    type: str | None = None
    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    strict: bool | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError('tool_choice of type "tool" needs `name`')
        return self


class Thinking(BaseModel):
    """`budget_tokens` is checked as Anthropic checks it, not enforced: max_tokens bounds
    thinking and answer together; `display` is accepted (thinking is always shown)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=1024, le=INT32_MAX)
    display: Literal["summarized", "omitted"] | None = None

    @property
    def on(self) -> bool:
        return self.type != "disabled"

    @model_validator(mode="after")
    def _budget(self) -> Thinking:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError('thinking of type "enabled" needs `budget_tokens`')
        return self


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # accepted
    format: OutputFormat | None = None  # enforced with a grammar, as response_format is


class Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: str | None = Field(default=None, max_length=256)


class CountTokensRequest(BaseModel):
    """What a prompt is made of; also the start of every /v1/messages request."""

    model_config = ConfigDict(extra="forbid")
    model: str
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | Annotated[list[TextBlock], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    tools: list[ToolDef] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    # Known, but they change what Anthropic would do: refused by name when given.
    mcp_servers: Any = None
    context_management: Any = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1, le=INT32_MAX)
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_STOP)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1, le=INT32_MAX)
    stream: bool | None = False
    metadata: Metadata | None = None  # accepted; nothing here tracks users
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here
    container: Any = None  # refused when given (no code execution here)
    output_config: OutputConfig | None = None
    # This server's own: false turns lookup drafting off for this request (docs/performance.md).
    draft: bool | None = None
    # Accepted and ignored: they change nothing a client can observe here.
    cache_control: dict[str, Any] | None = None
    speed: Literal["standard", "fast"] | None = None
    inference_geo: str | None = None
    diagnostics: dict[str, Any] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        return check_stops(v)

    @model_validator(mode="after")
    def _budget_below_max(self) -> MessagesRequest:
        thinking = self.thinking
        if thinking and thinking.budget_tokens is not None and thinking.type == "enabled" \
                and thinking.budget_tokens >= self.max_tokens:
            raise ValueError("`max_tokens` must be greater than `thinking.budget_tokens`")
        return self


# --- responses ---------------------------------------------------------------------------

class ResponseTextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ResponseToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ResponseThinkingBlock(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class MessagesUsage(BaseModel):
    input_tokens: int  # not read from the prefix cache
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class MessagesResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ResponseTextBlock | ResponseToolUseBlock | ResponseThinkingBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None = None
    usage: MessagesUsage


class CountTokensResponse(BaseModel):
    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Every error body on /v1/messages*, as Anthropic shapes it."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
