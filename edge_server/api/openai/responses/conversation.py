"""A Responses conversation as the chat messages it means: `instructions` first, then
the turns stored with the previous response (each turn's input, then its output), then
the request's `input`. A function_call joins the assistant turn before it, a
function_call_output is the tool message answering it.

`marked`: each stored output stands as one assistant message holding a marker (a text no
caller or template writes), so that the rendered prompt shows where a stored response's
own tokens go (see continuation.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, TypeAdapter

from edge_server.api.common.documents import file_text
from edge_server.api.http.errors import invalid, unsupported
from edge_server.api.openai.chat.protocol import ChatMessage, ContentPart, FunctionCall, ToolCall
from edge_server.api.openai.responses.compaction import summary_message, unseal
from edge_server.api.openai.responses.protocol import (
    CompactionItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    InputPart,
    MessageItem,
    ResponsesRequest,
)

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
_STORED_ITEMS: TypeAdapter[list[Any]] = TypeAdapter(list[InputItem])
# Unicode noncharacters: never in the sentinel range of chat templates, never tokenized.
MARK_OPEN, MARK_CLOSE = "\U0010fffe", "\U0010ffff"


def output_marker(response_id: str) -> str:
    return f"{MARK_OPEN}{response_id}{MARK_CLOSE}"


def chat_messages(req: ResponsesRequest, turns: list[dict[str, Any]], reads: tuple[str, ...],
                  *, marked: bool = False) -> list[ChatMessage]:
    """`turns`: the stored conversation the request continues (store.StoredResponse);
    `reads`: what the model reads besides text ("image", "audio"), so which of
    `input_image` and `input_audio` parts are served."""
    out: list[ChatMessage] = []
    if req.instructions:
        out.append(ChatMessage(role="system", content=req.instructions))
    for turn in turns:
        # Validated when they were stored: an error here (a model that reads no images,
        # say) names the field that brought them.
        _append(out, _STORED_ITEMS.validate_python(turn["input"]),
                lambda _: "previous_response_id", reads)
        if marked:
            out.append(ChatMessage(role="assistant", content=output_marker(turn["id"])))
        else:
            _append(out, _STORED_ITEMS.validate_python(turn["output"]),
                    lambda _: "previous_response_id", reads)
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) \
        else req.input
    _append(out, items, lambda i: f"input[{i}]", reads)
    if not any(m.role != "system" for m in out):
        raise invalid("input", "`input` needs at least one message")
    return out


def _append(out: list[ChatMessage], items: Sequence[BaseModel], name: Callable[[int], str],
            reads: tuple[str, ...]) -> None:
    for i, item in enumerate(items):
        if isinstance(item, MessageItem):
            out.append(ChatMessage(role=item.role, content=_content(
                item.content, f"{name(i)}.content", reads)))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name,
                                                                   arguments=item.arguments))
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif isinstance(item, CompactionItem):
            out.append(summary_message(unseal(item.encrypted_content,
                                              f"{name(i)}.encrypted_content")))
        elif isinstance(item, FunctionCallOutputItem):
            text = _part_text(item.output, f"{name(i)}.output")
            out.append(ChatMessage(role="tool", content=text, tool_call_id=item.call_id))
        else:
            kind = getattr(item, "type", "")
            if kind == "item_reference":
                raise unsupported(name(i), "(an item_reference) is not served: send the "
                                  "item, or previous_response_id")
            # Reasoning is not replayed as text (templates drop it from history); a
            # continued turn has it in the stored tokens (continuation.py).
            if kind != "reasoning":
                raise unsupported(f"{name(i)}.type", f"({kind!r}) is not served")


_MEDIA_PARTS = {"input_image": "image", "input_audio": "audio"}


def _content(parts: str | list[InputPart], where: str, reads: tuple[str, ...]
             ) -> str | list[ContentPart]:
    """A message's content as chat takes it: its text, or, once it holds an
    `input_image` or `input_audio`, its parts in order (image_url and input_audio parts
    for the media)."""
    if isinstance(parts, str) or not any(p.type in _MEDIA_PARTS for p in parts):
        return _part_text(parts, where)
    out = []
    for j, part in enumerate(parts):
        if part.type not in _MEDIA_PARTS:
            out.append(ContentPart(type="text", text=_part_text([part], f"{where}[{j}]")))
            continue
        kind = _MEDIA_PARTS[part.type]
        if kind not in reads:
            raise unsupported(f"{where}[{j}]", f"needs a model that reads {kind}; this one "
                              + ("is text-only" if not reads else f"reads {' and '.join(reads)}"
                                 " besides text"))
        if part.type == "input_audio":
            if not isinstance(part.input_audio, dict):
                raise invalid(f"{where}[{j}].input_audio",
                              "needs {\"data\": base64 audio, \"format\": \"wav\"}")
            out.append(ContentPart(type="input_audio", input_audio=part.input_audio))
            continue
        if part.image_url is None:
            raise unsupported(f"{where}[{j}]", "needs `image_url` (a data URL); file_id "
                              "needs stored files, which this server does not keep")
        out.append(ContentPart(type="image_url", image_url={
            "url": part.image_url, "detail": part.detail or "auto"}))
    return out


def _part_text(parts: str | list[InputPart], where: str) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for j, part in enumerate(parts):
        if part.type == "input_file":
            texts.append(file_text(part.file_data, part.filename, f"{where}[{j}]"))
            continue
        # A refusal an assistant turn replays carries its text as `refusal`.
        text = part.refusal if part.type == "refusal" else part.text
        if part.type not in _TEXT_PARTS or not isinstance(text, str):
            raise unsupported(f"{where}[{j}]", f"(type `{part.type[:64]}`) is not served: "
                              "only text, image, audio and file parts are")
        texts.append(text)
    return "\n".join(texts)
