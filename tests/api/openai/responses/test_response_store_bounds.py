"""The Responses store on its own (a real SQLite file, no server): bounded by age, count
and bytes, least recently used first; rows are a tenant's own; it survives reopening;
a broken file is a clear startup error. Chains, caps per key, old files and corrupt rows:
test_response_store_chains.py."""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import DEFAULT_MODEL, ROOT, start_server, stop_server

from edge_server.api.openai.responses.store import (
    Continuation,
    ResponseRecord,
    ResponseStore,
    StoredResponse,
    StoreError,
)


def record(response_id: str, tenant: str = "", text: str = "hi",
           tokens: list[int] | None = None,
           previous: StoredResponse | None = None) -> ResponseRecord:
    turn = {"id": response_id, "input": [{"type": "message", "role": "user",
                                          "content": [{"type": "input_text", "text": text}]}],
            "output": []}
    continuation = Continuation("fp", "key", tokens) if tokens is not None else None
    return ResponseRecord(response_id, tenant, {"id": response_id, "output": []}, turn,
                          previous, continuation)


def response(store: ResponseStore, tenant: str, response_id: str) -> Any:
    found = run(store.response_json(tenant, response_id))
    return None if found is None else json.loads(found)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def open_store(path: Path, **caps: Any) -> ResponseStore:
    bounds = {"max_count": 100, "max_bytes": 2**20, "max_age_s": 3600.0, **caps}
    return ResponseStore(path / "responses.sqlite3", **bounds)


def test_round_trip_survives_reopening_and_file_is_private(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    assert run(store.put(record("resp_a", tokens=[1, 2, 3, 2**31 - 1])))
    store.close()
    again = open_store(tmp_path)
    found = run(again.conversation("", "resp_a"))
    assert found is not None and found.continuation is not None
    assert found.continuation.tokens == [1, 2, 3, 2**31 - 1]
    assert found.turns[0]["input"][0]["content"][0]["text"] == "hi"
    assert response(again, "", "resp_a") == {"id": "resp_a", "output": []}
    mode = stat.S_IMODE((tmp_path / "responses.sqlite3").stat().st_mode)
    assert mode == 0o600


def test_rows_belong_to_their_tenant(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    run(store.put(record("resp_a", tenant="t1")))
    assert response(store, "t2", "resp_a") is None
    assert run(store.conversation("t2", "resp_a")) is None
    assert run(store.delete("t2", "resp_a")) is False
    assert response(store, "t1", "resp_a") is not None
    assert run(store.delete("t1", "resp_a")) is True
    assert response(store, "t1", "resp_a") is None


def test_count_cap_evicts_least_recently_used(tmp_path: Path) -> None:
    store = open_store(tmp_path, max_count=2)
    run(store.put(record("resp_1")))
    time.sleep(0.01)
    run(store.put(record("resp_2")))
    time.sleep(0.01)
    assert response(store, "", "resp_1") is not None  # used: now newer than resp_2
    time.sleep(0.01)
    run(store.put(record("resp_3")))
    assert response(store, "", "resp_2") is None
    assert response(store, "", "resp_1") is not None
    assert response(store, "", "resp_3") is not None


def test_byte_cap_evicts_and_refuses_what_cannot_fit(tmp_path: Path) -> None:
    store = open_store(tmp_path, max_bytes=4000)
    assert run(store.put(record("resp_1", text="a" * 1500)))
    time.sleep(0.01)
    assert run(store.put(record("resp_2", text="b" * 1500)))
    time.sleep(0.01)
    assert run(store.put(record("resp_3", text="c" * 1500)))  # over 4000 bytes: one goes
    assert response(store, "", "resp_1") is None
    assert response(store, "", "resp_2") is not None
    assert not run(store.put(record("resp_big", text="d" * 5000)))  # larger than it all
    assert response(store, "", "resp_big") is None
    assert response(store, "", "resp_3") is not None


def test_unused_responses_expire(tmp_path: Path) -> None:
    store = open_store(tmp_path, max_age_s=0.5)
    run(store.put(record("resp_1")))
    assert response(store, "", "resp_1") is not None
    time.sleep(0.7)
    assert run(store.conversation("", "resp_1")) is None
    run(store.put(record("resp_2")))  # a write deletes the expired rows
    store.close()
    again = open_store(tmp_path)  # no age cap now: the row is gone, not just hidden
    assert response(again, "", "resp_1") is None


def test_broken_file_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "responses.sqlite3").write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError):
        open_store(tmp_path)


def test_serve_with_a_broken_store_exits_with_a_message(tmp_path: Path) -> None:
    """Before any model loads: exit status 2 and one line, no traceback."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "responses.sqlite3").write_bytes(b"not a database" * 100)
    done = subprocess.run(
        [sys.executable, "-m", "edge_server", "serve", "--state-dir", str(state)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"XDG_DATA_HOME": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert "response store" in done.stderr and "Traceback" not in done.stderr


def test_serve_without_a_writable_store_place_starts_stateless(tmp_path: Path) -> None:
    """No --state-dir, and the models directory has no room for the store (read-only
    there, or as here, the file's name taken by a directory: refused to root too):
    the server starts without stored Responses and says so in its log."""
    models = tmp_path / "data" / "edge-server" / "models"
    (models / "responses.sqlite3").mkdir(parents=True)
    server = start_server(tmp_path, "--ctx-size", "512", name="stateless")
    try:
        r = httpx.post(f"{server.v1}/responses", timeout=120, json={
            "model": DEFAULT_MODEL, "input": "Say hi.", "max_output_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["store"] is False
        chained = httpx.post(f"{server.v1}/responses", timeout=120, json={
            "model": DEFAULT_MODEL, "input": "More.", "previous_response_id": r.json()["id"]})
        assert chained.status_code == 400
        assert chained.json()["error"]["param"] == "previous_response_id"
    finally:
        stop_server(server)
    log = server.log_text()
    assert "serving without stored Responses" in log and "Traceback" not in log


_OPEN_TOGETHER = """
import sys, time
from pathlib import Path
from edge_server.api.openai.responses.store import ResponseStore
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
ResponseStore(Path(sys.argv[1]), max_count=10, max_bytes=1 << 20, max_age_s=60.0)
print("opened")
"""


def test_replicas_sharing_the_file_open_it_together(tmp_path: Path) -> None:
    """Replicas on one box share the models directory, so they open one new store file at
    the same moment: each must open it (switching to WAL and creating the schema can be
    answered "locked" at once, with no busy wait)."""
    path = tmp_path / "shared" / "responses.sqlite3"
    start = time.time() + 1.5  # every process imported and waiting by then
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN_TOGETHER, str(path), str(start)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(8)]
    outcomes = [p.communicate(timeout=60) for p in procs]
    for proc, (out, err) in zip(procs, outcomes, strict=True):
        assert proc.returncode == 0 and "opened" in out, err[-600:]


def test_an_open_store_leaves_the_file_to_other_replicas(tmp_path: Path) -> None:
    """A store that is open and idle holds no write lock: another replica's store opens
    the same file and writes to it."""
    first = open_store(tmp_path)
    try:
        second = open_store(tmp_path)
        assert run(second.put(record("resp_other")))
        assert run(first.conversation("", "resp_other")) is not None
        second.close()
    finally:
        first.close()
