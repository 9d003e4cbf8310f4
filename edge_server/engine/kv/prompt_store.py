"""Prompt caches beyond the KV cache: prefixes spilled to host RAM, and to disk when the
model unloads or the server stops, so a known system prompt is not evaluated again.

At start only the saved files' headers (their tokens) are read: an entry's KV bytes come
into RAM when a request first restores it, within the store's budget. A restarted server
then holds in RAM what it uses, not everything it once saved.

An entry is a token list and llama.cpp's serialised KV of exactly those tokens
(`llama_state_seq_get_data`). On a recurrent state (checkpoints.py) that state can only
be had whole, so an entry also keeps the stream's checkpoints: the recurrent part as it
was after earlier prompts, from which a prompt parting from the entry before its end
(a chat's next turn) starts. Entries are only ever looked up by tokens, so the chat
template is part of the key through the tokens it rendered; the model, the llama.cpp
build and the KV layout are part of the directory's key. Files carry a checksum: a
corrupt, truncated or foreign file is skipped (and removed), never loaded into C.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edge_server.engine.kv.checkpoints import Checkpoint

log = logging.getLogger(__name__)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i

_MAGIC = b"EDGEKV1\n"
_FORMAT = 2  # 1 had no checkpoints
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1  # llama_token


@dataclass
class StoredPrefix:
    tokens: list[int]
    data: bytes | None  # the KV bytes; None: not read yet, only in the file at `path`
    partition: str = ""  # only requests of this partition may restore it
    last_used: float = field(default_factory=time.monotonic)
    on_disk: bool = False  # already written (loaded from, or saved to, the directory)
    path: Path | None = None  # its file, where it is on disk
    size: int = 0  # bytes of KV, known before they are read
    sha256: str = ""  # of the KV bytes, checked when they are read from the file
    # Checkpoints of a recurrent state, as (tokens, bytes) each: their bytes follow the
    # sequence state's in `data`, in this order (see `pack` and `unpack`).
    checkpoints: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.data is not None:
            self.size = len(self.data)

    @property
    def checkpoint_tokens(self) -> list[int]:
        return [tokens for tokens, _ in self.checkpoints]


def pack(tokens: list[int], state: bytes, checkpoints: list[Checkpoint],
         partition: str) -> StoredPrefix:
    """An entry of a sequence's state and the checkpoints within its tokens."""
    kept = [c for c in checkpoints if 0 < c.tokens < len(tokens)]
    return StoredPrefix(list(tokens), b"".join([state, *(c.data for c in kept)]), partition,
                        checkpoints=tuple((c.tokens, len(c.data)) for c in kept))


def unpack(entry: StoredPrefix, data: bytes) -> tuple[bytes, list[Checkpoint]]:
    """An entry's bytes (PromptStore.load) as its sequence state and its checkpoints."""
    end = len(data) - sum(size for _, size in entry.checkpoints)
    state, out = data[:end], []
    for tokens, size in entry.checkpoints:
        out.append(Checkpoint(tokens, data[end:end + size]))
        end += size
    return state, out


class PromptStore:
    """A bounded LRU of saved prefixes in host RAM, and the index of those saved on disk
    whose bytes were not read yet."""

    def __init__(self, max_bytes: int, *, recurrent: bool = False) -> None:
        self.max_bytes = max_bytes
        # Entries hold a recurrent state: had whole, or back to one of their checkpoints.
        self.recurrent = recurrent
        self._entries: list[StoredPrefix] = []

    @property
    def used_bytes(self) -> int:
        """Host RAM the entries' KV bytes take (entries still on disk only take none)."""
        return sum(e.size for e in self._entries if e.data is not None)

    @property
    def disk_only(self) -> int:
        """Entries known from their files, whose bytes are not in RAM."""
        return sum(1 for e in self._entries if e.data is None)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[StoredPrefix]:
        return list(self._entries)

    def put(self, entry: StoredPrefix) -> None:
        if entry.size > self.max_bytes:
            return
        # An entry that gives all an older one gives makes the older redundant.
        self._entries = [e for e in self._entries if not self._covers(entry, e)]
        self._entries.append(entry)
        self._shrink(keep=entry)

    def _covers(self, entry: StoredPrefix, other: StoredPrefix) -> bool:
        """Whether `entry` gives every prefix `other` gives: it extends other's tokens
        and, on a recurrent state, has a checkpoint where other ends, and other's."""
        n = len(other.tokens)
        if (other.partition != entry.partition or n > len(entry.tokens)
                or entry.tokens[:n] != other.tokens):
            return False
        if not self.recurrent:
            return True
        marks = set(entry.checkpoint_tokens) | {len(entry.tokens)}
        return n in marks and set(other.checkpoint_tokens) <= marks

    def _shrink(self, keep: StoredPrefix) -> None:
        """Evicts the least recently used bytes (not `keep`'s) until within the budget:
        an entry saved on disk only lets go of its bytes, it can read them again."""
        while self.used_bytes > self.max_bytes:
            victim = min((e for e in self._entries if e.data is not None and e is not keep),
                         key=lambda e: e.last_used, default=None)
            if victim is None:
                return
            if victim.on_disk and victim.path is not None:
                victim.data = None
            else:
                self._entries.remove(victim)

    def load(self, entry: StoredPrefix) -> bytes | None:
        """The entry's KV bytes, read from its file on first use (checksum checked); None,
        and the entry forgotten, when the file is gone or is not what its header said."""
        if entry.data is not None:
            return entry.data
        data = _read_data(entry) if entry.path is not None else None
        if data is None:
            log.info("prompt cache file for %d tokens is gone or corrupt", len(entry.tokens))
            if entry in self._entries:
                self._entries.remove(entry)
            return None
        entry.data = data
        entry.last_used = time.monotonic()
        self._shrink(keep=entry)
        return data

    def best(self, prompt: list[int], partition: str,
             usable: Callable[[StoredPrefix, int], int] | None = None
             ) -> tuple[StoredPrefix | None, int]:
        """The entry of `partition` giving the longest prefix of `prompt`, and that length:
        the prefix it shares, or `usable(entry, shared)` of it (what a state that cannot
        be cut anywhere gives)."""
        best: StoredPrefix | None = None
        length = 0
        for entry in self._entries:
            if entry.partition != partition:
                continue
            n = common_prefix(entry.tokens, prompt)
            if usable is not None:
                n = usable(entry, n)
            if n > length:
                best, length = entry, n
        return best, length


# --- on disk ---------------------------------------------------------------------------------


def _file_name(tokens: list[int], partition: str) -> str:
    packed = struct.pack(f"<{len(tokens)}i", *tokens) + partition.encode()
    digest = hashlib.sha256(packed).hexdigest()[:32]
    return f"{digest}.kv"


def save_entries(directory: Path, key: str, entries: list[StoredPrefix], max_bytes: int) -> int:
    """Writes entries (newest first, within max_bytes) to directory; returns how many."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("prompt cache not saved: %s", exc)
        return 0
    written, total = 0, 0
    keep: set[str] = set()
    for entry in sorted(entries, key=lambda e: e.last_used, reverse=True):
        total += entry.size
        if total > max_bytes:
            break
        name = _file_name(entry.tokens, entry.partition)
        if entry.on_disk and (directory / name).is_file():
            keep.add(name)
            continue
        if entry.data is None:  # its file went (another replica pruned it), unread
            continue
        keep.add(name)
        header = json.dumps({
            "format": _FORMAT, "key": key, "tokens": entry.tokens,
            "partition": entry.partition,
            "sha256": hashlib.sha256(entry.data).hexdigest(), "size": len(entry.data),
            "checkpoints": [list(c) for c in entry.checkpoints],
        }).encode()
        tmp = directory / f".{name}.{os.getpid()}.tmp"
        try:
            with tmp.open("wb") as fh:
                fh.write(_MAGIC + struct.pack("<I", len(header)) + header + entry.data)
            tmp.replace(directory / name)
            entry.on_disk = True
            written += 1
        except OSError as exc:
            log.warning("prompt cache entry not saved: %s", exc)
            tmp.unlink(missing_ok=True)
    for stale in directory.glob("*.kv"):  # bounded: what was not kept goes
        if stale.name not in keep:
            stale.unlink(missing_ok=True)
    return written


def load_entries(directory: Path, key: str, max_bytes: int,
                 max_tokens: int) -> list[StoredPrefix]:
    """Entries saved for this key, newest first within max_bytes, their headers read (the
    KV bytes stay on disk until PromptStore.load); anything unreadable or foreign is
    skipped and removed."""
    if not directory.is_dir():
        return []
    # Replicas sharing a models directory save and prune it too: any file may vanish
    # between listing it and reading it, which only means it is not loaded.
    dated = [(mtime, path) for path in directory.glob("*.kv")
             if (mtime := _mtime(path)) is not None]
    out: list[StoredPrefix] = []
    total = 0
    for mtime, path in sorted(dated, key=lambda item: item[0], reverse=True):
        entry = _read(path, key, max_tokens, mtime)
        if entry is None:
            log.info("ignoring prompt cache file %s", path.name)
            path.unlink(missing_ok=True)
            continue
        total += entry.size
        if total > max_bytes:
            break
        out.append(entry)
    return out


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


# A header holds the prefix's token ids as JSON: a few bytes each.
_MAX_HEADER_BYTES = 64 << 20


def _read(path: Path, key: str, max_tokens: int, mtime: float) -> StoredPrefix | None:
    """The entry a file's header describes, its KV bytes left in the file."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_MAGIC) + 4)
            if not head.startswith(_MAGIC) or len(head) < len(_MAGIC) + 4:
                return None
            (header_len,) = struct.unpack_from("<I", head, len(_MAGIC))
            if header_len > _MAX_HEADER_BYTES:
                return None
            header = json.loads(fh.read(header_len))
            data_size = path.stat().st_size - len(head) - header_len
        tokens = header["tokens"]
        partition = header.get("partition", "")
        digest = header.get("sha256")
        marks = header.get("checkpoints")
        valid = (
            header.get("format") == _FORMAT
            and isinstance(partition, str) and len(partition) <= 64
            and header.get("key") == key
            and header.get("size") == data_size and data_size > 0
            and isinstance(digest, str)
            and isinstance(tokens, list)
            and 0 < len(tokens) <= max_tokens
            # Image placeholders are negative (multimodal/projector.py): derived from
            # the projector file and the image's bytes, so they match only the same
            # image through the same projector, whose KV this entry holds.
            and all(type(t) is int and _INT32_MIN <= t <= _INT32_MAX for t in tokens)
            and _checkpoints_valid(marks, len(tokens), data_size)
        )
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    if not valid:
        return None
    return StoredPrefix(tokens, None, partition,
                        last_used=mtime - time.time() + time.monotonic(), on_disk=True,
                        path=path, size=data_size, sha256=digest,
                        checkpoints=tuple((t, n) for t, n in marks))


def _checkpoints_valid(marks: object, n_tokens: int, data_size: int) -> bool:
    """A header's checkpoints: (tokens, bytes) pairs within the prefix whose bytes leave
    some for the sequence state."""
    if not isinstance(marks, list) or len(marks) > 64:
        return False
    pairs = [m for m in marks if isinstance(m, list) and len(m) == 2
             and all(type(v) is int for v in m)]
    return (len(pairs) == len(marks)
            and all(0 < t < n_tokens and n > 0 for t, n in pairs)
            and sum(n for _, n in pairs) < data_size)


def _read_data(entry: StoredPrefix) -> bytes | None:
    """An entry's KV bytes from its file, if they are still those its header described."""
    assert entry.path is not None
    try:
        raw = entry.path.read_bytes()
    except OSError:
        return None
    data = raw[len(raw) - entry.size:] if entry.size <= len(raw) else b""
    if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
        entry.path.unlink(missing_ok=True)
        return None
    return data
