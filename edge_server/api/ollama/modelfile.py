"""A Modelfile's text as the parts /api/create reads: `FROM`, `TEMPLATE`, `SYSTEM` and
`PARAMETER` (Ollama's syntax: one command a line, case-insensitive, `#` comments,
arguments bare, "quoted" or in \"\"\"triple quotes\"\"\" over several lines). Ollama's other
commands (`ADAPTER`, `LICENSE`, `MESSAGE`, ...) are refused by name, not dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..http.errors import invalid

_REFUSED = {
    "adapter": "LoRA adapters are not applied here",
    "license": "licenses are read from the model's file here",
    "message": "saved messages are not kept here: send them with each chat",
    "requires": "there is no Ollama version to require here",
    "renderer": "the model's own chat template renders here",
    "parser": "the model's own output parsing applies here",
    "draft": "draft models are set when the server starts (--draft-max)",
}
_KNOWN = {"from", "template", "system", "parameter", *_REFUSED}


@dataclass
class Recipe:
    """What a new model is made of: where from, and what it adds."""

    source: str | None = None
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


def parse(text: str) -> Recipe:
    recipe = Recipe()
    at = 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        line = text.count("\n", 0, at) + 1
        end = text.find("\n", at)
        end = len(text) if end < 0 else end
        if text[at] == "#":
            at = end
            continue
        command, _, _ = text[at:end].partition(" ")
        command = command.split("\t")[0]
        name = command.lower()
        if name not in _KNOWN:
            raise invalid("modelfile", f"`modelfile` line {line}: `{command[:40]}` is not "
                          "a Modelfile command")
        if name in _REFUSED:
            raise invalid("modelfile", f"`modelfile` line {line}: {command.upper()} is not "
                          f"supported: {_REFUSED[name]}")
        at += len(command)
        while at < len(text) and text[at] in " \t":
            at += 1
        if name == "parameter":
            key_end = at
            while key_end < len(text) and not text[key_end].isspace():
                key_end += 1
            key = text[at:key_end]
            at = key_end
            while at < len(text) and text[at] in " \t":
                at += 1
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
        elif name == "template":
            recipe.template = value
        else:
            recipe.system = value
    return recipe
