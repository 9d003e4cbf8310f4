"""Errors on /api/* in Ollama's shape: {"error": "..."} with the same status codes, from
the OpenAI-shaped errors every error path makes (the app applies it through
api/http/error_reshape.py)."""

from __future__ import annotations

from typing import Any

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


def is_ollama_path(path: str) -> bool:
    return path.startswith(PREFIX)


def ollama_error(_status: int, body: Any) -> dict[str, str]:
    """The error body of an answer on /api/* (Ollama keeps the status codes)."""
    return ollama_body(body)
