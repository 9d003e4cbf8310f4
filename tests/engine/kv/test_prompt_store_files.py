"""The prompt store's files on disk with checkpoints of a recurrent state: written and read
back byte for byte, and a header whose checkpoints do not fit its bytes is skipped and
removed, never handed to llama.cpp."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from edge_server.engine.kv.checkpoints import Checkpoint
from edge_server.engine.kv.prompt_store import (
    PromptStore,
    load_entries,
    pack,
    save_entries,
    unpack,
)

KEY = "model-key"
TOKENS = list(range(1, 301))
STATE = bytes(range(256)) * 40
CHECKPOINTS = [Checkpoint(120, b"\x01" * 500), Checkpoint(250, b"\x02" * 700)]


def saved(tmp_path: Path) -> Path:
    entry = pack(TOKENS, STATE, [*CHECKPOINTS, Checkpoint(300, b"\x03" * 9)], "tenant")
    assert save_entries(tmp_path, KEY, [entry], 1 << 20) == 1
    (path,) = tmp_path.glob("*.kv")
    return path


def test_checkpoints_come_back_from_disk_byte_for_byte(tmp_path: Path) -> None:
    saved(tmp_path)
    (entry,) = load_entries(tmp_path, KEY, 1 << 20, max_tokens=4096)
    # Only checkpoints inside the prefix are kept (one at its end is the state itself).
    assert entry.checkpoint_tokens == [120, 250] and entry.partition == "tenant"
    store = PromptStore(1 << 20, recurrent=True)
    store.put(entry)
    data = store.load(entry)
    assert data is not None
    state, checkpoints = unpack(entry, data)
    assert state == STATE and checkpoints == CHECKPOINTS


def test_a_recurrent_entry_replaces_only_one_it_covers() -> None:
    store = PromptStore(1 << 20, recurrent=True)
    shorter = pack(TOKENS[:200], STATE, [], "")
    store.put(shorter)
    store.put(pack(TOKENS, STATE, CHECKPOINTS, ""))  # no checkpoint at 200: both kept
    assert len(store) == 2
    store.put(pack(TOKENS, STATE, [Checkpoint(200, b"\x04" * 10)], ""))
    assert shorter not in store.entries()


def rewrite_header(path: Path, change: dict[str, object]) -> None:
    raw = path.read_bytes()
    magic_len = raw.index(b"\n") + 1
    (header_len,) = struct.unpack_from("<I", raw, magic_len)
    start = magic_len + 4
    header = {**json.loads(raw[start:start + header_len]), **change}
    encoded = json.dumps(header).encode()
    path.write_bytes(raw[:magic_len] + struct.pack("<I", len(encoded)) + encoded
                     + raw[start + header_len:])


def test_checkpoints_that_do_not_fit_the_file_are_refused(tmp_path: Path) -> None:
    changes: list[dict[str, object]] = [
        {"checkpoints": [[120, 10**9]]}, {"checkpoints": [[400, 5]]},
        {"checkpoints": [[120, "5"]]}, {"checkpoints": None}, {"format": 1}]
    for change in changes:
        path = saved(tmp_path)
        rewrite_header(path, change)
        assert load_entries(tmp_path, KEY, 1 << 20, max_tokens=4096) == [], change
        assert not path.exists()
