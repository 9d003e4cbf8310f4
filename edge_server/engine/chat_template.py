"""Renders chat messages with the model's own Jinja chat template (GGUF metadata).

Templates come from model files, so they run in Jinja's immutable sandbox: a template
can format messages but cannot touch Python objects or the file system. The environment
is transformers' own (template_env), and so are the variables: a template renders here
as it renders in `apply_chat_template`.

Caller text never becomes control tokens. The rendered prompt is tokenized with special
tokens parsed, since that is how the template's markup (`<|im_start|>`, …) becomes
tokens; so before rendering, every control-token text inside caller strings (message
content, names, tool calls, tool schemas: keys and values alike) is swapped for a
private-use sentinel character, and the tokenizer turns each sentinel back into its text
tokenized as plain text. Sentinels survive what templates do to content (trim, slicing,
concatenation); a template that drops one drops that text, and one that repeats it
repeats the text: either way no control token comes from caller text. Requests without
such text render exactly as before.

Output is bounded: a template may repeat caller text (a loop over the messages, or a
variable in a loop), so the render is read piece by piece and stops once it passes what
could fit the context (`max_chars`), and multiplying a string or list is refused beyond
that size before the product is made.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2

from edge_server.engine.template_env import (
    TemplateError,
    TemplateTooLong,
    chat_environment,
    max_chars_var,
)

__all__ = ["CHATML_TEMPLATE", "ChatTemplate", "RenderedChat", "TemplateError",
           "TemplateTooLong", "joined_within", "literal_pattern"]

# Used when a GGUF file carries no template: ChatML, the most common convention.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Supplementary Private Use Area B: no tokenizer or template gives these a meaning.
_SENTINEL_FIRST, _SENTINEL_LAST = 0x100000, 0x10FFFD


@dataclass(frozen=True)
class RenderedChat:
    text: str  # the prompt; control texts from caller strings stand as sentinels
    literals: dict[str, str] = field(default_factory=dict)  # sentinel -> its control text


def literal_pattern(texts: Collection[str]) -> re.Pattern[str] | None:
    """One regex matching any of `texts`, longest first, built as a trie: thousands of
    texts (Gemma has ~6,000 control tokens) still scan megabytes in milliseconds."""
    trie: dict[str, Any] = {}
    for text in texts:
        if text:
            node = trie
            for char in text:
                node = node.setdefault(char, {})
            node[""] = {}  # a text ends here
    if not trie:
        return None

    def branch(node: dict[str, Any]) -> str:
        alternatives = [re.escape(c) + branch(node[c]) for c in sorted(node) if c]
        if not alternatives:
            return ""
        group = "(?:" + "|".join(alternatives) + ")"
        return group + "?" if "" in node else group

    return re.compile(branch(trie))


class _Shield:
    """Swaps control texts in caller strings for sentinels (see the module's docstring)."""

    def __init__(self, pattern: re.Pattern[str] | None, reserved: str) -> None:
        self._pattern = pattern
        self._reserved = reserved  # characters a sentinel must not collide with
        self._next = _SENTINEL_FIRST
        self.sentinels: dict[str, str] = {}  # control text -> sentinel

    def apply(self, value: Any) -> Any:
        if self._pattern is None or not self._found(value):
            return value  # the common case: nothing to swap, nothing copied
        self._reserved += "".join(_strings(value))
        return self._swapped(value)

    def _found(self, value: Any) -> bool:
        assert self._pattern is not None
        return any(self._pattern.search(s) for s in _strings(value))

    def _swapped(self, value: Any) -> Any:
        assert self._pattern is not None
        if isinstance(value, str):
            return self._pattern.sub(self._sentinel, value)
        if isinstance(value, dict):
            return {self._swapped(k): self._swapped(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._swapped(v) for v in value]
        return value

    def _sentinel(self, match: re.Match[str]) -> str:
        text = match.group()
        if text not in self.sentinels:
            while chr(self._next) in self._reserved:
                self._next += 1
            if self._next > _SENTINEL_LAST:
                raise TemplateError("too many distinct control-token texts in the messages")
            self.sentinels[text] = chr(self._next)
            self._next += 1
        return self.sentinels[text]


def _strings(value: Any) -> list[str]:
    """Every string in a JSON-like value, dict keys included, without recursion."""
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found


# Where a message's reasoning may be given; templates read `reasoning_content`, and
# gpt-oss's read `thinking` (transformers fills both, so do we).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

# A system turn and a user turn: a template refusing it refuses system messages (Gemma 2).
_SYSTEM_PROBE = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


class ChatTemplate:
    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        control_texts: Collection[str] = (),
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        try:
            self._template = chat_environment(now).from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template does not parse: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._control = literal_pattern(control_texts)
        # A template that mentions tools in any form (`tools`, `xml_tools`, …) lays them
        # out itself; the others get a generic tool prompt (api/openai/chat/tools.py).
        self.renders_tools = re.search(r"tools\b", source) is not None
        # Templates that never mention a message's name drop it; we then prefix it.
        self.renders_names = re.search(r"""\.name\b|\[\s*['"]name['"]\s*\]""", source) is not None
        self.accepts_system = self._renders(_SYSTEM_PROBE)

    def _renders(self, messages: list[dict[str, Any]]) -> bool:
        try:
            self.render(messages, max_chars=len(self.source) + 4096)
        except TemplateError:
            return False
        return True

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        max_chars: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> RenderedChat:
        """`messages`, `tools` and `extra` are caller data; the template's own text is
        markup. As transformers renders: `tools` and `documents` are None when not
        given, and a message's reasoning is under both `reasoning_content` and
        `thinking`. `max_chars`: stop with TemplateTooLong once the output passes this."""
        shield = _Shield(self._control, self.source)
        messages, tools, extra = shield.apply((_with_reasoning(messages), tools, extra))
        variables = {"documents": None, **extra}
        token = max_chars_var.set(max_chars)
        try:
            pieces = self._template.generate(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **variables,
            )
            text = joined_within(pieces, max_chars)
        except TemplateError:
            raise
        except Exception as exc:  # a template bug is the request's problem, not a crash
            raise TemplateError(f"the chat template failed on these messages: {exc}") from exc
        finally:
            max_chars_var.reset(token)
        literals = {sentinel: control for control, sentinel in shield.sentinels.items()}
        return RenderedChat(text, literals)


def _with_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each message's reasoning under the names templates read it by (`thinking` first,
    `reasoning_content` last, in the order transformers gives them)."""
    out = []
    for message in messages:
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None),
                         None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def joined_within(pieces: Iterator[str], max_chars: int | None) -> str:
    """The pieces of a render as one text, read until they pass `max_chars` (then
    TemplateTooLong): nothing past the limit is ever produced."""
    if max_chars is None:
        return "".join(pieces)
    out: list[str] = []
    size = 0
    for piece in pieces:
        size += len(piece)
        if size > max_chars:
            raise TemplateTooLong(max_chars)
        out.append(piece)
    return "".join(out)
