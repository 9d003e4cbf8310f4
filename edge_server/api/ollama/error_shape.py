"""Errors on /api/* in Ollama's shape: {"error": "..."} with the same status codes.

Every error of the server (validation, auth, body limit, unknown model or route,
overload, a 500) is made in the OpenAI shape; this middleware reshapes those on Ollama's
paths, so that no error path needs to know which door it answers for.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PREFIX = "/api/"


def ollama_body(body: Any) -> dict[str, str]:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, str):
        return {"error": error}  # already Ollama's
    error = error if isinstance(error, dict) else {}
    message = str(error.get("message") or "error")
    param = error.get("param")
    # Ollama has no `param`: the message names the field instead.
    if param and str(param) not in message:
        message = f"{param}: {message}"
    return {"error": message}


class OllamaErrors:
    """ASGI middleware: reshapes JSON error answers on /api/*."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(PREFIX):
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
            await _send_reshaped(send, start, b"".join(chunks))

        await self.app(scope, receive, reshaping_send)


async def _send_reshaped(send: Send, start: Message, raw: bytes) -> None:
    try:
        body = json.loads(raw)
    except ValueError:
        body = {"error": raw.decode("utf-8", "replace")[:1000] or "error"}
    out = json.dumps(ollama_body(body), ensure_ascii=False).encode()
    headers = [(k, v) for k, v in start.get("headers", [])
               if k.lower() not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json; charset=utf-8"),
                (b"content-length", str(len(out)).encode())]
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": out})
