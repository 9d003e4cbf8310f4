"""HEAD and POST /api/blobs/sha256:<digest>: a GGUF file a client uploads before
/api/create names it (as `ollama create` and the client libraries do for a local file).

The body streams to a temporary file in the models directory while it is hashed, never
held in memory; it must start with GGUF's magic and fit the free disk (less a margin);
it is kept under its digest only when the SHA-256 of what arrived is that digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ...model_store import ModelStore
from ..http.auth import require_admin
from ..http.dependencies import off_loop
from ..http.errors import APIError, invalid
from .saved_models import BLOB_PREFIX, blob_path

PREFIX = "/api/blobs/"
GGUF_MAGIC = b"GGUF"
DISK_MARGIN = 512 * 2**20  # left free for the server's own files (prompt cache, logs)
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


def _room(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(directory).free - DISK_MARGIN


class _Upload:
    """One upload on its way to disk: written, hashed and counted as it arrives."""

    def __init__(self, path: Path, room: int) -> None:
        self.path = path
        self.room = room
        self.size = 0
        self.hash = hashlib.sha256()
        self.head = b""
        self.file: BinaryIO = open(path, "wb")  # noqa: SIM115 (closed by finish/abandon)

    def write(self, chunk: bytes) -> None:
        if len(self.head) < len(GGUF_MAGIC):
            self.head += chunk[:len(GGUF_MAGIC)]
            if not GGUF_MAGIC.startswith(self.head[:len(GGUF_MAGIC)]):
                raise invalid(None, "the file is not a GGUF model (it does not start with "
                              "GGUF's magic)")
        self.size += len(chunk)
        if self.size > self.room:
            raise APIError(413, "the file is larger than the free disk space of the models "
                           "directory allows", code="request_too_large")
        self.hash.update(chunk)
        self.file.write(chunk)

    def abandon(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


async def upload_blob(request: Request) -> Response:
    require_admin(request)
    digest = digest_of(request.path_params["digest"])
    target = blob_path(_store(request), digest)
    if await off_loop(target.is_file):
        return Response(status_code=200)  # already here, as Ollama answers
    room = await off_loop(_room, target.parent)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > room:
        raise APIError(413, "the file is larger than the free disk space of the models "
                       "directory allows", code="request_too_large")
    upload = await off_loop(_Upload, target.with_name(f".upload-{uuid.uuid4().hex}"), room)
    try:
        async for chunk in request.stream():
            if chunk:
                await off_loop(upload.write, chunk)
        if len(upload.head) < len(GGUF_MAGIC):
            raise invalid(None, "the file is not a GGUF model (it is too short)")
        actual = BLOB_PREFIX + upload.hash.hexdigest()
        if actual != digest:
            raise invalid("digest", f"digest mismatch: the file's is {actual}")
        upload.file.close()
        await off_loop(upload.path.replace, target)
    except (APIError, ClientDisconnect, OSError) as exc:
        await off_loop(upload.abandon)
        if isinstance(exc, OSError):
            raise APIError(507, "the file could not be written to the models directory",
                           code="insufficient_storage") from exc
        raise
    finally:
        with contextlib.suppress(OSError):
            upload.file.close()
    return Response(status_code=201)


routes = [
    Route(PREFIX + "{digest}", blob_exists, methods=["HEAD"]),
    Route(PREFIX + "{digest}", upload_blob, methods=["POST"]),
]
