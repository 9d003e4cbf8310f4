"""A Modelfile's text as the parts /api/create reads: `FROM`, `ADAPTER`, `TEMPLATE`,
`SYSTEM` and `PARAMETER` (Ollama's syntax: one command a line, case-insensitive, `#`
comments, arguments bare, "quoted" or in \"\"\"triple quotes\"\"\" over several lines).
Ollama's other commands (`LICENSE`, `MESSAGE`, ...) are refused by name, not dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from edge_server.api.http.errors import invalid
from edge_server.api.ollama.protocol import MAX_MODELFILE_CHARS

MAX_ARGUMENT_CHARS = 65_536  # a TEMPLATE or SYSTEM, as long as the fields' (CreateRequest)
_NON_SPACE = re.compile(r"\S")
_COMMAND = re.compile(r"[^ \t\n]*")  # up to a blank: `FROM`, `parameter`, `BOGUS`
_BLANKS = re.compile(r"[ \t]*")
_KEY = re.compile(r"\S*")

_REFUSED = {
    "license": "licenses are read from the model's file here",
    "message": "saved messages are not kept here: send them with each chat",
    "requires": "there is no Ollama version to require here",
    "renderer": "the model's own chat template renders here",
    "parser": "the model's own output parsing applies here",
    "draft": "draft models are set when the server starts (--draft-max)",
}
_KNOWN = {"from", "adapter", "template", "system", "parameter", *_REFUSED}


@dataclass
class Recipe:
    """What a new model is made of: where from, and what it adds."""

    source: str | None = None
    adapters: list[str] = field(default_factory=list)  # LoRA blobs' digests, as written
    template: str | None = None
    system: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


def _argument(text: str, at: int, line: int) -> tuple[str, int]:
    """The argument starting at `at` and where it ends: to the line's end, a "quoted"
    string (JSON escapes), or a \"\"\"block\"\"\" that may span lines."""
    if text.startswith('"""', at):
        end = text.find('"""', at + 3)
        if end < 0:
            raise invalid("modelfile", f"`modelfile` line {line}: a \"\"\" is not closed")
        return text[at + 3:end], end + 3
    if text.startswith('"', at):
        decoder = json.JSONDecoder()
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            raise invalid("modelfile", f"`modelfile` line {line}: a \" is not "
                          "closed") from None
        return str(value), end
    end = text.find("\n", at)
    end = len(text) if end < 0 else end
    return text[at:end].strip(), end


def _typed(key: str, value: str) -> Any:
    """A PARAMETER's text as the JSON value an `options` object would hold."""
    if key == "stop":
        return value
    try:
        number = json.loads(value)
    except json.JSONDecodeError:
        return value
    return number if isinstance(number, (int, float, bool)) else value


class _Lines:
    """Line numbers of positions met in order: each stretch of text is counted once, so
    reading a Modelfile stays linear in its length."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.line = 1

    def of(self, at: int) -> int:
        self.line += self.text.count("\n", self.at, at)
        self.at = at
        return self.line


def _line_end(text: str, at: int) -> int:
    end = text.find("\n", at)
    return len(text) if end < 0 else end


def _checked(line: int, name: str, value: str) -> str:
    if len(value) > MAX_ARGUMENT_CHARS:
        raise invalid("modelfile", f"`modelfile` line {line}: {name.upper()} has more than "
                      f"{MAX_ARGUMENT_CHARS} characters")
    return value


def parse(text: str) -> Recipe:
    """The Modelfile's parts, in one pass over its text (blocking: a thread's work for
    a long one)."""
    if len(text) > MAX_MODELFILE_CHARS:
        raise invalid("modelfile", f"`modelfile` has more than {MAX_MODELFILE_CHARS} "
                      "characters")
    recipe = Recipe()
    lines = _Lines(text)
    at = 0
    while (found := _NON_SPACE.search(text, at)) is not None:
        at = found.start()
        end = _line_end(text, at)
        if text[at] == "#":
            at = end
            continue
        line = lines.of(at)
        command = _COMMAND.match(text, at, end).group()  # type: ignore[union-attr]
        name = command.lower()
        if name not in _KNOWN:
            raise invalid("modelfile", f"`modelfile` line {line}: `{command[:40]}` is not "
                          "a Modelfile command")
        if name in _REFUSED:
            raise invalid("modelfile", f"`modelfile` line {line}: {command.upper()} is not "
                          f"supported: {_REFUSED[name]}")
        at = _BLANKS.match(text, at + len(command)).end()  # type: ignore[union-attr]
        if name == "parameter":
            key = _KEY.match(text, at).group()  # type: ignore[union-attr]
            at = _BLANKS.match(text, at + len(key)).end()  # type: ignore[union-attr]
            value, at = _argument(text, at, line)
            if not key or not value:
                raise invalid("modelfile", f"`modelfile` line {line}: PARAMETER needs a "
                              "name and a value")
            if key == "stop":
                recipe.parameters.setdefault("stop", []).append(value)
            else:
                recipe.parameters[key] = _typed(key, value)
            continue
        value, at = _argument(text, at, line)
        if name == "from":
            recipe.source = value
        elif name == "adapter":
            recipe.adapters.append(value)
        elif name == "template":
            recipe.template = _checked(line, name, value)
        else:
            recipe.system = _checked(line, name, value)
    return recipe
