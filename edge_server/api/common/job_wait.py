"""Waiting on an engine job's future (an embedding or rerank batch job) while watching
the client: the work not yet done is dropped if the client leaves."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, TypeVar

from starlette.requests import Request

from edge_server.api.http.errors import from_engine_error
from edge_server.engine import EngineError
from edge_server.engine.errors import EngineCancelled

T = TypeVar("T")


async def _disconnected(http: Request) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def await_job(future: concurrent.futures.Future[T], http: Request) -> T:
    """The job's result; engine errors as API errors. The future is cancelled on the way
    out (a no-op once done), so the engine skips what is left of an abandoned job."""
    result = asyncio.wrap_future(future)
    watcher = asyncio.create_task(_disconnected(http))
    try:
        waiters: set[asyncio.Future[Any]] = {result, watcher}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if not result.done():  # the client left
            raise from_engine_error(EngineCancelled())
        try:
            return result.result()
        except EngineError as exc:
            raise from_engine_error(exc) from exc
    finally:
        watcher.cancel()
        future.cancel()
        result.cancel()
