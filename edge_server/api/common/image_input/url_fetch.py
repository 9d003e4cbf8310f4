"""One image URL fetched (`--image-urls on`): redirects followed, each address checked,
all within one deadline (`--image-url-timeout`).

The deadline covers every wait of the fetch, not each read alone: name resolution (on
a resolver thread, given up on at the deadline), connecting, the TLS handshake, sending
the request, and every read of the status line, headers and body. Each socket wait is
given only what is left, so a server trickling a header byte a second is cut off at the
deadline, not kept for as long as it keeps trickling.

Every address a fetch would connect to, the first and each redirect's, is checked
before connecting (fetch_address); the connection goes to the address that was checked
(a name resolving elsewhere the second time cannot redirect it).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from edge_server.api.common.image_input.fetch_address import fetch_allowed, networks
from edge_server.engine.multimodal.projector import ImageLimits

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

MAX_REDIRECTS = 3
RESOLVER_THREADS = 4
_READ_BYTES = 64 << 10
# getaddrinfo cannot be interrupted: it runs here, and a fetch stops waiting for it at
# its deadline (the lookup ends when the system resolver gives up).
_resolver = ThreadPoolExecutor(max_workers=RESOLVER_THREADS, thread_name_prefix="image-dns")


class FetchError(Exception):
    def __init__(self, message: str, code: str = "image_fetch_failed") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def is_http_url(url: object) -> bool:
    return isinstance(url, str) and url[:8].lower().startswith(("http://", "https://"))


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left; FetchError once none are."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise FetchError("the image URL took longer than the fetch deadline")
        return left


class _DeadlineSocket(socket.socket):
    """A socket whose every wait (http.client reads through recv_into) ends at the
    fetch's deadline."""

    deadline: Deadline

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(self.deadline.left())
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        self.settimeout(self.deadline.left())
        super().sendall(data, flags)


class _DeadlineTLSSocket(ssl.SSLSocket):
    """The same for TLS (the handshake's timeout, set once, already bounds it whole)."""

    deadline: Deadline

    def recv_into(self, buffer: WriteableBuffer, nbytes: int | None = None,
                  flags: int = 0) -> int:
        self.settimeout(self.deadline.left())
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        self.settimeout(self.deadline.left())
        super().sendall(data, flags)


def _tls_context() -> ssl.SSLContext:
    """The CAs OpenSSL trusts by default: the system's bundle, or the one the server's
    SSL_CERT_FILE names (where an operator adds a private CA)."""
    context = ssl.create_default_context()
    context.sslsocket_class = _DeadlineTLSSocket
    return context


class _PinnedConnection(http.client.HTTPConnection):
    """HTTP(S) to the checked address, with the Host (and the certificate's name) of
    the URL, every wait bounded by the fetch's deadline."""

    def __init__(self, address: str, host: str, port: int, tls: bool,
                 deadline: Deadline) -> None:
        super().__init__(host, port)
        self._address = address
        self._tls = tls
        self._deadline = deadline

    def connect(self) -> None:
        family = socket.AF_INET6 if ":" in self._address else socket.AF_INET
        sock = _DeadlineSocket(family, socket.SOCK_STREAM)
        sock.deadline = self._deadline
        try:
            sock.settimeout(self._deadline.left())
            sock.connect((self._address, self.port))
            if not self._tls:
                self.sock = sock
                return
            sock.settimeout(self._deadline.left())  # the whole handshake's
            tls: Any = _tls_context().wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        tls.deadline = self._deadline
        self.sock = tls


def fetch(url: str, limits: ImageLimits) -> bytes:
    """GETs the image, following at most MAX_REDIRECTS redirects, each target checked,
    all within limits.fetch_timeout seconds."""
    deadline = Deadline(limits.fetch_timeout)
    for _ in range(MAX_REDIRECTS + 1):
        location = _get(url, limits, deadline)
        if isinstance(location, bytes):
            return location
        url = urllib.parse.urljoin(url, location)
        if not is_http_url(url):
            raise FetchError("the image URL redirects to something other than http(s)")
    raise FetchError(f"the image URL redirects more than {MAX_REDIRECTS} times")


def _address(host: str, port: int, limits: ImageLimits, deadline: Deadline) -> str:
    """The address to connect to; refused where it is not a public one (SSRF)."""
    lookup = _resolver.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        infos = lookup.result(deadline.left())
    except TimeoutError as exc:
        lookup.cancel()
        raise FetchError("the image URL's host was not resolved within the fetch "
                         "deadline") from exc
    except (OSError, UnicodeError) as exc:
        raise FetchError("the image URL's host could not be resolved") from exc
    allowed = networks(limits.fetch_networks)
    for *_, sockaddr in infos:
        if not fetch_allowed(str(sockaddr[0]), allowed):
            raise FetchError("the image URL points to a private, loopback, link-local or "
                             "otherwise non-public address, which this server does not "
                             "fetch", "image_url_not_allowed")
    return str(infos[0][4][0])


def _get(url: str, limits: ImageLimits, deadline: Deadline) -> bytes | str:
    """One GET: the body, or a redirect's Location."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    if not host:
        raise FetchError("the image URL has no host")
    tls = parts.scheme.lower() == "https"
    try:
        port = parts.port or (443 if tls else 80)
    except ValueError as exc:
        raise FetchError("the image URL's port is not valid") from exc
    conn = _PinnedConnection(_address(host, port, limits, deadline), host, port, tls, deadline)
    try:
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
        return _body(response, limits)
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


def _body(response: http.client.HTTPResponse, limits: ImageLimits) -> bytes:
    data = bytearray()
    while piece := response.read1(_READ_BYTES):
        data += piece
        if len(data) > limits.max_bytes:
            raise FetchError(f"the image is larger than {limits.max_bytes >> 20} MiB",
                             "image_too_large")
    return bytes(data)
