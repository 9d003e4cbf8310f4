"""Renders chat messages with the model's own Jinja chat template (GGUF metadata).

Templates come from model files, so they run in Jinja's immutable sandbox: a template
can format messages but cannot touch Python objects or the file system.

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

import json
import re
from collections.abc import Collection, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used when a GGUF file carries no template: ChatML, the most common convention.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Supplementary Private Use Area B: no tokenizer or template gives these a meaning.
_SENTINEL_FIRST, _SENTINEL_LAST = 0x100000, 0x10FFFD


class TemplateError(ValueError):
    """The template could not render these messages (it said why, or it is broken)."""


class TemplateTooLong(TemplateError):
    """The render passed `max_chars`: it could not fit the context, whatever it says."""

    def __init__(self, max_chars: int) -> None:
        super().__init__(f"the chat template's output passed {max_chars} characters, more "
                         "than any prompt that fits the context")
        self.max_chars = max_chars


# The running render's size limit, for the operators the sandbox intercepts (renders run
# in worker threads; each has its own context).
_max_chars: ContextVar[int | None] = ContextVar("chat_template_max_chars", default=None)


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, refusing what would make one piece too big to be a prompt
    before it is made: `*` products, `**` powers, and padding or replacing strings."""

    intercepted_binops = frozenset({"*", "**"})

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        limit = _max_chars.get()
        owner = getattr(obj, "__self__", None)
        if (limit is not None and isinstance(owner, str)
                and _grown_size(owner, getattr(obj, "__name__", ""), args) > limit):
            raise TemplateTooLong(limit)
        return super().call(context, obj, *args, **kwargs)

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        limit = _max_chars.get()
        if limit is not None:
            if operator_name == "*":
                _check_product(left, right, limit)
            elif (operator_name == "**" and isinstance(left, int) and isinstance(right, int)
                  and abs(left) > 1 and right * abs(left).bit_length() > 4 * limit):
                raise TemplateTooLong(limit)
        return super().call_binop(context, operator_name, left, right)


def _grown_size(text: str, name: str, args: tuple[Any, ...]) -> int:
    """The length a string method (or filter) whose result can outgrow its inputs would
    give; 0 for the others."""
    first = args[0] if args else None
    if name in ("center", "ljust", "rjust", "zfill") and isinstance(first, int):
        return first
    if name == "indent":  # the filter: every line gets the indent
        width = len(first) if isinstance(first, str) else first if isinstance(first, int) else 4
        return len(text) + (text.count("\n") + 1) * width
    if name == "replace" and len(args) >= 2 and isinstance(first, str):
        matches = text.count(first) if first else len(text) + 1
        return len(text) + matches * len(str(args[1]))
    if name == "expandtabs":
        return len(text) + text.count("\t") * (first if isinstance(first, int) else 8)
    return 0


def _bounded_filter(name: str, original: Any) -> Any:
    """A string filter refusing results past the running render's limit."""

    def bounded(value: Any, *args: Any, **kwargs: Any) -> Any:
        limit = _max_chars.get()
        if (limit is not None and isinstance(value, str)
                and _grown_size(value, name, (*args, *kwargs.values())) > limit):
            raise TemplateTooLong(limit)
        return original(value, *args, **kwargs)

    return bounded


def _check_product(left: Any, right: Any, limit: int) -> None:
    for sized, count in ((left, right), (right, left)):
        if (isinstance(sized, str | list | tuple) and isinstance(count, int)
                and len(sized) * count > limit):
            raise TemplateTooLong(limit)


@dataclass(frozen=True)
class RenderedChat:
    text: str  # the prompt; control texts from caller strings stand as sentinels
    literals: dict[str, str] = field(default_factory=dict)  # sentinel -> its control text


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


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


class ChatTemplate:
    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        control_texts: Collection[str] = (),
    ) -> None:
        env = _BoundedSandbox(
            trim_blocks=True,
            lstrip_blocks=True,
            undefined=jinja2.ChainableUndefined,
            # {% break %} / {% continue %}, as Hugging Face's template renderer allows.
            extensions=["jinja2.ext.loopcontrols"],
        )
        env.filters["tojson"] = _tojson
        for name in ("center", "indent"):
            env.filters[name] = _bounded_filter(name, env.filters[name])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template does not parse: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._control = literal_pattern(control_texts)
        # Templates that never mention a message's name drop it; we then prefix it.
        self.renders_tools = re.search(r"\btools\b", source) is not None
        self.renders_names = re.search(r"""\.name\b|\[\s*['"]name['"]\s*\]""", source) is not None

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        max_chars: int | None = None,
        **extra: Any,
    ) -> RenderedChat:
        """`messages` and `extra` are caller data; the template's own text is markup.
        `max_chars`: stop with TemplateTooLong once the output passes this many."""
        shield = _Shield(self._control, self.source)
        messages, extra = shield.apply((messages, extra))
        token = _max_chars.set(max_chars)
        try:
            pieces = self._template.generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
            text = joined_within(pieces, max_chars)
        except TemplateError:
            raise
        except Exception as exc:  # a template bug is the request's problem, not a crash
            raise TemplateError(f"the chat template failed on these messages: {exc}") from exc
        finally:
            _max_chars.reset(token)
        literals = {sentinel: control for control, sentinel in shield.sentinels.items()}
        return RenderedChat(text, literals)


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
