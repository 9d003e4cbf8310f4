"""Chat messages into prompt tokens: messages as templates expect them, the model's chat
template, and tokens in which no caller text is read as control tokens (see
engine.chat_template). Synchronous and CPU-bound: callers run it off the event loop."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edge_server.api.common.audio_input.audio import check_clip_count, decode_audio_part
from edge_server.api.common.bounds.prompt_bounds import (
    check_prompt_bytes,
    prompt_size_limit,
    rendered_too_long,
    too_long,
)
from edge_server.api.common.documents import file_text
from edge_server.api.common.image_input.images import (
    check_image_count,
    decode_image_url,
    image_errors,
)
from edge_server.api.http.errors import invalid, unsupported
from edge_server.api.openai.chat import tools as tooling
from edge_server.api.openai.chat.protocol import ChatMessage, Tool
from edge_server.engine import Engine
from edge_server.engine.chat_template import (
    ChatTemplate,
    RenderedChat,
    TemplateError,
    TemplateTooLong,
)
from edge_server.engine.multimodal.projector import Media
from edge_server.engine.request import ImageSpan


@dataclass
class ChatPrompt:
    text: str  # as rendered (control texts of caller strings stand as sentinels)
    tokens: list[int]
    images: list[ImageSpan] = field(default_factory=list)


class _Images:
    """Images and audio clips of a chat's content parts, decoded and checked; each
    stands in the text as a sentinel no caller can write (a per-request random name)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.by_sentinel: dict[str, Media] = {}
        self._nonce = secrets.token_hex(8)

    def audio_sentinel(self, part: Any, param: str) -> str:
        assert self.engine.projector is not None  # _check_media refused it otherwise
        clip = decode_audio_part(part, self.engine.settings.audio_limits,
                                 self.engine.projector.sample_rate, param)
        key = f"\ue000audio-{self._nonce}-{len(self.by_sentinel)}\ue001"
        self.by_sentinel[key] = clip
        return key

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
    count = clips = 0
    reads = engine.modalities
    for i, message in enumerate(messages):
        if isinstance(message.content, str) or message.content is None:
            continue
        for j, part in enumerate(message.content):
            param = f"messages[{i}].content[{j}].{part.type}"
            if part.type in ("text", "file"):
                continue
            if part.type == "video_url":
                raise unsupported(param, "is not supported: send frames as images")
            kind = "image" if part.type == "image_url" else "audio"
            if kind in reads:
                count += kind == "image"
                clips += kind == "audio"
                continue
            raise unsupported(param, f"needs a model that reads {kind}: model "
                              f"{engine.model_id!r} "
                              + ("is text-only" if not reads
                                 else f"reads {' and '.join(reads)} besides text"))
    check_image_count(count, engine.settings.image_limits, "messages")
    check_clip_count(clips, engine.settings.audio_limits, "messages")


def _message_text(message: ChatMessage, index: int, images: _Images | None) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type == "image_url":
            if images is None:
                raise invalid(f"messages[{index}].content[{j}]", "images are not read here")
            texts.append(images.sentinel(part.image_url,
                                         f"messages[{index}].content[{j}].image_url"))
        elif part.type == "input_audio":
            if images is None:
                raise invalid(f"messages[{index}].content[{j}]", "audio is not read here")
            texts.append(images.audio_sentinel(
                part.input_audio, f"messages[{index}].content[{j}].input_audio"))
        elif part.type == "file":
            file = part.file if isinstance(part.file, dict) else {}
            data, name = file.get("file_data"), file.get("filename")
            texts.append(file_text(data if isinstance(data, str) else None,
                                   name if isinstance(name, str) else None,
                                   f"messages[{index}].content[{j}].file"))
        else:
            texts.append(part.text or "")
    return "\n".join(texts)


def template_messages(
    messages: list[ChatMessage], template: ChatTemplate, tools: list[Tool],
    images: _Images | None = None,
) -> list[dict[str, Any]]:
    """Messages as Jinja chat templates expect them (as transformers' apply_chat_template
    passes them): plain dicts without null fields, string content, tool calls with their
    arguments as objects, earlier reasoning as `reasoning_content`. For a template that
    knows no tools, the calls are written into the content and the tools described in a
    generic prompt (tools.py)."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        text = _message_text(message, i, images)
        role = "system" if message.role == "developer" else message.role
        # Null content (a turn of calls only) as "": transformers drops the key, which
        # renders the same wherever a template copes with either, and the Qwen 3, Granite
        # and LFM2 templates fail without it.
        item: dict[str, Any] = {"role": role, "content": text}
        if message.name:
            item["name"] = message.name
            if not template.renders_names:
                item["content"] = f"{message.name}: {text}"
        if message.reasoning is not None:
            item["reasoning_content"] = message.reasoning
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
        _add_tool_prompt(out, tooling.generic_prompt(tools), template.accepts_system)
    return out


def _add_tool_prompt(items: list[dict[str, Any]], prompt: str, system: bool) -> None:
    """The generic tool prompt ahead of the system message, or as one; a template that
    refuses system messages (Gemma 2) gets it ahead of the first user turn instead."""
    if items and items[0]["role"] == "system":
        items[0] = {**items[0], "content": prompt + "\n\n" + items[0].get("content", "")}
    elif system:
        items.insert(0, {"role": "system", "content": prompt})
    else:
        first = next((i for i, m in enumerate(items) if m["role"] == "user"), None)
        if first is None:
            items.insert(0, {"role": "user", "content": prompt})
        else:
            items[first] = {**items[first],
                            "content": prompt + "\n\n" + items[first].get("content", "")}


def template_variables(template: ChatTemplate, tools: list[Tool],
                       template_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """What the template is given beside the messages: the tools where it lays them out
    (as the caller sent them), and only the variables the caller asked for
    (`chat_template_kwargs`, `enable_thinking`, `reasoning_effort`, …): a template's own
    defaults hold otherwise."""
    variables = dict(template_kwargs or {})
    if tools and template.renders_tools:
        variables["tools"] = tooling.tool_specs(tools)
    return variables


# Where an image stands in a rendered prompt shown to a caller: llama.cpp's media marker.
MEDIA_MARKER = "<__media__>"


def render_chat(
    messages: list[ChatMessage],
    engine: Engine,
    tools: list[Tool],
    *,
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[RenderedChat, dict[str, Media]]:
    """The model's chat template applied to the messages, and the images standing in the
    text as sentinels (checked and decoded, not yet evaluated). `template_kwargs`: the
    variables the caller asked the template for (chat_template_kwargs and the like)."""
    # Every message renders to at least one token in any real template.
    if len(messages) > engine.n_ctx:
        raise too_long(
            "messages",
            f"{len(messages)} messages cannot fit the context of {engine.n_ctx} tokens.",
        )
    _check_media(messages, engine)
    images = _Images(engine)
    template = engine.chat_template
    items = template_messages(messages, template, tools, images)
    try:
        rendered = template.render(
            items, add_generation_prompt=add_generation_prompt,
            max_chars=prompt_size_limit(engine),
            **template_variables(template, tools, template_kwargs),
        )
    except TemplateTooLong as exc:
        raise rendered_too_long("messages", engine) from exc
    except TemplateError as exc:  # the template's own raise_exception, named as it says
        raise invalid("messages", str(exc), "invalid_messages") from exc
    check_prompt_bytes(rendered.text, engine, "messages")
    return rendered, images.by_sentinel


# A chat's messages rendered (render_chat, with the request's tools and template settings).
PromptRender = Callable[[list[ChatMessage]], tuple[RenderedChat, dict[str, Media]]]
# How a request's messages become its prompt, given how to render messages: by default
# chat_prompt of the rendered messages.
MakePrompt = Callable[[list[ChatMessage], PromptRender], ChatPrompt]


def chat_prompt(rendered: RenderedChat, images: dict[str, Media],
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


def shown_text(rendered: RenderedChat, images: dict[str, Media]) -> str:
    """A rendered chat as llama-server's /apply-template shows it: caller strings as
    written, each image as the media marker."""
    text = rendered.text
    for sentinel, control in rendered.literals.items():
        text = text.replace(sentinel, control)
    for key in images:
        text = text.replace(key, MEDIA_MARKER)
    return text
