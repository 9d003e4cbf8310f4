"""Renders chat messages with the model's own Jinja chat template (GGUF metadata).

Templates come from model files, so they run in Jinja's immutable sandbox: a template
can format messages but cannot touch Python objects or the file system.
"""

from __future__ import annotations

import json
import re
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


class TemplateError(ValueError):
    """The template could not render these messages (it said why, or it is broken)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template does not parse: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        # Templates that never mention a message's name drop it; we then prefix it.
        self.renders_tools = re.search(r"\btools\b", source) is not None
        self.renders_names = re.search(r"""\.name\b|\[\s*['"]name['"]\s*\]""", source) is not None

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except TemplateError:
            raise
        except Exception as exc:  # a template bug is the request's problem, not a crash
            raise TemplateError(f"the chat template failed on these messages: {exc}") from exc
