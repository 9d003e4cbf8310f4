"""A place off the event loop for blocking disk and network work (hashing model files,
reading GGUF headers, calling the model hub), apart from the threads that prepare
requests (`off_loop`).

Preparation is CPU-bound and has as many threads as cores; disk and network work waits
on devices and peers, for seconds at a time. On one pool, two /api/tags hashing a large
file (or two slow hub calls) stalled the preparation of every chat. Here they queue for
threads of their own, a few at a time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread

Params = ParamSpec("Params")
Result = TypeVar("Result")

IO_THREADS = 4
_limiter: anyio.CapacityLimiter | None = None


async def run_io(
    fn: Callable[Params, Result], *args: Params.args, **kwargs: Params.kwargs
) -> Result:
    """Runs blocking disk or network work on one of IO_THREADS threads; the rest wait."""
    global _limiter
    if _limiter is None:
        _limiter = anyio.CapacityLimiter(IO_THREADS)
    return await anyio.to_thread.run_sync(
        functools.partial(fn, *args, **kwargs), limiter=_limiter
    )
