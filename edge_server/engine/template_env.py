"""The Jinja environment chat templates render in: the one Hugging Face's transformers
builds for `apply_chat_template` (the renderer template authors test against), so that
a template renders here as it renders there, inside bounds a prompt needs.

As transformers has it: the immutable sandbox, `trim_blocks` and `lstrip_blocks`,
`{% break %}`/`{% continue %}`, a `{% generation %}` block (it marks the assistant's
tokens for training; rendering, it writes its body), `tojson` without HTML escaping and
with `indent`, `separators`, `sort_keys` and `ensure_ascii`, `raise_exception`,
`strftime_now`, and `dict`/`namespace` that store no underscore names.

Ours on top: undefined values chain (`a.b.c` of an undefined `a` is undefined, where
transformers raises: a template that renders there renders the same here), and the
output is bounded: multiplying a string or list, `**` powers and padding or replacing
strings are refused beyond the running render's size limit before the product is made.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


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
max_chars_var: ContextVar[int | None] = ContextVar("chat_template_max_chars", default=None)


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, refusing what would make one piece too big to be a prompt
    before it is made: `*` products, `**` powers, and padding or replacing strings."""

    intercepted_binops = frozenset({"*", "**"})

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        limit = max_chars_var.get()
        owner = getattr(obj, "__self__", None)
        if (limit is not None and isinstance(owner, str)
                and _grown_size(owner, getattr(obj, "__name__", ""), args) > limit):
            raise TemplateTooLong(limit)
        return super().call(context, obj, *args, **kwargs)

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        limit = max_chars_var.get()
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
        limit = max_chars_var.get()
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


class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}`: transformers marks the assistant's text
    with it for training masks; a prompt needs only the body, written in place (so it
    streams, and stays within the output bound, as the rest of the template does)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return list(parser.parse_statements(("name:endgeneration",), drop_needle=True))


def _raise_exception(message: Any) -> None:
    raise TemplateError(str(message))


def _materialized(value: Any) -> Any:
    """`value` with every generator a filter chain leaves (`tools | map(...) | tojson`,
    DeepSeek R1's template) made the list it yields, as llama.cpp's template engine
    writes it (transformers fails there); read once, so every later pass sees it."""
    if isinstance(value, Iterator):
        value = list(value)
    if isinstance(value, list):
        return [_materialized(v) for v in value]
    if isinstance(value, dict):
        return {k: _materialized(v) for k, v in value.items()}
    return value


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    value = _materialized(value)
    limit = max_chars_var.get()
    if limit is not None and (indent is not None or separators is not None):
        _check_json_growth(value, ensure_ascii, indent, separators, limit)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _check_json_growth(value: Any, ensure_ascii: bool, indent: int | str | None,
                       separators: tuple[str, str] | None, limit: int) -> None:
    """Refuses an indent or separators that would make `value`'s JSON pass `limit`:
    at most one separator and one indented line per comma or colon of the compact
    form."""
    compact = json.dumps(value, ensure_ascii=ensure_ascii, separators=(",", ":"))
    joints = compact.count(",") + compact.count(":") + 1
    width = len(indent) if isinstance(indent, str) else max(indent or 0, 0)
    separator = max((len(str(s)) for s in separators or ()), default=2)
    line = 1 + width * _depth(value) if indent is not None else 0
    if len(compact) + joints * (separator + line) > limit:
        raise TemplateTooLong(limit)


def _depth(value: Any) -> int:
    """How deep lists and dicts nest in `value`, without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
    return deepest


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)`, without handing the type itself over."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A namespace storing no underscore names (nothing that reaches Python internals)."""

    # No named `self`, as in Namespace itself: `namespace(self=…)` still works.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, *rest, **kwargs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore names on a namespace ({name!r})")


def chat_environment(now: Callable[[], datetime] = datetime.now) -> jinja2.Environment:
    """The environment of a chat template; `now`: the clock `strftime_now` reads."""
    env = _BoundedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.ChainableUndefined,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    for name in ("center", "indent"):
        env.filters[name] = _bounded_filter(name, env.filters[name])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env
