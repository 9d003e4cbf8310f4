"""Schemas of POST /v1/chat/completions (OpenAI chat, with the Novita extensions of
../shared/api)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from edge_server.api.common.protocol import SamplingRequest, UsageInfo
from edge_server.api.http.limits import (
    MAX_CONTENT_PARTS,
    MAX_JSON_DEPTH,
    MAX_MESSAGES,
    MAX_TOOL_CALLS,
    MAX_TOOLS,
    nesting_depth,
    within_depth,
)

# chat_template_kwargs: extra variables for the chat template (llama-server's and vLLM's
# field). Names the server itself gives the template cannot be replaced.
MAX_TEMPLATE_KWARGS = 32
_TEMPLATE_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_SERVER_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token",
                               "eos_token"})


def _template_kwargs(value: dict[str, Any]) -> dict[str, Any]:
    if len(value) > MAX_TEMPLATE_KWARGS:
        raise ValueError(f"at most {MAX_TEMPLATE_KWARGS} template variables")
    for key in value:
        if not _TEMPLATE_VARIABLE.fullmatch(key):
            raise ValueError(f"{key[:64]!r} is not a template variable name (letters, "
                             "digits and _, up to 64)")
        if key in _SERVER_VARIABLES:
            raise ValueError(f"`{key}` is set by the server; send it as its own field")
    if not isinstance(value.get("enable_thinking", True), bool):
        raise ValueError("`enable_thinking` must be true or false")
    return value


TemplateKwargs = Annotated[dict[str, Any], AfterValidator(_template_kwargs)]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "image_url", "video_url", "input_audio", "file"]
    text: str | None = None
    image_url: dict[str, Any] | str | None = None
    video_url: dict[str, Any] | str | None = None
    input_audio: dict[str, Any] | None = None
    # {"file_data": a data URL of a text or PDF file, "filename"} (common/documents.py)
    file: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _text_present(self) -> ContentPart:
        if self.type == "text" and self.text is None:
            raise ValueError("a text part needs `text`")
        return self


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=256)
    # A JSON string (OpenAI); an object is accepted too and serialized.
    arguments: str

    @field_validator("arguments", mode="before")
    @classmethod
    def _serialized(cls, v: Any) -> Any:
        return json.dumps(v, ensure_ascii=False) if isinstance(v, dict) else v

    @field_validator("arguments")
    @classmethod
    def _within_depth(cls, v: str) -> str:
        # As an object they could nest no deeper than the rest of the body: a string
        # is held to the same bound, counted without parsing it.
        if nesting_depth(v) > MAX_JSON_DEPTH:
            raise ValueError(f"the arguments nest deeper than the {MAX_JSON_DEPTH} levels "
                             "a request body may")
        return v

    def parsed_arguments(self) -> Any:
        """The arguments as an object where they are one (what templates expect), else
        the string as given."""
        try:
            value = json.loads(self.arguments)
        except (ValueError, RecursionError):
            return self.arguments
        return value if isinstance(value, dict) and within_depth(value) else self.arguments


class ToolCall(BaseModel):
    """A call of an earlier assistant turn, as the client replays it."""

    model_config = ConfigDict(extra="allow")
    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    # "function": the legacy form of "tool", read as one (see ChatCompletionRequest).
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | Annotated[list[ContentPart], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    name: str | None = Field(default=None, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_TOOL_CALLS)
    tool_call_id: str | None = Field(default=None, max_length=256)
    function_call: FunctionCall | None = None  # legacy: one call, no id
    # An assistant turn's reasoning, replayed: templates that keep it render it.
    reasoning_content: str | None = None

    @property
    def reasoning(self) -> str | None:
        """The turn's reasoning, under the field names clients give it (`reasoning`,
        `thinking`: the names transformers also reads)."""
        if self.reasoning_content is not None:
            return self.reasoning_content
        extra = self.model_extra or {}
        return next((v for v in (extra.get("reasoning"), extra.get("thinking"))
                     if isinstance(v, str)), None)

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        calls = self.tool_calls or self.function_call
        if self.content is None and not (self.role == "assistant" and calls):
            raise ValueError(
                "`content` is required (it may be null only for assistant messages with "
                "tool_calls or function_call)"
            )
        return self


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: dict[str, str]


class FunctionName(BaseModel):
    """The legacy `function_call: {"name": …}`."""

    name: str


class Prediction(BaseModel):
    """OpenAI's predicted output: text the answer is expected to repeat (a file being
    edited). It shapes drafting only, never the answer."""

    type: Literal["content"]
    content: str | Annotated[list[ContentPart], Field(max_length=MAX_CONTENT_PARTS)]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v: str | list[ContentPart]) -> str | list[ContentPart]:
        if not isinstance(v, str) and any(part.type != "text" for part in v):
            raise ValueError("a prediction's parts must be text")
        return v


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # The legacy forms of tools / tool_choice (older OpenAI clients).
    functions: list[FunctionDef] | None = Field(default=None, min_length=1, max_length=MAX_TOOLS)
    function_call: Literal["none", "auto"] | FunctionName | None = None
    separate_reasoning: bool | None = False
    # None: not asked, the template's own default holds (it is passed only when given).
    enable_thinking: bool | None = None
    prediction: Prediction | None = None
    # OpenAI's reasoning models' knob: "none" is enable_thinking false, any other effort
    # true (there is no budget of thinking tokens); enable_thinking, where sent, wins. The
    # effort also reaches the template as `reasoning_effort` (gpt-oss's templates read it).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # OpenAI's fields for what this server does not do: accepted at the values that ask
    # for nothing, refused by name otherwise (chat/serving.py).
    store: bool | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16)
    safety_identifier: str | None = Field(default=None, max_length=256)  # never interpreted
    service_tier: str | None = Field(default=None, max_length=32)
    verbosity: Literal["low", "medium", "high"] | None = None
    modalities: list[str] | None = Field(default=None, max_length=4)
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    # Its `enable_thinking`, where given, wins over the field above.
    chat_template_kwargs: TemplateKwargs | None = None
    # A chat that outgrows the context: "auto" drops its oldest turns, "disabled" is a
    # 400 (the Responses API's field and values); absent, the server's --truncation.
    truncation: Literal["auto", "disabled"] | None = None

    @model_validator(mode="after")
    def _reasoning_effort(self) -> ChatCompletionRequest:
        if self.reasoning_effort is not None and self.enable_thinking is None:
            self.enable_thinking = self.reasoning_effort != "none"
        return self

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """The variables the caller asked the chat template for, and only those (a
        template's defaults hold otherwise): `enable_thinking` where sent or implied by
        `reasoning_effort`, the effort itself, then chat_template_kwargs, whose own
        values win."""
        asked: dict[str, Any] = {}
        if self.enable_thinking is not None:
            asked["enable_thinking"] = self.enable_thinking
        if self.reasoning_effort is not None:
            asked["reasoning_effort"] = self.reasoning_effort
        return {**asked, **(self.chat_template_kwargs or {})}

    @model_validator(mode="after")
    def _completion_tokens_alias(self) -> ChatCompletionRequest:
        # Newer OpenAI clients send max_completion_tokens in place of max_tokens.
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self

    @model_validator(mode="after")
    def _legacy_messages(self) -> ChatCompletionRequest:
        """An assistant's `function_call` is read as its one tool call, and a "function"
        message as the "tool" message answering it (the id links the two, as templates
        expect; 9 letters and digits, which Mistral's templates insist on)."""
        last_id: str | None = None
        for i, message in enumerate(self.messages):
            if message.role == "assistant" and message.function_call and not message.tool_calls:
                last_id = f"call{i:05d}"
                message.tool_calls = [ToolCall(id=last_id, function=message.function_call)]
            elif message.role == "function":
                message.role = "tool"
                if message.tool_call_id is None:
                    message.tool_call_id = last_id
        return self


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, str] | None = None  # legacy requests (`functions`)


# Calls end an answer with `tool_calls` (`function_call` for the legacy functions).
ChatFinishReason = Literal["stop", "length", "tool_calls", "function_call"]


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: ChatFinishReason | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: UsageInfo | None = None
