"""Prepared images freed deterministically, on every path that does not reach the engine.

A request's images are prepared (resized, normalised: C memory held by ImageChunks)
before the request is queued, and many things can end it in between: a 400 for
max_tokens, a full queue, a client gone while its prompt was tokenized. Left to the
garbage collector, the chunks of such requests stay alive as long as an exception's
traceback does, and they count against MAX_PREPARED_IMAGES meanwhile.

`images_scope()` wraps the serving of one request: every chunk the projector prepares
inside it (on any thread the context is copied to, as anyio's worker threads do) is
listed, and on leaving the scope, however it is left, each chunk the engine did not take
is freed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol


class ImageChunk(Protocol):  # projector.ImageChunk (which imports this module)
    taken: bool

    def close(self) -> None: ...


_prepared: ContextVar[list[ImageChunk] | None] = ContextVar("prepared_images", default=None)


def note_prepared(chunk: ImageChunk) -> None:
    """Called by the projector for each chunk it prepares."""
    scope = _prepared.get()
    if scope is not None:
        scope.append(chunk)  # list.append: atomic, from whichever thread prepares


@contextmanager
def images_scope() -> Iterator[None]:
    """Frees, when left, every image chunk prepared inside and not taken by the engine."""
    chunks: list[ImageChunk] = []
    token = _prepared.set(chunks)
    try:
        yield
    finally:
        _prepared.reset(token)
        for chunk in chunks:
            if not chunk.taken:
                chunk.close()
