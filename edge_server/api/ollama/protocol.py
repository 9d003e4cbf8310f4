"""Request schemas of Ollama's API (docs/api.md of the Ollama project).

Unknown fields are refused by name (a 400 naming the field), so nothing a client sends
is silently dropped; `options` are checked one by one in options.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_server.api.http.limits import (
    MAX_IMAGES,
    MAX_MESSAGES,
    MAX_OBJECT_KEYS,
    MAX_TOOL_CALLS,
    MAX_TOOLS,
)
from edge_server.api.openai.chat.protocol import FunctionDef

_STRICT = ConfigDict(extra="forbid")
MAX_EMBED_INPUTS = 2048  # as /v1/embeddings
MAX_MODELFILE_CHARS = 262_144
ModelName = Annotated[str, Field(min_length=1, max_length=512)]
# A name /api/copy gives: listed by /v1/models and /api/tags, so kept short.
CopiedName = Annotated[str, Field(min_length=1, max_length=200)]
# `format`: "json", a JSON schema, or "" / absent for free text.
Format = Literal["", "json"] | dict[str, Any] | None
# `keep_alive`: seconds, or a duration such as "5m" (options.keep_alive_seconds).
KeepAlive = float | Annotated[str, Field(max_length=64)] | None
# `think`: on or off, or a level (translate.THINK_EFFORT: chat's reasoning_effort).
Think = bool | Literal["low", "medium", "high", "max"] | None
Options = Annotated[dict[str, Any], Field(max_length=64)] | None
Images = Annotated[list[str], Field(max_length=MAX_IMAGES)] | None


class _NamedByModel(BaseModel):
    """Older clients name the model `name`; both are read."""

    model_config = _STRICT

    @model_validator(mode="before")
    @classmethod
    def _legacy_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "model" not in data and isinstance(data.get("name"), str):
            data = {**data, "model": data["name"]}
            del data["name"]
        return data


class CallFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=256)
    arguments: Annotated[dict[str, Any], Field(max_length=MAX_OBJECT_KEYS)] = Field(
        default_factory=dict)
    index: int | None = None  # where a stream placed it; order is the list's


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(default=None, max_length=256)
    type: Literal["function"] | None = None
    function: CallFunction


class Message(BaseModel):
    model_config = _STRICT
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: Images = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOL_CALLS)] | None = None
    thinking: str | None = None  # earlier reasoning: the turn's reasoning_content
    tool_name: str | None = Field(default=None, max_length=64)
    tool_call_id: str | None = Field(default=None, max_length=256)


class Tool(BaseModel):
    model_config = _STRICT
    type: Literal["function"] = "function"
    function: FunctionDef


class _GenerationFields(_NamedByModel):
    model: ModelName
    format: Format = None
    options: Options = None
    stream: bool | None = True  # Ollama streams unless told not to
    keep_alive: KeepAlive = None
    think: Think = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # Ollama's: cut a prompt that outgrows the context (absent: the server's
    # --truncation, off by default, where Ollama's default is on), and shift the context
    # when the answer runs out of room (accepted; an answer here ends at the context's
    # end, done_reason "length", either way).
    truncate: bool | None = None
    shift: bool | None = None


class ChatRequest(_GenerationFields):
    messages: Annotated[list[Message], Field(max_length=MAX_MESSAGES)] = Field(
        default_factory=list)
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None


class GenerateRequest(_GenerationFields):
    prompt: str | None = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = Field(default=None, max_length=65_536)
    context: Annotated[list[int], Field(max_length=1_000_000)] | None = None
    raw: bool | None = False
    images: Images = None


class EmbedRequest(_NamedByModel):
    model: ModelName
    input: str | Annotated[list[str], Field(max_length=MAX_EMBED_INPUTS)]
    truncate: bool | None = True
    options: Options = None
    keep_alive: KeepAlive = None
    dimensions: int | None = Field(default=None, ge=1)


class EmbeddingsRequest(_NamedByModel):
    """The legacy /api/embeddings: one prompt, one vector."""

    model: ModelName
    prompt: str | None = ""
    options: Options = None
    keep_alive: KeepAlive = None


class ModelRequest(_NamedByModel):
    """/api/show and /api/delete."""

    model: ModelName
    verbose: bool | None = None  # show: also the tokenizer's long arrays


class CopyRequest(BaseModel):
    model_config = _STRICT
    source: ModelName
    destination: CopiedName


class CreateRequest(_NamedByModel):
    """/api/create in both of Ollama's shapes: a Modelfile's text (`modelfile`, before
    0.5), or its parts as fields (`from`, `files`, `template`, `system`, `parameters`).
    The fields for what is not done here are read so as to be refused by name."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    model: ModelName
    stream: bool | None = True
    modelfile: str | None = Field(default=None, max_length=MAX_MODELFILE_CHARS)
    from_: str | None = Field(default=None, alias="from", max_length=1024)
    files: Annotated[dict[str, str], Field(max_length=16)] | None = None
    template: str | None = Field(default=None, max_length=65_536)
    system: str | None = Field(default=None, max_length=65_536)
    parameters: Options = None
    # LoRA adapters: file name to the digest of its uploaded blob (the ollama clients').
    adapters: Annotated[dict[str, str], Field(max_length=16)] | None = None
    # Refused when given (create.py names each).
    path: Any = None
    quantize: Any = None
    quantization: Any = None
    messages: Any = None
    license: Any = None
    draft_quantize: Any = None
    draft_files: Any = None
    remote_host: Any = None
    renderer: Any = None
    parser: Any = None
    requires: Any = None
    info: Any = None


class PullRequest(_NamedByModel):
    model: ModelName
    insecure: bool | None = None  # accepted: the hub is reached over HTTPS (or HF_ENDPOINT)
    stream: bool | None = True


# --- responses (the shapes /openapi.json documents) -------------------------------------

class OllamaError(BaseModel):
    """Every error body on /api/*, as Ollama shapes it."""

    error: str


class _Final(BaseModel):
    model: str
    created_at: str
    done: bool
    done_reason: Literal["stop", "length", "load", "unload"] | None = None
    total_duration: int | None = None  # nanoseconds, as every duration here
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    logprobs: list[dict[str, Any]] | None = None


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    thinking: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatResponse(_Final):
    message: ResponseMessage


class GenerateResponse(_Final):
    response: str
    thinking: str | None = None
    context: list[int] | None = None


class EmbedResponse(BaseModel):
    model: str
    embeddings: list[list[float]]
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None


class EmbeddingsResponse(BaseModel):
    embedding: list[float]


class ModelDetails(BaseModel):
    parent_model: str = ""
    format: str
    family: str
    families: list[str] | None = None
    parameter_size: str
    quantization_level: str


class ListedModel(BaseModel):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails


class TagsResponse(BaseModel):
    models: list[ListedModel]


class RunningModel(ListedModel):
    expires_at: str
    size_vram: int
    context_length: int


class RunningResponse(BaseModel):
    models: list[RunningModel]


class ShowResponse(BaseModel):
    modelfile: str
    parameters: str
    template: str
    system: str | None = None  # a created model's SYSTEM
    license: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class VersionResponse(BaseModel):
    version: str


class ProgressResponse(BaseModel):
    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None
