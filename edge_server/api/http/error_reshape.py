"""Error answers in another protocol's shape, for the doors that speak one.

Every error of the server (validation, auth, body limit, unknown model or route,
overload, a 500) is made in the OpenAI shape; this middleware rewrites those on a door's
paths (Anthropic's /v1/messages*, Ollama's /api/*), so that no error path needs to know
which door it answers for.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# (status, OpenAI-shaped error body) -> the door's error body
Reshape = Callable[[int, Any], dict[str, Any]]


class ErrorReshaper:
    """ASGI middleware: error answers (status >= 400) on the paths `matches` accepts are
    held until whole, then sent as `reshape(status, body)`; a body that is not JSON is
    taken as the error's message."""

    def __init__(self, app: ASGIApp, matches: Callable[[str], bool], reshape: Reshape,
                 content_type: bytes = b"application/json") -> None:
        self.app = app
        self.matches = matches
        self.reshape = reshape
        self.content_type = content_type

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.matches(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def reshaping_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the whole body is known
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            await self._send_reshaped(send, start, b"".join(chunks))

        await self.app(scope, receive, reshaping_send)

    async def _send_reshaped(self, send: Send, start: Message, raw: bytes) -> None:
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"error": {"message": raw.decode("utf-8", "replace")[:1000] or "error"}}
        out = json.dumps(self.reshape(start["status"], body), ensure_ascii=False).encode()
        headers = [(k, v) for k, v in start.get("headers", [])
                   if k.lower() not in (b"content-length", b"content-type")]
        headers += [(b"content-type", self.content_type),
                    (b"content-length", str(len(out)).encode())]
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": out})
