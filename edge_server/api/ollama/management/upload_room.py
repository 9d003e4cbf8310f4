"""Disk room for the blob uploads in flight, and what uploads leave behind.

Each upload reserves room before it writes (its declared size at once, else 64 MiB at a
time as it arrives): a reservation is granted while the free disk, less what the other
uploads reserved and have not written yet, keeps the margin free. Uploads checking the
free disk each on its own would all see the same free bytes and fill the disk together.
The count is the process's: replicas sharing a disk each keep the margin for their own.

An upload's temporary file (`.upload-<random>` in `blobs/`) is locked (flock) while it
is written; one that nobody holds is left over from a process that stopped mid-upload
and is removed when the server starts.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

UPLOAD_PREFIX = ".upload-"
RESERVE_STEP = 64 * 2**20
STALE_AFTER_S = 60.0  # a file this old and unlocked is no upload in flight


class NoRoom(Exception):
    """The disk cannot take what the upload needs next, with the others in flight."""


class UploadRoom:
    """What the uploads of this process reserved and have not written yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outstanding = 0

    def reserve(self, directory: Path, size: int, keep_free: int) -> None:
        with self._lock:
            free = shutil.disk_usage(directory).free
            if free - self._outstanding - size < keep_free:
                raise NoRoom
            self._outstanding += size

    def settle(self, size: int) -> None:
        """`size` reserved bytes were written (the free disk counts them now) or are
        not needed any more."""
        with self._lock:
            self._outstanding = max(0, self._outstanding - size)

    @property
    def outstanding(self) -> int:
        return self._outstanding


ROOM = UploadRoom()


class Reservation:
    """One upload's share of ROOM."""

    def __init__(self, directory: Path, keep_free: int, room: UploadRoom = ROOM) -> None:
        self.directory = directory
        self.keep_free = keep_free
        self.room = room
        self.left = 0  # reserved, not written yet
        self.closed = False

    def ahead(self, size: int) -> None:
        """Reserves `size` bytes now (a declared Content-Length)."""
        if self.closed:  # a write still running after its upload was abandoned
            raise NoRoom
        self.room.reserve(self.directory, size, self.keep_free)
        self.left += size

    def take(self, size: int) -> None:
        """Before `size` bytes are written: reserved already, or reserved now."""
        if size > self.left:
            self.ahead(max(size - self.left, RESERVE_STEP))
        self.left -= size
        self.room.settle(size)

    def close(self) -> None:
        self.closed = True
        self.room.settle(self.left)
        self.left = 0


def open_locked(path: Path) -> BinaryIO:
    """A new upload file, locked for as long as it is open."""
    file = open(path, "xb")  # noqa: SIM115 (the caller closes it)
    fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return file


def remove_stale(blobs: Path) -> int:
    """Removes upload files no process is writing (blocking: at start); how many."""
    removed = 0
    try:
        candidates = list(blobs.glob(UPLOAD_PREFIX + "*"))
    except OSError:
        return 0
    for path in candidates:
        try:
            if time.time() - path.stat().st_mtime < STALE_AFTER_S:
                continue  # maybe one being created right now
            with open(path, "rb") as file:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: in flight
                path.unlink()
            removed += 1
        except OSError:  # BlockingIOError among them: another process is writing it
            continue
    if removed:
        log.info("removed %d unfinished upload(s) from the models directory", removed)
    return removed
