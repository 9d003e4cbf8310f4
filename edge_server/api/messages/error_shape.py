"""Errors on /v1/messages* in Anthropic's shape: {"type": "error", "error": {"type",
"message"}}.

Every error of the server (validation, auth, body limit, unknown model, overload, a 500)
is made in the OpenAI shape; this middleware reshapes those on Anthropic's paths, so that
no error path needs to know which door it answers for.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PATH = "/v1/messages"

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
          500: "api_error", 529: "overloaded_error"}


def is_messages_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


def anthropic_body(status: int, body: Any) -> dict[str, Any]:
    """The Anthropic body of an OpenAI-shaped error body."""
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    message = str(error.get("message") or "error")
    param = error.get("param")
    # Anthropic has no `param`: the message names the field instead.
    if param and str(param) not in message:
        message = f"{param}: {message}"
    if status == 503:
        # No slot in time, or the model still loading: both pass if the client waits.
        overloaded = (error.get("type") == "server_overloaded"
                      or error.get("code") == "model_unavailable")
        kind = "overloaded_error" if overloaded else "api_error"
    else:
        kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class AnthropicErrors:
    """ASGI middleware: reshapes JSON error answers on /v1/messages*."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_messages_path(scope.get("path", "")):
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
        body = {"error": {"message": raw.decode("utf-8", "replace")[:1000] or "error"}}
    out = json.dumps(anthropic_body(start["status"], body)).encode()
    headers = [(k, v) for k, v in start.get("headers", [])
               if k.lower() not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"),
                (b"content-length", str(len(out)).encode())]
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": out})
