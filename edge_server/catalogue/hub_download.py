"""One file of a Hugging Face Hub repo downloaded into the models directory: the path both
`edge-server pull` and Ollama's /api/pull take.

Bounded at every step: the file lands under the models directory (a repo id or file name
that would lead elsewhere is refused); the disk must hold the rest of the file plus a
reserve before the download starts and again every 64 MiB of it; a download can be
cancelled between chunks; its progress is a byte counter, read without touching the disk.
A partial download stays beside its target as `<file>.incomplete` and the next pull
resumes it (a Range request); the finished file takes its name only once its SHA-256
matches (the registry's, else the Hub's own checksum).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any, TextIO

import httpx

log = logging.getLogger(__name__)

DISK_CHECK_BYTES = 64 * 2**20  # free disk is checked again after each this many bytes
_CHUNK_BYTES = 1 << 20
_RETRIES = 5  # a dropped connection is resumed this many times without progress
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MIB = 2**20


class PullError(RuntimeError):
    pass


class InsufficientStorage(PullError):
    """The models directory's disk cannot hold the file (HTTP 507)."""


class PullCancelled(PullError):
    pass


def sha256_of(path: Path, cancelled: threading.Event | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK_BYTES), b""):
            if cancelled is not None and cancelled.is_set():
                raise PullCancelled("the pull was cancelled")
            digest.update(block)
    return digest.hexdigest()


def target_path(models_dir: Path, repo: str, file: str) -> Path:
    """Where a hub file lands, `models_dir/repo/file`; a repo id or file name that would
    put it anywhere else (`..`, an absolute name, a link out) is refused."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise PullError(f"`{repo[:200]}` is not a Hugging Face repo id") from exc
    parts = file.split("/")
    if "\\" in file or "\0" in file or any(p in ("", ".", "..") for p in parts):
        raise PullError(f"`{file[:200]}` is not a file name of a repo")
    root = models_dir.resolve()
    if not (root / repo / file).resolve().is_relative_to(root):
        raise PullError(f"`{repo}/{file[:200]}` would be stored outside the models directory")
    return models_dir / repo / file


def _free_bytes(path: Path) -> int:
    """Free disk where `path` is (or would be created)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


class HubDownload:
    """One file: `prepare()` asks the hub for its size and checksum and checks the disk;
    `fetch()` downloads what is missing and verifies it (both blocking); `cancel()` from
    any thread stops `fetch()` at its next chunk. `done` and `total` are its progress."""

    def __init__(self, models_dir: Path, repo: str, file: str, *, revision: str = "main",
                 sha256: str | None = None, min_free_bytes: int = 0) -> None:
        self.repo, self.file, self.revision = repo, file, revision
        self.target = target_path(models_dir, repo, file)
        self.partial = self.target.with_name(self.target.name + ".incomplete")
        self.min_free_bytes = min_free_bytes
        self.expected = sha256.lower() if sha256 else None
        self.digest = self.expected or ""  # what the file is checked against ("" unknown)
        self.total = 0  # bytes of the whole file, once prepared
        self.done = 0  # bytes of it on disk
        self._present = False  # the target is there already: verified, not downloaded
        self._cancelled = threading.Event()

    @property
    def name(self) -> str:
        return f"{self.repo}/{self.file}"

    def cancel(self) -> None:
        self._cancelled.set()

    def run(self) -> Path:
        self.prepare()
        return self.fetch()

    def prepare(self) -> None:
        from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

        if constants.HF_HUB_OFFLINE:
            if not self.target.is_file():
                raise PullError(f"{self.name} is not downloaded and the hub cannot be "
                                "reached (offline)")
            self._present = True
            self.total = self.done = self.target.stat().st_size
            return
        try:
            meta = get_hf_file_metadata(hf_hub_url(self.repo, self.file,
                                                   revision=self.revision))
        except Exception as exc:  # huggingface-hub's HTTP errors, no network, a 404
            raise PullError(f"could not reach {self.name} on the hub "
                            f"({type(exc).__name__})") from exc
        self.total = int(meta.size or 0)
        etag = (meta.etag or "").strip('"').lower()
        self.digest = self.expected or (etag if _SHA256.match(etag) else "")
        if self.target.is_file() and self.target.stat().st_size == self.total:
            self._present = True
            self.done = self.total
            return
        self.done = self.partial.stat().st_size if self.partial.is_file() else 0
        if self.total and self.done > self.total:  # not this file's beginning
            self.partial.unlink()
            self.done = 0
        self._check_disk()

    def _check_disk(self) -> None:
        needed = max(self.total - self.done, 0)
        free = _free_bytes(self.target.parent)
        if free - needed < self.min_free_bytes:
            raise InsufficientStorage(
                f"not enough free disk for {self.name}: {needed // _MIB} MiB more needed, "
                f"{free // _MIB} MiB free, {self.min_free_bytes // _MIB} MiB kept free "
                "(--min-free-disk-mb)")

    def fetch(self) -> Path:
        if not self._present:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self._download()
            self._verify(self.partial)
            os.replace(self.partial, self.target)
        elif self.digest:
            self._verify(self.target)
        return self.target

    def _verify(self, path: Path) -> None:
        size = path.stat().st_size
        if self.total and size != self.total:
            path.unlink(missing_ok=True)
            raise PullError(f"{self.name}: the download ended at {size} of {self.total} "
                            "bytes; it was deleted")
        if not self.digest:
            log.warning("no checksum known for %s; not verified", self.name)
            return
        actual = sha256_of(path, self._cancelled)
        if actual != self.digest:
            path.unlink(missing_ok=True)
            raise PullError(f"checksum mismatch for {self.name}: expected {self.digest}, "
                            f"got {actual}; the download was deleted")

    def _download(self) -> None:
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(self.repo, self.file, revision=self.revision)
        headers = build_hf_headers()
        tries = 0
        timeout = httpx.Timeout(60.0, connect=15.0)
        with httpx.Client(follow_redirects=True, timeout=timeout) as client:
            while not (self.total and self.done >= self.total):
                before = self.done
                try:
                    self._get(client, url, headers)
                    return
                except httpx.TransportError as exc:  # dropped: resume from where it stopped
                    tries = 0 if self.done > before else tries + 1
                    if tries >= _RETRIES:
                        raise PullError(f"could not download {self.name} "
                                        f"({type(exc).__name__})") from exc
                    log.warning("download of %s interrupted at %d bytes (%s); resuming",
                                self.name, self.done, type(exc).__name__)

    def _get(self, client: httpx.Client, url: str, headers: dict[str, str]) -> None:
        ranged = {**headers, "Range": f"bytes={self.done}-"} if self.done else headers
        with client.stream("GET", url, headers=ranged) as response:
            if response.status_code >= 400:
                raise PullError(f"could not download {self.name} (HTTP "
                                f"{response.status_code})")
            if response.status_code != 206:  # the whole file, from its first byte
                self.done = 0
            with open(self.partial, "ab" if self.done else "wb") as out:
                next_check = self.done + DISK_CHECK_BYTES
                for chunk in response.iter_bytes(_CHUNK_BYTES):
                    if self._cancelled.is_set():
                        raise PullCancelled(f"the pull of {self.name} was cancelled; the "
                                            "next pull resumes it")
                    out.write(chunk)
                    self.done += len(chunk)
                    if self.done >= next_check:
                        out.flush()
                        self._check_disk()
                        next_check = self.done + DISK_CHECK_BYTES


def run_showing_progress(download: HubDownload, out: TextIO) -> Path:
    """Runs a download with its progress written to `out` (a terminal's), as
    `edge-server pull` does; Ctrl-C stops it, and the next pull resumes it."""
    download.prepare()
    outcome: dict[str, Any] = {}

    def fetch() -> None:
        try:
            outcome["path"] = download.fetch()
        except Exception as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=fetch, name="pull", daemon=True)
    worker.start()
    shown = out.isatty()
    try:
        while worker.is_alive():
            worker.join(0.5)
            if download.total and shown:
                print(f"\r{download.name}: {download.done // _MIB} of "
                      f"{download.total // _MIB} MiB", end="", file=out, flush=True)
    except KeyboardInterrupt:
        download.cancel()
        worker.join()
        raise PullError("interrupted; the next pull resumes the download") from None
    if shown:
        print(file=out)
    if "error" in outcome:
        raise outcome["error"]
    return Path(outcome["path"])
