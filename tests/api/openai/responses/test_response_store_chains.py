"""The Responses store's chains and caps on a real SQLite file (no server): a chained
record holds only its own turn (its row does not grow with the chain), a chain keeps its
whole conversation when earlier responses go (deleted, evicted, expired), each key's caps
evict that key's rows only, a version 1 file is read as it was, and a corrupt row is a
StoreError (the routes' 503), never a ValueError."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from test_response_store_bounds import open_store, record, response, run

from edge_server.api.openai.responses.store import ResponseStore, StoredResponse, StoreError


def chain(store: ResponseStore, n: int, tenant: str = "", text: str = "turn",
          tokens_each: int = 3) -> list[str]:
    """n chained responses, each continuing the last one's tokens; their ids."""
    ids: list[str] = []
    previous: StoredResponse | None = None
    tokens: list[int] = []
    for i in range(n):
        tokens = [*tokens, *range(i * 10, i * 10 + tokens_each)]
        response_id = f"resp_{tenant}{i}"
        assert run(store.put(record(response_id, tenant, f"{text} {i}", tokens, previous)))
        previous = run(store.conversation(tenant, response_id))
        assert previous is not None
        ids.append(response_id)
    return ids


def sizes(path: Path) -> dict[str, int]:
    with sqlite3.connect(path / "responses.sqlite3") as db:
        return dict(db.execute("SELECT id, size FROM responses").fetchall())


def test_a_chained_record_holds_only_its_own_turn(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    ids = chain(store, 30, text="x" * 1000)
    row_sizes = sizes(tmp_path)
    # Each row: its own turn (about 1 KB) and its own 3 tokens, whatever its depth.
    assert max(row_sizes.values()) < 2 * min(row_sizes.values()) < 4000, row_sizes
    found = run(store.conversation("", ids[-1]))
    assert found is not None and [t["id"] for t in found.turns] == ids
    assert found.turns[7]["input"][0]["content"][0]["text"] == "x" * 1000 + " 7"
    assert found.continuation is not None
    assert found.continuation.tokens == [t for i in range(30) for t in range(i * 10,
                                                                             i * 10 + 3)]
    # What the chain bound counts: the stored turns, all of them.
    assert 30 * 1000 < found.chain_bytes < 30 * 1200


def test_deleting_an_earlier_response_keeps_the_later_ones_whole(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    ids = chain(store, 4)
    before = run(store.conversation("", ids[3]))
    for gone in (ids[1], ids[0]):
        assert run(store.delete("", gone))
        assert response(store, "", gone) is None
        assert run(store.conversation("", gone)) is None
    after = run(store.conversation("", ids[3]))
    assert after is not None and before is not None
    assert after.turns == before.turns and after.continuation == before.continuation
    middle = run(store.conversation("", ids[2]))
    assert middle is not None and [t["id"] for t in middle.turns] == ids[:3]
    assert len(sizes(tmp_path)) == 2


def test_a_keys_caps_evict_its_own_rows_only(tmp_path: Path) -> None:
    store = open_store(tmp_path, max_count=5, max_bytes=20_000)
    other = chain(store, 3, tenant="b")
    ids = chain(store, 30, tenant="a", text="y" * 300)
    # Key a keeps its 5 newest; key b's responses are untouched.
    assert [i for i in ids if response(store, "a", i) is not None] == ids[-5:]
    assert all(response(store, "b", i) is not None for i in other)
    # The newest still holds the whole chain: evicted rows were folded into it first.
    found = run(store.conversation("a", ids[-1]))
    assert found is not None and [t["id"] for t in found.turns] == ids
    assert found.continuation is not None and len(found.continuation.tokens) == 90
    # Bytes too: a key over its bytes loses its own oldest; the other key keeps all.
    big = [f"resp_big{i}" for i in range(6)]
    for response_id in big:
        assert run(store.put(record(response_id, "a", "z" * 6000)))
    assert response(store, "a", big[-1]) is not None
    assert response(store, "a", big[0]) is None
    assert sum(size for i, size in sizes(tmp_path).items() if not i.startswith("resp_b")) \
        <= 20_000
    assert all(response(store, "b", i) is not None for i in other)


def test_a_chain_outlives_its_expired_start(tmp_path: Path) -> None:
    store = open_store(tmp_path, max_age_s=1.0)
    ids = chain(store, 3)
    time.sleep(0.6)
    assert run(store.conversation("", ids[2])) is not None  # used: the others are not
    time.sleep(0.6)
    assert run(store.put(record("resp_other")))  # a write expires what is unused
    assert response(store, "", ids[0]) is None and response(store, "", ids[1]) is None
    found = run(store.conversation("", ids[2]))
    assert found is not None and [t["id"] for t in found.turns] == ids
    assert found.continuation is not None and len(found.continuation.tokens) == 9


def test_a_parent_gone_before_the_child_is_stored(tmp_path: Path) -> None:
    """The response a turn continues is deleted while the turn runs: the new one is
    stored with the whole conversation itself."""
    store = open_store(tmp_path)
    ids = chain(store, 2)
    previous = run(store.conversation("", ids[1]))
    assert run(store.delete("", ids[1]))
    assert run(store.put(record("resp_late", tokens=[1, 2, 3, 4, 5, 6, 7], previous=previous)))
    found = run(store.conversation("", "resp_late"))
    assert found is not None and [t["id"] for t in found.turns] == [*ids, "resp_late"]
    assert found.continuation is not None and found.continuation.tokens == [1, 2, 3, 4, 5, 6, 7]


_VERSION_1 = """
CREATE TABLE responses (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at REAL NOT NULL,
    last_used REAL NOT NULL, size INTEGER NOT NULL, response TEXT NOT NULL,
    turns TEXT NOT NULL, fingerprint TEXT, prompt_key TEXT, tokens BLOB);
CREATE INDEX responses_by_last_use ON responses (last_used);
PRAGMA user_version=1;
"""


def test_a_version_1_file_is_read_and_continued(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    turns = '[{"id":"resp_old","input":[],"output":[]}]'
    with sqlite3.connect(path) as db:
        db.executescript(_VERSION_1)
        db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   ("resp_old", "", time.time(), time.time(), 99, '{"id":"resp_old"}',
                    turns, "fp", "key", bytes(8)))
    store = open_store(tmp_path)
    old = run(store.conversation("", "resp_old"))
    assert old is not None and old.turns[0]["id"] == "resp_old"
    assert old.continuation is not None and old.continuation.tokens == [0, 0]
    assert old.chain_bytes == len(turns)
    assert response(store, "", "resp_old") == {"id": "resp_old"}
    assert run(store.put(record("resp_new", tokens=[0, 0, 5], previous=old)))
    found = run(store.conversation("", "resp_new"))
    assert found is not None and [t["id"] for t in found.turns] == ["resp_old", "resp_new"]
    assert found.continuation is not None and found.continuation.tokens == [0, 0, 5]


@pytest.mark.parametrize(("column", "value"), [
    ("turns", "{not json"), ("turns", '{"a": 1}'), ("tokens", b"\x01\x02\x03"),
    ("parent", "resp_nowhere")])
def test_a_corrupt_row_is_a_store_error(tmp_path: Path, column: str, value: object) -> None:
    store = open_store(tmp_path)
    chain(store, 1)
    with sqlite3.connect(tmp_path / "responses.sqlite3") as db:
        db.execute(f"UPDATE responses SET {column} = ?", (value,))
    with pytest.raises(StoreError):
        run(store.conversation("", "resp_0"))
    if column == "turns":
        # It cannot be folded into what continues it: both go, and the store goes on.
        assert run(store.put(record("resp_1", previous=StoredResponse("resp_0", "", []))))
        assert run(store.put(record("resp_other")))
        assert run(store.delete("", "resp_0"))
        assert run(store.conversation("", "resp_1")) is None
        assert response(store, "", "resp_other") is not None
