"""Prompt sizes refused before tokenizing: tokenizing megabytes only to find they do not
fit would let one request occupy a CPU for seconds."""

from __future__ import annotations

from edge_server.api.http.errors import APIError
from edge_server.engine import Engine


def too_long(param: str, message: str) -> APIError:
    return APIError(
        400, message, type="invalid_request_error", param=param,
        code="context_length_exceeded",
    )


def prompt_size_limit(engine: Engine) -> int:
    """The most bytes (so characters too) a prompt that fits the context can have: no
    token covers more bytes than the vocabulary's longest. Renderers stop there."""
    return engine.n_ctx * engine.max_token_bytes


def rendered_too_long(param: str, engine: Engine) -> APIError:
    """A template render stopped at prompt_size_limit, before it wrote everything."""
    return too_long(
        param,
        f"The template's output passed {prompt_size_limit(engine)} characters, more than any "
        f"text that fits the context of {engine.n_ctx} tokens; it was stopped there.",
    )


def check_prompt_bytes(text: str, engine: Engine, param: str) -> None:
    """Refuses text that cannot fit the context whatever it says: no token covers more
    bytes than the vocabulary's longest, so this never refuses a prompt that fits."""
    limit = prompt_size_limit(engine)
    # Characters first: more characters than the limit means more bytes too.
    if len(text) > limit or len(text.encode("utf-8", errors="surrogatepass")) > limit:
        raise too_long(
            param,
            f"The prompt is longer than any text that fits the context of {engine.n_ctx} "
            "tokens.",
        )


def check_token_count(count: int, engine: Engine, param: str) -> None:
    if count > engine.n_ctx:
        raise too_long(
            param,
            f"The prompt is {count} tokens, which does not fit the context of "
            f"{engine.n_ctx} tokens.",
        )
