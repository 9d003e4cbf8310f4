"""Request bodies: a size cap enforced while they arrive, and JSON parsed within bounds.

Python's JSON parser recurses once per nesting level and accepts NaN, Infinity, numbers
that overflow to infinity and lone UTF-16 surrogates; none of these may reach the code
behind it, so each becomes a 400 here.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge_server.api.http.errors import APIError, invalid
from edge_server.api.http.limits import MAX_JSON_CONTAINERS, MAX_JSON_DEPTH, MAX_OBJECT_KEYS

_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def too_large(max_bytes: int) -> APIError:
    return APIError(
        413,
        f"The request body is larger than the limit of {max_bytes / 2**20:g} MiB.",
        code="request_too_large",
    )


class BodyLimit:
    """ASGI middleware: a declared Content-Length over the cap is refused before the body
    is read; a chunked body is counted as it arrives and refused once it passes the cap."""

    def __init__(self, app: ASGIApp, max_bytes: int, exempt_prefixes: tuple[str, ...] = ()
                 ) -> None:
        """`exempt_prefixes`: paths whose routes bound their bodies themselves."""
        self.app = app
        self.max_bytes = max_bytes
        self.exempt_prefixes = exempt_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (
                self.exempt_prefixes and scope.get("path", "").startswith(self.exempt_prefixes)):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await too_large(self.max_bytes).response()(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the handler's body read; the error handler answers 413.
                    raise too_large(self.max_bytes)
            return message

        await self.app(scope, counted, send)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object", "invalid_json")
    return body


def parse_json(raw: bytes) -> Any:
    """The body as JSON of any shape (llama-server's /lora-adapters takes an array), or
    a 400 that says what is wrong with it."""
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError as exc:
        raise _too_deep(raw) from exc
    except json.JSONDecodeError as exc:
        raise _bad_json(str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise _bad_json("it is not UTF-8") from exc
    except _NumberError as exc:
        raise _bad_json(str(exc)) from exc
    except ValueError as exc:  # an integer literal of thousands of digits
        raise _bad_json("a number is too large") from exc
    _check_tree(body, raw)
    return body


class _NumberError(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NumberError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NumberError(f"the number {text[:32]} is out of range")
    return value


def _too_many(what: str) -> APIError:
    return APIError(413, f"The request body holds {what}.", code="request_too_large")


def _bad_json(why: str) -> APIError:
    return invalid(None, f"the request body is not valid JSON: {why}", "invalid_json")


def _too_deep(raw: bytes) -> APIError:
    where = _deep_field(raw.decode("utf-8", "replace"))
    if where is None:
        return _bad_json(f"it nests deeper than {MAX_JSON_DEPTH} levels")
    return invalid(where, f"`{where}` nests deeper than the {MAX_JSON_DEPTH} levels a "
                   "request body may", "invalid_json")


# What moves the path through JSON text: strings (keys among them), brackets, commas.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')
_MAX_TOKENS = 200_000  # a bound on the scan: past it, the error names no field
_SHOWN_LEVELS = 12


def _deep_field(text: str) -> str | None:
    """The field where the text first nests deeper than MAX_JSON_DEPTH, as a param
    (`messages[1].content[0].input.a.a…`, its first levels), found by scanning the
    text without parsing it (the parser recurses, and has just failed or been refused).
    None where the body is no object or the scan would be long."""
    path: list[str | int] = []  # per open container: its key (object) or index (array)
    want_key = False
    for count, match in enumerate(_TOKENS.finditer(text)):
        token = match.group()
        if count > _MAX_TOKENS or (count == 0 and token != "{"):
            return None
        if token in "{[":
            if len(path) >= MAX_JSON_DEPTH:
                return _param(path)
            path.append("" if token == "{" else 0)
            want_key = token == "{"
        elif token in "}]":
            del path[-1:]
            want_key = False
        elif token == ",":
            if path and isinstance(path[-1], int):
                path[-1] += 1
            else:
                want_key = True
        elif want_key and path:
            path[-1] = token[1:-1]
            want_key = False
    return None


def _param(path: list[str | int]) -> str:
    out = ""
    for part in path[:_SHOWN_LEVELS]:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return out + ("…" if len(path) > _SHOWN_LEVELS else "")


def _check_tree(body: Any, raw: bytes) -> None:
    """Bounds the nesting depth (recursive code downstream: schemas, templates) and the
    number of objects and arrays, and refuses strings that are not valid Unicode, without
    recursing itself."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    containers = 0
    while stack:
        node, depth = stack.pop()
        containers += 1
        if containers > MAX_JSON_CONTAINERS:
            raise _too_many(f"more than {MAX_JSON_CONTAINERS} JSON objects and arrays")
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(raw)
        if isinstance(node, dict):
            if len(node) > MAX_OBJECT_KEYS:
                raise _too_many(f"an object with more than {MAX_OBJECT_KEYS} keys")
            for key in node:
                _check_text(key)
            children = node.values()
        else:
            children = node
        for child in children:
            kind = type(child)  # exact types: json.loads makes no subclasses
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
            elif kind is str:
                _check_text(child)


def _check_text(text: str) -> None:
    if _LONE_SURROGATE.search(text):
        raise invalid(
            None, "the request body holds a lone UTF-16 surrogate, which is not valid "
            "Unicode", "invalid_json")
