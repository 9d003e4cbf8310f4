"""Bounds on what one request may ask for, checked before any costly work.

Each bound is generous for real use and exists so that no request can make the server
parse, render or tokenize without limit, or hand llama.cpp a value it cannot take.
"""

from __future__ import annotations

import re
from typing import Any

MAX_JSON_DEPTH = 64  # nesting of the request body (a JSON schema of ~30 levels fits)
# Objects and arrays in one body: validating each costs a few microseconds during which
# the validator holds the GIL, so 8 MiB of tiny messages would stall every stream.
MAX_JSON_CONTAINERS = 20_000
# Keys of one object, and items of list fields: pydantic reports every bad item of a
# dict or list on its own, and a million of them hold the GIL for seconds.
MAX_OBJECT_KEYS = 4096
MAX_MESSAGES = 10_000
MAX_CONTENT_PARTS = 1024
MAX_IMAGES = 64
MAX_TOKEN_IDS = 1_000_000  # /detokenize
MAX_LOGIT_BIAS = 1024  # entries of logit_bias
MAX_STOP = 4  # stop sequences (OpenAI)
MAX_STOP_CHARS = 512  # characters of one stop sequence
MAX_PROMPTS = 128  # prompts of one /v1/completions request
MAX_TOOLS = 128  # functions in `tools` (OpenAI)
MAX_TOOL_CALLS = 128  # tool calls of one assistant message
MAX_CACHE_KEY_CHARS = 1024  # prompt_cache_key (a load balancer hashes it)
INT32_MAX = 2**31 - 1


def token_ids(value: Any, *, max_items: int | None = MAX_TOKEN_IDS) -> list[int]:
    """A list of integers, checked item by item in Python (which lets other threads run)
    rather than by pydantic, whose errors for a long list of non-integers take seconds.
    `max_items` None: bounded later (a prompt, by the context)."""
    if not isinstance(value, list) or not all(type(t) is int for t in value):
        raise ValueError("must be a list of token ids (integers)")
    if max_items is not None and len(value) > max_items:
        raise ValueError(f"at most {max_items} token ids")
    return value


def within_depth(value: dict[str, Any] | list[Any], limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a JSON value nests at most `limit` levels (checked without recursing)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return False
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return True


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"?')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def nesting_depth(text: str) -> int:
    """How deep JSON text's arrays and objects nest, counted without parsing (the parser
    recurses per level); brackets inside strings do not count, and cut-off text counts
    what it opened."""
    depth = deepest = 0
    for char in _NOT_BRACKETS.sub("", _STRINGS.sub("", text)):
        depth += 1 if char in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def check_stops(stops: list[str] | None) -> list[str] | None:
    """A pydantic validator's body for stop sequences that must be non-empty and at most
    MAX_STOP_CHARS characters each (Anthropic's and Ollama's; OpenAI allows "")."""
    for stop in stops or []:
        if not stop or len(stop) > MAX_STOP_CHARS:
            raise ValueError(f"a stop sequence has 1 to {MAX_STOP_CHARS} characters")
    return stops
