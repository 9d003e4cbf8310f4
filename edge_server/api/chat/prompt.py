"""Chat messages into prompt tokens: messages as templates expect them, the model's chat
template, and tokens in which no caller text is read as control tokens (see
engine.chat_template). Synchronous and CPU-bound: callers run it off the event loop."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...engine import Engine
from ...engine.chat_template import RenderedChat, TemplateError, TemplateTooLong
from ...engine.multimodal.projector import RgbImage
from ...engine.request import ImageSpan
from ..common.images import check_image_count, decode_image_url, image_errors
from ..common.prompt_bounds import (
    check_prompt_bytes,
    prompt_size_limit,
    rendered_too_long,
    too_long,
)
from ..http.errors import invalid, unsupported
from . import tools as tooling
from .protocol import ChatMessage, Tool


@dataclass
class ChatPrompt:
    text: str  # as rendered (control texts of caller strings stand as sentinels)
    tokens: list[int]
    images: list[ImageSpan] = field(default_factory=list)


class _Images:
    """Images of a chat's content parts, decoded and checked; each stands in the text
    as a sentinel no caller can write (a per-request random name)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.by_sentinel: dict[str, RgbImage] = {}
        self._nonce = secrets.token_hex(8)

    def sentinel(self, url: Any, param: str) -> str:
        if isinstance(url, dict):
            detail = url.get("detail", "auto")
            if detail not in ("auto", "low", "high"):
                raise invalid(f"{param}.detail", "detail must be auto, low or high")
            url = url.get("url")
        image = decode_image_url(url, self.engine.settings.image_limits, f"{param}.url")
        key = f"\ue000image-{self._nonce}-{len(self.by_sentinel)}\ue001"
        self.by_sentinel[key] = image
        return key


def _check_media(messages: list[ChatMessage], engine: Engine) -> None:
    """Refuses, by name, content parts this model cannot read, before any is decoded."""
    count = 0
    for i, message in enumerate(messages):
        if isinstance(message.content, str) or message.content is None:
            continue
        for j, part in enumerate(message.content):
            param = f"messages[{i}].content[{j}].{part.type}"
            if part.type == "text":
                continue
            if part.type == "image_url" and "image" in engine.modalities:
                count += 1
                continue
            if part.type == "video_url":
                raise unsupported(param, "is not supported: send frames as images")
            if part.type == "input_audio" and engine.projector is not None:
                raise unsupported(param, "needs a model whose projector reads audio; this "
                                  "server reads images only")
            raise unsupported(
                param, "needs a model with a multimodal projector; this one is text-only")
    check_image_count(count, engine.settings.image_limits, "messages")


def _message_text(message: ChatMessage, index: int, images: _Images) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type == "image_url":
            texts.append(images.sentinel(part.image_url,
                                         f"messages[{index}].content[{j}].image_url"))
        else:
            texts.append(part.text or "")
    return "\n".join(texts)


def template_messages(
    messages: list[ChatMessage], engine: Engine, tools: list[Tool],
    images: _Images | None = None,
) -> list[dict[str, Any]]:
    """Messages as Jinja chat templates expect them: plain dicts with string content, and
    tool calls with their arguments as objects (as Hugging Face templates expect)."""
    template = engine.chat_template
    images = images or _Images(engine)
    _check_media(messages, engine)
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        text = _message_text(message, i, images)
        role = "system" if message.role == "developer" else message.role
        item: dict[str, Any] = {"role": role, "content": text}
        if message.name:
            item["name"] = message.name
            if not template.renders_names:
                item["content"] = f"{message.name}: {text}"
        if message.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": call.type,
                    "function": {
                        "name": call.function.name,
                        "arguments": call.function.parsed_arguments(),
                    },
                }
                for call in message.tool_calls
            ]
            if not template.renders_tools:
                item["content"] = (text + "\n" if text else "") + tooling.history_text(
                    message.tool_calls
                )
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    if tools and not template.renders_tools:
        prompt = tooling.generic_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": prompt + "\n\n" + out[0]["content"]}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


# Where an image stands in a rendered prompt shown to a caller: llama.cpp's media marker.
MEDIA_MARKER = "<__media__>"


def render_chat(
    messages: list[ChatMessage],
    engine: Engine,
    tools: list[Tool],
    *,
    enable_thinking: bool | None = True,
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[RenderedChat, dict[str, RgbImage]]:
    """The model's chat template applied to the messages, and the images standing in the
    text as sentinels (checked and decoded, not yet evaluated)."""
    # Every message renders to at least one token in any real template.
    if len(messages) > engine.n_ctx:
        raise too_long(
            "messages",
            f"{len(messages)} messages cannot fit the context of {engine.n_ctx} tokens.",
        )
    images = _Images(engine)
    items = template_messages(messages, engine, tools, images)
    variables: dict[str, Any] = {"enable_thinking": enable_thinking, **(template_kwargs or {})}
    if tools and engine.chat_template.renders_tools:
        variables["tools"] = tooling.tool_specs(tools)
    try:
        rendered = engine.chat_template.render(
            items, add_generation_prompt=add_generation_prompt,
            max_chars=prompt_size_limit(engine), **variables
        )
    except TemplateTooLong as exc:
        raise rendered_too_long("messages", engine) from exc
    except TemplateError as exc:
        raise invalid("messages", str(exc), "invalid_messages") from exc
    check_prompt_bytes(rendered.text, engine, "messages")
    return rendered, images.by_sentinel


# A chat's messages rendered (render_chat, with the request's tools and template settings).
PromptRender = Callable[[list[ChatMessage]], tuple[RenderedChat, dict[str, RgbImage]]]
# How a request's messages become its prompt, given how to render messages: by default
# chat_prompt of the rendered messages.
MakePrompt = Callable[[list[ChatMessage], PromptRender], ChatPrompt]


def chat_prompt(rendered: RenderedChat, images: dict[str, RgbImage],
                engine: Engine) -> ChatPrompt:
    """A rendered chat (render_chat) as the prompt tokens the model evaluates."""
    if not images:
        return ChatPrompt(rendered.text, engine.tokenize_chat(rendered))
    for key in images:
        if rendered.text.count(key) != 1:  # a template that drops or repeats content
            raise invalid("messages", "the chat template did not place each image once")
    with image_errors("messages"):
        prompt = engine.tokenize_chat_images(rendered, images)
    return ChatPrompt(rendered.text, prompt.tokens, prompt.images)


def shown_text(rendered: RenderedChat, images: dict[str, RgbImage]) -> str:
    """A rendered chat as llama-server's /apply-template shows it: caller strings as
    written, each image as the media marker."""
    text = rendered.text
    for sentinel, control in rendered.literals.items():
        text = text.replace(sentinel, control)
    for key in images:
        text = text.replace(key, MEDIA_MARKER)
    return text
