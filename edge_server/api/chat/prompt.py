"""Chat messages into prompt tokens: messages as templates expect them, the model's chat
template, and tokens in which no caller text is read as control tokens (see
engine.chat_template). Synchronous and CPU-bound: callers run it off the event loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...engine import Engine
from ...engine.chat_template import TemplateError
from ..errors import invalid, unsupported
from ..prompt_bounds import check_prompt_bytes, too_long
from . import tools as tooling
from .protocol import ChatMessage, Tool


@dataclass
class ChatPrompt:
    text: str  # as rendered (control texts of caller strings stand as sentinels)
    tokens: list[int]


def _message_text(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text":
            raise unsupported(
                f"messages[{index}].content[{j}].{part.type}",
                "needs a model with a multimodal projector; this one is text-only",
            )
        texts.append(part.text or "")
    return "\n".join(texts)


def template_messages(
    messages: list[ChatMessage], engine: Engine, tools: list[Tool]
) -> list[dict[str, Any]]:
    """Messages as Jinja chat templates expect them: plain dicts with string content, and
    tool calls with their arguments as objects (as Hugging Face templates expect)."""
    template = engine.chat_template
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        text = _message_text(message, i)
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


def chat_prompt(
    messages: list[ChatMessage],
    engine: Engine,
    tools: list[Tool],
    *,
    enable_thinking: bool | None = True,
    add_generation_prompt: bool = True,
) -> ChatPrompt:
    # Every message renders to at least one token in any real template.
    if len(messages) > engine.n_ctx:
        raise too_long(
            "messages",
            f"{len(messages)} messages cannot fit the context of {engine.n_ctx} tokens.",
        )
    items = template_messages(messages, engine, tools)
    variables: dict[str, Any] = {"enable_thinking": enable_thinking}
    if tools and engine.chat_template.renders_tools:
        variables["tools"] = tooling.tool_specs(tools)
    try:
        rendered = engine.chat_template.render(
            items, add_generation_prompt=add_generation_prompt, **variables
        )
    except TemplateError as exc:
        raise invalid("messages", str(exc), "invalid_messages") from exc
    check_prompt_bytes(rendered.text, engine, "messages")
    return ChatPrompt(rendered.text, engine.tokenize_chat(rendered))
