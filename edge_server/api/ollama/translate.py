"""Ollama chat and generate requests as the chat-completions request they mean, so both
doors share one preparation (template, tools, grammars, reasoning split), or for
/api/generate's raw, `template` and `suffix` forms, as the text prompt they spell out.

Errors name the Ollama field (`messages[1].images[0]`, `format`), never the chat one's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from edge_server.api.common.bounds.prompt_bounds import (
    check_prompt_bytes,
    prompt_size_limit,
    rendered_too_long,
)
from edge_server.api.http.errors import APIError, invalid
from edge_server.api.ollama.options import Sampling
from edge_server.api.ollama.protocol import ChatRequest, GenerateRequest, Message
from edge_server.api.openai.chat.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
)
from edge_server.api.openai.chat.protocol import ToolCall as ChatToolCall
from edge_server.api.openai.completions.serving import fill_in_the_middle
from edge_server.engine import Engine
from edge_server.engine.chat_template import TemplateTooLong, joined_within

# Base64 openings of the formats the image checks accept; others are sniffed there.
_MAGIC = {"iVBOR": "png", "/9j/": "jpeg", "R0lG": "gif", "UklG": "webp", "Qk": "bmp"}
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def data_url(image: str) -> str:
    """Ollama sends bare base64; the image checks read data URLs (and sniff the format)."""
    if image.startswith("data:"):
        return image
    kind = next((k for magic, k in _MAGIC.items() if image.startswith(magic)), "png")
    return f"data:image/{kind};base64,{image}"


def response_format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """`format` as response_format: "json" any object, a schema that schema (relaxed to
    the grammar limits where it exceeds them, as Ollama's is best effort)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    return {"type": "json_schema",
            "json_schema": {"name": "format", "schema": fmt, "strict": False}}


class Names:
    """Chat-side parameter names onto the Ollama request's own."""

    def __init__(self, default: str = "messages") -> None:
        self.default = default
        self.images: dict[str, str] = {}

    def rename(self, exc: APIError) -> APIError:
        param = exc.param
        if not param:
            return exc
        ours = None
        for chat, name in self.images.items():
            if param == chat or param.startswith(chat + "."):
                ours = name
        if ours is None:
            ours = {"response_format": "format", "max_tokens": "options.num_predict",
                    "logit_bias": "options"}.get(param.split(".")[0].split("[")[0])
        if ours is None and param.startswith("messages") and self.default != "messages":
            ours = self.default
        if ours is not None:
            exc.message = exc.message.replace(param, ours)
            exc.param = ours
        return exc


def _content(message: Message, where: str, index: int, names: Names) -> str | list[ContentPart]:
    text = message.content or ""
    if not message.images:
        return text
    if message.role != "user":
        raise invalid(f"{where}.images", f"`{where}.images`: images belong in user messages")
    parts = [ContentPart(type="text", text=text)]
    for k, image in enumerate(message.images):
        names.images[f"messages[{index}].content[{k + 1}].image_url"] = f"{where}.images[{k}]"
        parts.append(ContentPart(type="image_url", image_url={"url": data_url(image)}))
    return parts


def _messages(req: ChatRequest, names: Names) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    pending: list[str] = []  # ids of the last assistant turn's calls, for tool answers
    for i, message in enumerate(req.messages):
        where = f"messages[{i}]"
        content = _content(message, where, len(out), names)
        if message.role == "tool":
            name = message.tool_name
            if name is not None and not _TOOL_NAME.match(name):
                raise invalid(f"{where}.tool_name", "a tool name has 1 to 64 letters, digits, "
                              "`_` or `-`")
            call_id = message.tool_call_id or (pending.pop(0) if pending else None)
            out.append(ChatMessage(role="tool", content=content, name=name,
                                   tool_call_id=call_id))
            continue
        calls = None
        if message.tool_calls:
            if message.role != "assistant":
                raise invalid(f"{where}.tool_calls", "tool calls belong in assistant messages")
            calls = [ChatToolCall(id=call.id or f"call_{i}_{j}", function=FunctionCall(
                name=call.function.name,
                arguments=json.dumps(call.function.arguments, ensure_ascii=False)))
                for j, call in enumerate(message.tool_calls)]
            pending = [call.id for call in calls]
        reasoning = message.thinking if message.role == "assistant" else None
        out.append(ChatMessage(role=message.role, content=content, tool_calls=calls,
                               reasoning_content=reasoning or None))
    return out


# `think` levels as OpenAI's reasoning_effort: Ollama's "max" is OpenAI's highest, xhigh.
THINK_EFFORT = {"low": "low", "medium": "medium", "high": "high", "max": "xhigh"}


def _thinking(think: bool | str | None) -> dict[str, Any]:
    """`think` absent: the template's own default, its text left in the content; on (true
    or a level): the reasoning comes back as `thinking`, a level reaching the template as
    chat's reasoning_effort does; off: the template is told not to think."""
    if think is None:
        return {"separate_reasoning": False}
    if isinstance(think, str):
        return {"reasoning_effort": THINK_EFFORT[think], "separate_reasoning": True}
    return {"enable_thinking": think, "separate_reasoning": think}


def _chat_request(fields: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        # Everything was checked by our own schemas; a chat-side limit is the one way here.
        raise APIError(400, f"invalid request: {exc.errors(include_url=False)[0]['msg']}",
                       code="invalid_value") from exc


def chat_request(req: ChatRequest, sampling: Sampling, names: Names) -> ChatCompletionRequest:
    return _chat_request({
        "model": req.model,
        "messages": _messages(req, names),
        "tools": [tool.model_dump() for tool in req.tools] if req.tools else None,
        "response_format": response_format(req.format),
        "logprobs": bool(req.logprobs),
        "top_logprobs": req.top_logprobs if req.logprobs else None,
        "truncation": None if req.truncate is None else "auto" if req.truncate else "disabled",
        **_thinking(req.think),
        **sampling.chat_fields,
    })


def generate_chat_request(req: GenerateRequest, sampling: Sampling,
                          names: Names) -> ChatCompletionRequest:
    """A templated /api/generate: the system prompt and the prompt (with its images) as
    one user turn, rendered by the model's chat template."""
    messages: list[Message] = []
    if req.system:
        messages.append(Message(role="system", content=req.system))
    messages.append(Message(role="user", content=req.prompt or "", images=req.images))
    as_chat = ChatRequest(model=req.model, messages=messages, format=req.format,
                          think=req.think, logprobs=req.logprobs, top_logprobs=req.top_logprobs,
                          truncate=req.truncate)
    chat = chat_request(as_chat, sampling, names)
    # The chat names of the images are the request's `images[k]`.
    names.images = {k: v.replace(f"messages[{len(messages) - 1}].", "")
                    for k, v in names.images.items()}
    return chat


# --- text prompts: raw, `template`, `suffix` ----------------------------------------------

_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
_FIELDS = {".System": "system", ".Prompt": "prompt", ".Response": "response",
           ".Suffix": "suffix"}


def _template_pieces(template: str, values: dict[str, str],
                     until_response: bool = False) -> Iterator[str]:
    """Ollama's Go template, the subset prompt templates use: `{{ .System }}`,
    `{{ .Prompt }}`, `{{ .Response }}`, `{{ .Suffix }}`, `{{ if .X }}…{{ else }}…{{ end }}`
    and `{{-`/`-}}` trimming, written piece by piece. Anything else is a 400 naming
    `template`. `until_response`: the text stops where the answer goes (the turn being
    generated)."""
    shown: list[bool] = []  # per open `if`: whether its branch is being written
    at = 0
    trim_next = False
    for match in _ACTION.finditer(template):
        text = template[at:match.start()]
        if trim_next:
            text = text.lstrip()
        if match.group(1):
            text = text.rstrip()
        if all(shown):
            yield text
        at, trim_next = match.end(), bool(match.group(3))
        action = match.group(2)
        words = action.split()
        if action == ".Response" and until_response and all(shown):
            return
        if action in _FIELDS:
            if all(shown):
                yield values.get(_FIELDS[action], "")
        elif len(words) == 2 and words[0] == "if" and words[1] in _FIELDS:
            shown.append(bool(values.get(_FIELDS[words[1]])))
        elif action == "else" and shown:
            shown[-1] = not shown[-1]
        elif action == "end" and shown:
            shown.pop()
        else:
            raise invalid("template", f"`template`: `{{{{ {action[:60]} }}}}` is not supported; "
                          "templates may use .System, .Prompt, .Response, .Suffix, if/else/end")
    if shown:
        raise invalid("template", "`template`: an `if` has no `end`")
    tail = template[at:]
    yield tail.lstrip() if trim_next else tail


def render_template(template: str, values: dict[str, str], engine: Engine | None, *,
                    until_response: bool = False) -> str:
    """The template written out, stopped (a 400 naming `template`) once it passes what
    could fit the `engine`'s context: `{{.Prompt}}` repeated thousands of times must not
    write GBs. Without an engine (checking a template with no values) it is not bounded."""
    limit = None if engine is None else prompt_size_limit(engine)
    try:
        return joined_within(_template_pieces(template, values, until_response), limit)
    except TemplateTooLong as exc:
        assert engine is not None  # only a bounded render stops
        raise rendered_too_long("template", engine) from exc


def text_prompt(req: GenerateRequest, engine: Engine) -> list[int]:
    """Tokens of a raw, `template` or `suffix` generate request; its author writes the
    markup, so special tokens in it are parsed (as raw /v1/completions prompts are)."""
    prompt = req.prompt or ""
    if req.images:
        raise invalid("images", "`images` need the model's chat template: they cannot be "
                      "combined with `raw`, `template` or `suffix`")
    if req.suffix is not None:
        if req.system or req.template:
            name = "system" if req.system else "template"
            raise invalid(name, f"`{name}` cannot be combined with `suffix` (the prompt and "
                          "suffix are filled in the middle with the model's own tokens)")
        check_prompt_bytes(prompt + req.suffix, engine, "prompt")
        try:
            return fill_in_the_middle(prompt, req.suffix, engine)
        except APIError as exc:
            raise invalid("suffix", "`suffix` needs a model with fill-in-the-middle tokens; "
                          "this one has none") from exc
    if req.template is not None and not req.raw:
        # Each value alone must fit before the template may repeat it.
        check_prompt_bytes(prompt, engine, "prompt")
        check_prompt_bytes(req.system or "", engine, "system")
        prompt = render_template(req.template, {"system": req.system or "", "prompt": prompt},
                                 engine)
    elif req.system:
        raise invalid("system", "`system` cannot be combined with `raw`: write it into the "
                      "prompt")
    check_prompt_bytes(prompt, engine, "prompt")
    tokens = engine.tokenize(prompt)
    if not tokens:
        raise invalid("prompt", "the prompt is empty")
    return tokens
