"""Schemas of /v1/responses (OpenAI's Responses API).

Input items and content parts keep only the fields this server renders or lists
(`input_items`), among them those the API itself writes on output items (`id`,
`status`): clients replay a response's output as the next request's input. Any other
field of theirs (`annotations`, `logprobs`, a reasoning item's `summary` and
`encrypted_content`, a client's own) is dropped, not refused: the openai SDK and
openai-agents replay output items with fields the API adds over time, and what no
prompt renders is never stored (a stored conversation is bounded by what the model
could render, chain_bound.py). Nested settings (tools, text format) keep their known
fields likewise. Top-level fields are checked by name: a field this server does not
serve is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from edge_server.api.http.limits import (
    MAX_CACHE_KEY_CHARS,
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_TOOLS,
)

# Unknown fields are dropped (see above).
_KNOWN_ONLY = ConfigDict(extra="ignore")
# Ids the API writes are about 50 characters; longer is no id this API gave out.
ItemId = Annotated[str, Field(max_length=256)]
ItemStatus = Annotated[str, Field(max_length=32)]


class InputPart(BaseModel):
    """A content part; text, image, audio and file parts are served (the others are
    refused by name)."""

    model_config = _KNOWN_ONLY
    type: str = Field(max_length=64)
    text: str | None = None
    refusal: str | None = None  # a refusal an assistant turn replays
    image_url: str | None = None  # input_image: a data URL, or an http(s) one
    detail: str | None = Field(default=None, max_length=16)
    # input_audio: {"data": base64 audio, "format": "wav" | "mp3" | "flac" | "ogg"}
    input_audio: dict[str, Any] | None = None
    # input_file: a data URL of a text or PDF file (common/documents.py), and its name;
    # file_id and file_url are refused by name.
    file_data: str | None = None
    filename: str | None = Field(default=None, max_length=256)
    file_id: str | None = Field(default=None, max_length=256)
    file_url: str | None = Field(default=None, max_length=2048)


class MessageItem(BaseModel):
    model_config = _KNOWN_ONLY
    type: Literal["message"] = "message"
    id: ItemId | None = None
    status: ItemStatus | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | Annotated[list[InputPart], Field(max_length=MAX_CONTENT_PARTS)]


class FunctionCallItem(BaseModel):
    model_config = _KNOWN_ONLY
    type: Literal["function_call"]
    id: ItemId | None = None
    status: ItemStatus | None = None
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = _KNOWN_ONLY
    type: Literal["function_call_output"]
    id: ItemId | None = None
    status: ItemStatus | None = None
    call_id: str = Field(min_length=1, max_length=256)
    output: str | Annotated[list[InputPart], Field(max_length=MAX_CONTENT_PARTS)]


class CompactionItem(BaseModel):
    """A compaction item as POST /v1/responses/compact writes it: the conversation so
    far as the model summarised it, opaque to clients (compaction.py)."""

    model_config = _KNOWN_ONLY
    type: Literal["compaction"]
    id: ItemId | None = None
    encrypted_content: str = Field(min_length=1, max_length=1 << 20)
    created_by: str | None = Field(default=None, max_length=256)


class OtherItem(BaseModel):
    """Any other item type: reasoning items are skipped (their text is not replayed, nor
    stored), the rest are refused by name."""

    model_config = _KNOWN_ONLY
    type: str = Field(max_length=64)
    id: ItemId | None = None


def _item_kind(value: Any) -> str:
    if not isinstance(value, dict):
        return "other"
    kind = value.get("type", "message" if "role" in value else None)
    return kind if kind in ("message", "function_call", "function_call_output",
                            "compaction") else "other"


# Tagged by `type` so that an error names the field of the item's own kind.
InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CompactionItem, Tag("compaction")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
]
ITEM_TAGS = ("message", "function_call", "function_call_output", "compaction", "other")


class FunctionTool(BaseModel):
    model_config = _KNOWN_ONLY
    type: str = Field(max_length=64)  # anything but "function" is refused by name
    name: str | None = Field(default=None, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(BaseModel):
    model_config = _KNOWN_ONLY
    type: str = Field(max_length=64)
    name: str | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = Field(default=None, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = _KNOWN_ONLY
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(BaseModel):
    model_config = _KNOWN_ONLY
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(BaseModel):
    model_config = _KNOWN_ONLY
    include_obfuscation: bool | None = None  # nothing is obfuscated here; accepted


class ResponsesRequest(BaseModel):
    # Unknown fields are kept so that the serving layer can refuse them by name.
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | Annotated[list[InputItem], Field(max_length=MAX_MESSAGES)]
    instructions: str | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16
    )
    user: str | None = None
    safety_identifier: str | None = None
    reasoning: ReasoningConfig | None = None
    # None: stored, as OpenAI does (where the server keeps a store at all).
    store: bool | None = None
    previous_response_id: str | None = Field(default=None, max_length=256)
    # Accepted where harmless: clients such as openai-agents send them by default.
    include: list[str] | None = Field(default=None, max_length=16)
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=MAX_CACHE_KEY_CHARS)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    service_tier: str | None = Field(default=None, max_length=32)
    # This server's own: false turns lookup drafting off for this request (docs/performance.md).
    draft: bool | None = None


class Usage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class CompactedResponse(BaseModel):
    """POST /v1/responses/compact's answer: every user message of the conversation, then
    one compaction item standing for all the rest."""

    id: str
    object: Literal["response.compaction"] = "response.compaction"
    created_at: int
    output: list[dict[str, Any]]
    usage: Usage


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """What POST /v1/responses answers (and response.completed carries)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "incomplete", "in_progress"]
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[dict[str, Any]]
    output_text: str | None = None
    usage: Usage | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = False
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float | None = None
    truncation: str = "disabled"
    user: str | None = None
    completed_at: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    max_tool_calls: int | None = None
    background: bool = False
    service_tier: str = "default"
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class InputTokens(BaseModel):
    """What POST /v1/responses/input_tokens answers."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


class DeletedResponse(BaseModel):
    """What DELETE /v1/responses/{id} answers."""

    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


class InputItemList(BaseModel):
    """A page of GET /v1/responses/{id}/input_items: the items, each with its `id`."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
