"""The file saved models live in (`ollama-models.json`), as a JSON document changed in
place by several processes: replicas of the server may share one models directory.

Every change is a read-modify-write under an exclusive lock (flock on a lock file beside
it), so that two processes adding names both keep theirs; the document is re-read under
the lock and only the change is applied to it, so entries another process wrote, or
that this version cannot read, stay as they are. The new text goes to a temporary file
of its own in the same directory (a unique name: processes never share one), flushed to
disk, then renamed over the old one: a reader sees the old file or the new, whole.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

VERSION = 1
LOCK_WAIT_S = 10.0  # another process holds the lock longer than a write takes: give up
_Result = TypeVar("_Result")


class Unreadable(ValueError):
    """The file is not one this version can change without losing what it holds."""


class Busy(OSError):
    """Another process kept the lock for longer than LOCK_WAIT_S."""


def read(path: Path) -> dict[str, Any]:
    """The document (`{"version": 1, "models": [...]}`, fresh when there is no file);
    whatever else it holds is kept. Blocking; no lock needed: files are replaced whole."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"version": VERSION, "models": []}
    except (OSError, UnicodeDecodeError) as exc:
        raise Unreadable(f"it cannot be read: {type(exc).__name__}") from exc
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise Unreadable(f"it is not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("models"), list):
        raise Unreadable("it is not an object with a `models` list")
    if document.get("version") != VERSION:
        raise Unreadable(f"its version is {str(document.get('version'))[:20]}, this "
                         f"server reads version {VERSION}")
    return document


def update(path: Path, change: Callable[[dict[str, Any]], _Result],
           written: Callable[[_Result], None] | None = None) -> _Result:
    """Applies `change` to the document as it is on disk now, under the lock, and writes
    the result (nothing when `change` raises); then `written`, still under the lock, with
    what `change` returned. Blocking: run it on an I/O thread."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_name(path.name + ".lock")):
        document = read(path)
        result = change(document)
        _write(path, document)
        if written is not None:
            written(result)
    return result


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    # flock locks an open file description: threads of one process exclude each other
    # as other processes do, each through its own open().
    with open(lock_path, "a") as lock:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Busy(errno.EWOULDBLOCK, "the saved models file stays locked") \
                        from None
                time.sleep(0.01)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(path: Path, document: dict[str, Any]) -> None:
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(document, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(OSError):  # mkstemp's 0600: the old file's mode instead
            os.chmod(temporary, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(temporary, path)  # whole or not at all, even on a crash
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename itself on disk
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
