"""HEAD and POST /api/blobs/sha256:<digest>: a GGUF file a client uploads before
/api/create names it (as `ollama create` and the client libraries do for a local file).

The body streams to a temporary file in the models directory while it is hashed, never
held in memory; it must start with GGUF's magic and fit the free disk, less a margin
(--min-free-disk-mb, at least 512 MiB) and the room the other uploads in flight
reserved (upload_room); it is kept under its digest only when the SHA-256 of what
arrived is that digest. An upload that does not finish leaves no file.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import uuid
from pathlib import Path
from typing import BinaryIO

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import APIError, invalid
from edge_server.api.http.guards.auth import require_admin
from edge_server.api.ollama.management.saved_models import BLOB_PREFIX, blob_path
from edge_server.api.ollama.management.upload_room import (
    UPLOAD_PREFIX,
    NoRoom,
    Reservation,
    open_locked,
    remove_stale,
)
from edge_server.catalogue.store import ModelStore

PREFIX = "/api/blobs/"
GGUF_MAGIC = b"GGUF"
DISK_MARGIN = 512 * 2**20  # left free at least, for the server's own files (prompt cache)
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")


def digest_of(text: str, param: str = "digest") -> str:
    """`sha256:<64 hex digits>` (Ollama also writes `sha256-`), or a 400."""
    match = _DIGEST.fullmatch(text)
    if match is None:
        raise invalid(param, f"`{param}` must be sha256:<64 lowercase hex digits>")
    return BLOB_PREFIX + match.group(1)


def _store(request: Request) -> ModelStore:
    store: ModelStore | None = getattr(request.app.state, "store", None)
    if store is None:
        raise APIError(400, "this server has no models directory to keep files in",
                       code="unsupported_endpoint")
    return store


async def blob_exists(request: Request) -> Response:
    require_admin(request)
    digest = digest_of(request.path_params["digest"])
    found = await off_loop(blob_path(_store(request), digest).is_file)
    return Response(status_code=200 if found else 404)


def remove_stale_uploads(store: ModelStore) -> None:
    """At start: the unfinished uploads no process is writing (blocking)."""
    remove_stale(blob_path(store, BLOB_PREFIX).parent)


def _keep_free(store: ModelStore) -> int:
    return max(store.min_free_bytes, DISK_MARGIN)


def _too_large() -> APIError:
    return APIError(413, "the file is larger than the free disk space of the models "
                    "directory allows (with the uploads in progress)", code="request_too_large")


def _not_written() -> APIError:
    return APIError(507, "the file could not be written to the models directory",
                    code="insufficient_storage")


class _Upload:
    """One upload on its way to disk: written, hashed and counted as it arrives, each
    chunk's room reserved first (upload_room)."""

    def __init__(self, path: Path, keep_free: int, declared: int | None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.room = Reservation(path.parent, keep_free)
        if declared is not None:
            self.ahead(declared)
        self.size = 0
        self.hash = hashlib.sha256()
        self.head = b""
        try:
            self.file: BinaryIO = open_locked(path)
        except BaseException:
            self.room.close()
            raise

    def ahead(self, declared: int) -> None:
        try:
            self.room.ahead(declared)
        except NoRoom:
            raise _too_large() from None

    def write(self, chunk: bytes) -> None:
        if len(self.head) < len(GGUF_MAGIC):
            self.head += chunk[:len(GGUF_MAGIC)]
            if not GGUF_MAGIC.startswith(self.head[:len(GGUF_MAGIC)]):
                raise invalid(None, "the file is not a GGUF model (it does not start with "
                              "GGUF's magic)")
        try:
            self.room.take(len(chunk))
        except NoRoom:
            raise _too_large() from None
        self.size += len(chunk)
        self.hash.update(chunk)
        self.file.write(chunk)

    def finish(self, target: Path) -> None:
        self.file.close()
        self.path.replace(target)
        self.room.close()

    def abandon(self) -> None:
        """Closes and removes the file, and gives its room back (quick: a close and an
        unlink, as an upload cancelled mid-way must do it where it stands)."""
        with contextlib.suppress(OSError):
            self.file.close()
        self.path.unlink(missing_ok=True)
        self.room.close()


async def upload_blob(request: Request) -> Response:
    require_admin(request)
    digest = digest_of(request.path_params["digest"])
    store = _store(request)
    target = blob_path(store, digest)
    if await off_loop(target.is_file):
        return Response(status_code=200)  # already here, as Ollama answers
    declared = request.headers.get("content-length", "")
    try:
        upload = await off_loop(_Upload, target.with_name(f"{UPLOAD_PREFIX}{uuid.uuid4().hex}"),
                                _keep_free(store), int(declared) if declared.isdigit() else None)
    except OSError as exc:
        raise _not_written() from exc
    done = False
    try:
        async for chunk in request.stream():
            if chunk:
                await off_loop(upload.write, chunk)
        if len(upload.head) < len(GGUF_MAGIC):
            raise invalid(None, "the file is not a GGUF model (it is too short)")
        actual = BLOB_PREFIX + upload.hash.hexdigest()
        if actual != digest:
            raise invalid("digest", f"digest mismatch: the file's is {actual}")
        await off_loop(upload.finish, target)
        done = True
    except (APIError, ClientDisconnect, OSError) as exc:
        await off_loop(upload.abandon)
        done = True
        if isinstance(exc, OSError):
            raise _not_written() from exc
        if isinstance(exc, ClientDisconnect):
            return Response(status_code=400)  # for the log: the client is gone
        raise
    finally:
        if not done:  # cancelled (the server stopping): no await is possible here
            upload.abandon()
    return Response(status_code=201)


routes = [
    Route(PREFIX + "{digest}", blob_exists, methods=["HEAD"]),
    Route(PREFIX + "{digest}", upload_blob, methods=["POST"]),
]
