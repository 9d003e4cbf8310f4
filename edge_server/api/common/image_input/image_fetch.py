"""http(s) image URLs (`--image-urls on`), fetched before a request is prepared.

Fetches run in a small pool of their own, awaited on the event loop before the
request's preparation starts: slow servers hold fetch threads only, never the threads
that prepare (tokenize, resize) other requests. Every route that reads image URLs
fetches them first (`with fetched_images(await fetch_image_urls(body, engine))`);
preparation only looks the results up. One fetch (its deadline, its address checks) is url_fetch's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel

from edge_server.api.common.image_input.url_fetch import FetchError, fetch, is_http_url
from edge_server.engine import Engine
from edge_server.engine.multimodal.projector import ImageLimits

log = logging.getLogger(__name__)

FETCH_THREADS = 4
_pool = ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="image-fetch")

# What the request's fetches gave, by URL: the image's bytes, or why there are none.
_fetched: ContextVar[dict[str, bytes | FetchError] | None] = ContextVar(
    "fetched_images", default=None)


# --- finding a request's image URLs ------------------------------------------------------


def image_urls(body: Any) -> list[str]:
    """The http(s) image URLs of a validated request (or of stored items), wherever each
    API puts them: chat `image_url` parts, Responses `input_image` parts, Anthropic image
    blocks with a `url` source, and the `images` of /v1/completions. Walked without
    recursion."""
    found: list[Any] = []
    stack: list[Any] = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, BaseModel):
            node = {**dict(node), **(node.model_extra or {})}
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        kind = node.get("type")
        if kind in ("image_url", "input_image"):
            url = node.get("image_url")
            found.append(url.get("url") if isinstance(url, dict) else url)
        elif kind == "image" and isinstance(node.get("source"), dict):
            found.append(node["source"].get("url"))
        images = node.get("images")
        if isinstance(images, list):
            found.extend(images)
        stack.extend(v for v in node.values() if isinstance(v, BaseModel | list | dict))
    return list(dict.fromkeys(u for u in found if is_http_url(u)))


# --- fetching ---------------------------------------------------------------------------


async def fetch_all(urls: list[str], limits: ImageLimits) -> dict[str, bytes | FetchError]:
    """Fetches the URLs at once in the fetch pool; each answer within the deadline."""
    loop = asyncio.get_running_loop()

    async def one(url: str) -> bytes | FetchError:
        future = loop.run_in_executor(_pool, fetch, url, limits)
        try:
            # The fetch keeps its own deadline; this one also covers a fetch that waited
            # for a pool thread, or a resolver that does not answer.
            return await asyncio.wait_for(future, limits.fetch_timeout + 1)
        except FetchError as exc:
            return exc
        except TimeoutError:
            return FetchError(f"the image URL did not answer within "
                              f"{limits.fetch_timeout:g} s")

    results = await asyncio.gather(*(one(url) for url in urls))
    return dict(zip(urls, results, strict=True))


async def fetch_image_urls(body: BaseModel, engine: Engine, *,
                           also: Any = None) -> dict[str, bytes | FetchError]:
    """The body's image URLs fetched, where this server fetches them and the model reads
    images (else none); `also`: more of the conversation the request renders (a stored
    one's items), whose URLs are fetched too. More URLs than a request may carry are not
    fetched: preparation refuses the count by name. For `fetched_images`."""
    limits = engine.settings.image_limits
    urls = list(dict.fromkeys([*image_urls(also), *image_urls(body)])) \
        if limits.fetch_urls and "image" in engine.modalities else []
    if not urls or len(urls) > limits.max_images:
        return {}
    return await fetch_all(urls, limits)


@contextmanager
def fetched_images(results: dict[str, bytes | FetchError]) -> Iterator[None]:
    """Makes the fetch results visible to the request's preparation (its threads too)."""
    token = _fetched.set(results)
    try:
        yield
    finally:
        _fetched.reset(token)


def fetched(url: str) -> bytes:
    """The bytes fetched for `url` before preparation; raises FetchError. Never fetches
    here: a preparation thread waiting on a slow server stalls every request's
    preparation behind it."""
    results = _fetched.get()
    result = results.get(url) if results is not None else None
    if result is None:
        log.error("an image URL reached preparation without being fetched first")
        result = FetchError("the image URL was not fetched")
    if isinstance(result, FetchError):
        raise result
    return result
