"""http(s) image URLs (`--image-urls on`), fetched before a request is prepared.

- One deadline per fetch (`--image-url-timeout`) for everything: name resolution,
  connecting, each redirect and the whole body. The socket's timeout is set to what is
  left before every read, so a server that trickles a byte every few seconds is cut off
  at the deadline, not kept for as long as it keeps trickling.
- Fetches run in a small pool of their own, awaited on the event loop before the
  request's preparation starts: slow servers hold fetch threads only, never the threads
  that prepare (tokenize, resize) other requests.
- Every address a fetch would connect to, the first and each redirect's, is checked
  before connecting: private, loopback, link-local and other non-global addresses are
  refused unless a network of `--image-url-networks` holds them. The connection goes to
  the address that was checked (a name resolving elsewhere the second time cannot
  redirect it).
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import socket
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from ...engine import Engine
from ...engine.multimodal.projector import ImageLimits
from ..http.dependencies import parse_body, serve_with_model

Result = TypeVar("Result")

Body = TypeVar("Body", bound=BaseModel)  # a request body with a `model` field

FETCH_THREADS = 4
MAX_REDIRECTS = 3
_READ_BYTES = 64 << 10
_pool = ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="image-fetch")

# What the request's fetches gave, by URL: the image's bytes, or why there are none.
_fetched: ContextVar[dict[str, bytes | FetchError] | None] = ContextVar(
    "fetched_images", default=None)


class FetchError(Exception):
    def __init__(self, message: str, code: str = "image_fetch_failed") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def is_http_url(url: object) -> bool:
    return isinstance(url, str) and url[:8].lower().startswith(("http://", "https://"))


# --- finding a request's image URLs ------------------------------------------------------


def image_urls(body: BaseModel) -> list[str]:
    """The http(s) image URLs of a validated request, wherever each API puts them:
    chat `image_url` parts, Responses `input_image` parts, Anthropic image blocks with a
    `url` source, and the `images` of /v1/completions. Walked without recursion."""
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


async def with_image_urls(body: BaseModel, engine: Engine,
                          serve: Callable[[], Awaitable[Result]]) -> Result:
    """Runs `serve` (which prepares the request) with the body's image URLs fetched
    first, where this server fetches them and the model reads images. More URLs than a
    request may carry are not fetched: preparation refuses the count by name."""
    limits = engine.settings.image_limits
    urls = image_urls(body) if limits.fetch_urls and "image" in engine.modalities else []
    if not urls or len(urls) > limits.max_images:
        return await serve()
    with fetched_images(await fetch_all(urls, limits)):
        return await serve()


async def serve_body(request: Request, body_type: type[Body],
                     create: Callable[[Body, Engine], Awaitable[Response]]) -> Response:
    """A generating route's common path: the body parsed, its model leased, its image
    URLs fetched, then `create(body, engine)`."""
    body = await parse_body(request, body_type)
    model: str = body.model  # type: ignore[attr-defined]  # every generating body has one
    return await serve_with_model(request, model, lambda engine: with_image_urls(
        body, engine, lambda: create(body, engine)))


@contextmanager
def fetched_images(results: dict[str, bytes | FetchError]) -> Iterator[None]:
    """Makes the fetch results visible to the request's preparation (its threads too)."""
    token = _fetched.set(results)
    try:
        yield
    finally:
        _fetched.reset(token)


def fetched(url: str, limits: ImageLimits) -> bytes:
    """The bytes fetched for `url` before preparation (or fetched now, where a caller
    did not fetch first); raises FetchError."""
    results = _fetched.get()
    result = results.get(url) if results is not None else None
    if result is None:
        result = _pool.submit(fetch, url, limits).result(limits.fetch_timeout + 1)
    if isinstance(result, FetchError):
        raise result
    return result


def fetch(url: str, limits: ImageLimits) -> bytes:
    """GETs the image, following at most MAX_REDIRECTS redirects, each target checked,
    all within limits.fetch_timeout seconds."""
    deadline = time.monotonic() + limits.fetch_timeout
    for _ in range(MAX_REDIRECTS + 1):
        location = _get(url, limits, deadline)
        if isinstance(location, bytes):
            return location
        url = urllib.parse.urljoin(url, location)
        if not is_http_url(url):
            raise FetchError("the image URL redirects to something other than http(s)")
    raise FetchError(f"the image URL redirects more than {MAX_REDIRECTS} times")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchError("the image URL took longer than the fetch deadline")
    return left


def _address(host: str, port: int, limits: ImageLimits, deadline: float) -> str:
    """The address to connect to; refused where it is not a public one (SSRF)."""
    _left(deadline)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise FetchError("the image URL's host could not be resolved") from exc
    allowed = [ipaddress.ip_network(n, strict=False) for n in limits.fetch_networks]
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if not address.is_global and not any(address in net for net in allowed):
            raise FetchError("the image URL points to a private, loopback or link-local "
                             "address, which this server does not fetch",
                             "image_url_not_allowed")
    return str(infos[0][4][0])


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a checked address, with the certificate checked for the URL's host
    against the CAs OpenSSL trusts by default: the system's bundle, or the one the
    server's SSL_CERT_FILE names (where an operator adds a private CA)."""

    def __init__(self, address: str, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def _get(url: str, limits: ImageLimits, deadline: float) -> bytes | str:
    """One GET: the body, or a redirect's Location."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    if not host:
        raise FetchError("the image URL has no host")
    try:
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError as exc:
        raise FetchError("the image URL's port is not valid") from exc
    address = _address(host, port, limits, deadline)
    conn: http.client.HTTPConnection = (
        _PinnedHTTPS(address, host, port, _left(deadline)) if parts.scheme.lower() == "https"
        else http.client.HTTPConnection(address, port, timeout=_left(deadline)))
    try:
        conn.connect()
        sock = conn.sock  # kept: the response reads from it even after conn lets go
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", parts.netloc.rsplit("@", 1)[-1])
        conn.putheader("User-Agent", "edge-server")
        conn.endheaders()
        response = conn.getresponse()
        if response.status in (301, 302, 303, 307, 308):
            location = response.getheader("Location")
            if not location:
                raise FetchError("the image URL redirects without a Location")
            return location
        if response.status != 200:
            raise FetchError(f"the image URL answered HTTP {response.status}")
        return _body(sock, response, limits, deadline)
    except TimeoutError as exc:
        raise FetchError("the image URL took longer than the fetch deadline") from exc
    except ssl.SSLCertVerificationError as exc:
        raise FetchError("the image URL's TLS certificate could not be verified") from exc
    except ssl.SSLError as exc:
        raise FetchError("the TLS handshake with the image URL failed") from exc
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise FetchError("the image URL could not be fetched") from exc
    finally:
        conn.close()


def _body(sock: socket.socket, response: http.client.HTTPResponse, limits: ImageLimits,
          deadline: float) -> bytes:
    data = bytearray()
    while True:
        sock.settimeout(_left(deadline))  # each read waits only for what is left
        piece = response.read1(_READ_BYTES)
        if not piece:
            return bytes(data)
        data += piece
        if len(data) > limits.max_bytes:
            raise FetchError(f"the image is larger than {limits.max_bytes >> 20} MiB",
                             "image_too_large")
