"""An Anthropic Messages request as the chat-completions request it means, so that both
doors share one preparation: template, tools, grammars, sampling and reasoning split.

Errors name the Anthropic field (`messages[2].content[0]`), never the chat request's.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from edge_server.api.anthropic.messages.protocol import (
    CountTokensRequest,
    ImageBlock,
    Message,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from edge_server.api.http.errors import APIError, invalid, unsupported
from edge_server.api.openai.chat.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    FunctionDef,
    NamedToolChoice,
    Tool,
    ToolCall,
)

_NO_VISION = "is not served: only text and image blocks are"
_NO_IMAGE_SOURCE = "must be {\"type\": \"base64\", \"media_type\": …, \"data\": …} or a url"
# Chat-side parameter names as the Anthropic request calls them.
PARAM_NAMES = {"stop": "stop_sequences", "parallel_tool_calls": "tool_choice",
               "response_format": "output_config.format"}


def _refuse_unsupported(req: CountTokensRequest) -> None:
    for name in ("mcp_servers", "context_management", "container"):
        if getattr(req, name, None) is not None:
            raise unsupported(name)


def _text_of(blocks: list[TextBlock | ImageBlock], where: str) -> str:
    texts = []
    for k, block in enumerate(blocks):
        if isinstance(block, ImageBlock):
            raise unsupported(f"{where}[{k}]", "is not served: tool results hold text only")
        texts.append(block.text)
    return "\n".join(texts)


def _tool_result(block: ToolResultBlock, where: str) -> ChatMessage:
    content = block.content
    text = content if isinstance(content, str) else _text_of(content or [], f"{where}.content")
    if block.is_error:
        # Templates know no error flag; the model reads it as words instead.
        text = f"Error: {text}"
    return ChatMessage(role="tool", content=text, tool_call_id=block.tool_use_id)


def _image_url(block: ImageBlock, where: str) -> str:
    """An image block's source as the data URL (or URL) chat's image_url part takes."""
    source = (block.model_extra or {}).get("source")
    if not isinstance(source, dict):
        raise invalid(f"{where}.source", f"`{where}.source` {_NO_IMAGE_SOURCE}")
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type")
        if not isinstance(media, str) or not media.startswith("image/") or len(media) > 64:
            raise invalid(f"{where}.source.media_type", "an image media type is needed")
        return f"data:{media};base64,{source['data']}"
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise invalid(f"{where}.source", f"`{where}.source` {_NO_IMAGE_SOURCE}")


def _turn(message: Message, i: int, image_params: dict[str, str],
          first: int) -> list[ChatMessage]:
    """One Anthropic message as chat messages: a user turn's tool results become tool
    messages (before its text, as Anthropic orders them); an assistant turn's tool_use
    blocks its tool_calls. Image blocks of a user turn become image_url parts, and
    `image_params` learns which chat part each one is (`first`: the index its chat
    messages start at), so that errors name the block."""
    content = message.content
    blocks = [TextBlock(type="text", text=content)] if isinstance(content, str) else content
    texts: list[str] = []
    parts: list[ContentPart] = []  # in order, once the turn holds an image
    images: list[tuple[int, str]] = []  # (part index, the block's name)
    results: list[ChatMessage] = []
    calls: list[ToolCall] = []
    reasoning: list[str] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        if isinstance(block, TextBlock):
            texts.append(block.text)
            parts.append(ContentPart(type="text", text=block.text))
        elif isinstance(block, ImageBlock) and block.type == "image" and message.role == "user":
            images.append((len(parts), where))
            parts.append(ContentPart(type="image_url", image_url={"url": _image_url(block,
                                                                                    where)}))
        elif isinstance(block, ImageBlock):
            raise unsupported(where, _NO_VISION)
        elif isinstance(block, ToolResultBlock):
            if message.role != "user":
                raise invalid(where, f"`{where}`: tool_result blocks belong in user messages")
            results.append(_tool_result(block, where))
        elif isinstance(block, ToolUseBlock):
            if message.role != "assistant":
                raise invalid(where, f"`{where}`: tool_use blocks belong in assistant messages")
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(ToolCall(id=block.id, function=FunctionCall(name=block.name,
                                                                     arguments=arguments)))
        elif isinstance(block, ThinkingBlock) and block.thinking and message.role == "assistant":
            reasoning.append(block.thinking)  # as reasoning_content: templates keeping it show it
    text = "\n".join(texts)
    if message.role == "assistant":
        return [ChatMessage(role="assistant", content=text or (None if calls else ""),
                            tool_calls=calls or None,
                            reasoning_content="\n".join(reasoning) if reasoning else None)]
    if results and not texts and not images:
        return results
    index = first + len(results)
    for part, name in images:
        image_params[f"messages[{index}].content[{part}].image_url"] = name
    return [*results, ChatMessage(role="user", content=parts if images else text)]


def _messages(req: CountTokensRequest, image_params: dict[str, str]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else "\n".join(
            block.text for block in req.system)
        out.append(ChatMessage(role="system", content=system))
    if req.messages[-1].role == "assistant":
        # Continuing a final assistant turn needs the template to leave it open.
        last = f"messages[{len(req.messages) - 1}]"
        raise unsupported(last, "(a final assistant message, to be continued) is not supported")
    for i, message in enumerate(req.messages):
        out.extend(_turn(message, i, image_params, len(out)))
    return out


def _tools(req: CountTokensRequest) -> list[Tool] | None:
    if req.tools is None:
        return None
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.type not in (None, "custom"):
            raise unsupported(f"tools[{i}].type", f"{tool.type!r} (a server tool) is not "
                              "supported: only custom tools with an `input_schema`")
        if tool.input_schema is None:
            raise invalid(f"tools[{i}].input_schema", f"`tools[{i}].input_schema` is required")
        tools.append(Tool(function=FunctionDef(
            name=tool.name, description=tool.description, parameters=tool.input_schema,
            strict=bool(tool.strict))))
    return tools


def _tool_choice(req: CountTokensRequest) -> str | NamedToolChoice | None:
    choice = req.tool_choice
    if choice is None:
        return None
    if choice.type != "none" and not req.tools:
        raise invalid("tool_choice", "`tool_choice` needs `tools`")
    if choice.type == "tool":
        if choice.name not in {t.name for t in req.tools or []}:
            raise invalid("tool_choice.name", f"`tool_choice.name`: no tool named "
                          f"{choice.name!r} in `tools`")
        return NamedToolChoice(function={"name": choice.name or ""})
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def to_chat(req: CountTokensRequest, image_params: dict[str, str] | None = None
            ) -> ChatCompletionRequest:
    """The chat request that renders the same prompt and samples the same way.
    `image_params` learns the chat names of image blocks (see rename_image_param)."""
    _refuse_unsupported(req)
    thinking = req.thinking is not None and req.thinking.on
    # Not given, the template's own default holds; given, it is passed either way.
    enable_thinking = None if req.thinking is None else thinking
    tool_choice = _tool_choice(req)
    if thinking and (tool_choice == "required" or isinstance(tool_choice, NamedToolChoice)):
        # A forced call's grammar starts the answer with the call: no room to think.
        raise invalid("thinking", "`thinking` cannot be enabled while `tool_choice` forces "
                      "tool use")
    fields: dict[str, object] = {
        "model": req.model,
        "messages": _messages(req, {} if image_params is None else image_params),
        "tools": _tools(req),
        "tool_choice": tool_choice,
        # Asked for, thinking comes back as thinking blocks.
        "enable_thinking": enable_thinking,
        "separate_reasoning": thinking,
    }
    if req.tool_choice is not None and req.tool_choice.disable_parallel_tool_use:
        fields["parallel_tool_calls"] = False
    if isinstance(req, MessagesRequest):
        fields.update(
            max_tokens=req.max_tokens,
            stop=req.stop_sequences or None,
            # The matched stop sequence is read off the text, then cut (see serving).
            include_stop_str_in_output=bool(req.stop_sequences),
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stream=bool(req.stream),
            draft=req.draft,
        )
        output = req.output_config.format if req.output_config else None
        if output is not None:
            fields["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": output.json_schema, "strict": True}}
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        # Checked above already; a limit of the chat request's own is the one way here.
        raise APIError(400, f"invalid request: {exc.errors(include_url=False)[0]['msg']}",
                       code="invalid_value") from exc


def rename_image_param(param: str, image_params: dict[str, str]) -> str | None:
    """The Anthropic name of a chat-side image error (`messages[2].content[0].image_url.url`
    is `messages[1].content[0].source` when a system prompt came first)."""
    for chat, ours in image_params.items():
        if param == chat or param.startswith(chat + "."):
            return ours + ".source" if param != chat else ours
    return None
