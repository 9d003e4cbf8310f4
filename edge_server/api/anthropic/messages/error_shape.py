"""Errors on /v1/messages* in Anthropic's shape: {"type": "error", "error": {"type",
"message"}}, from the OpenAI-shaped errors every error path makes (the app applies it
through api/http/error_reshape.py; streams send it as their error event)."""

from __future__ import annotations

from typing import Any

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
