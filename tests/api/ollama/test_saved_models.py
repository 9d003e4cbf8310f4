"""Saved Ollama models (`ollama-models.json`) survive what the server does not expect: an
entry with a key it does not know (kept as it is, reported, not served, never erased),
a file it cannot read (nothing saved over it), and replicas sharing the models directory
adding names at once (each keeps the others'). Two real servers on one models directory,
through the official `ollama` client and plain HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

FILE = "ollama-models.json"
KNOWN = [
    {"name": "saved-a", "source": DEFAULT_MODEL, "profile": None},
    {"name": "saved-b", "source": DEFAULT_MODEL,
     "profile": {"system": "You are B.", "template": None, "parameters": {"num_predict": 2}}},
    {"name": "team/saved-c:v1", "source": DEFAULT_MODEL, "profile": None},
]
# As a newer server might write it: a key this one does not know, in the profile and
# beside it.
FUTURE = {"name": "future", "source": DEFAULT_MODEL, "created_at": "2030-01-01T00:00:00Z",
          "profile": {"system": None, "template": None, "parameters": {},
                      "messages": [{"role": "user", "content": "hi"}]}}
PER_REPLICA = 8  # names each replica copies at once


@dataclass
class Replicas:
    tmp: Path
    models: Path
    servers: list[RunningServer]

    def start(self, i: int) -> RunningServer:
        return start_server(self.tmp, "--ctx-size", "512", "--parallel", "1",
                            "--threads", "1", name=f"saved-{i}",
                            env={"EDGE_SERVER_MODELS_DIR": str(self.models)})

    def saved(self) -> list[Any]:
        entries: list[Any] = json.loads((self.models / FILE).read_text())["models"]
        return entries


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("saved-models")
    models = tmp / "models"
    models.mkdir()
    (models / FILE).write_text(json.dumps({"version": 1, "models": [*KNOWN, FUTURE]}))
    cluster = Replicas(tmp, models, [])
    cluster.servers = [cluster.start(0), cluster.start(1)]
    yield cluster
    for server in cluster.servers:
        stop_server(server)
        assert "Traceback" not in server.log_text(), server.log_text()


def _client(server: RunningServer) -> ollama.Client:
    return ollama.Client(host=server.base_url, timeout=120)


def _listed(server: RunningServer) -> set[str]:
    return {m.model or "" for m in _client(server).list().models}


def test_an_entry_with_an_unknown_key_is_kept_and_the_others_served(replicas: Replicas
                                                                    ) -> None:
    server = replicas.servers[0]
    listed = _listed(server)
    assert {"saved-a:latest", "saved-b:latest", "team/saved-c:v1"} <= listed
    assert "future:latest" not in listed  # not served without what it says...
    log = server.log_text()
    assert "future" in log and "created_at" in log and "profile.messages" in log  # ...reported
    oc = _client(server)
    assert "You are B." in (oc.show("saved-b").modelfile or "")
    assert oc.generate(model="saved-b", prompt="Hi").eval_count == 2
    # Its name stays taken; a copy saves a new name and erases nothing.
    with pytest.raises(ollama.ResponseError) as taken:
        oc.copy(DEFAULT_MODEL, "future")
    assert taken.value.status_code == 409
    with pytest.raises(ollama.ResponseError) as made:
        oc.create(model="future", from_=DEFAULT_MODEL)
    assert made.value.status_code == 409
    oc.copy("saved-b", "saved-d")
    entries = replicas.saved()
    assert entries[:4] == [*KNOWN, FUTURE]  # as they were, the unknown keys included
    assert entries[4]["name"] == "saved-d"
    assert oc.generate(model="saved-d", prompt="Hi").eval_count == 2  # saved-b's profile


def test_replicas_adding_names_at_once_keep_every_name(replicas: Replicas) -> None:
    errors: list[str] = []
    barrier = threading.Barrier(2 * PER_REPLICA)

    def copy(server: RunningServer, name: str) -> None:
        barrier.wait()
        r = httpx.post(f"{server.base_url}/api/copy", timeout=60,
                       json={"source": DEFAULT_MODEL, "destination": name})
        if r.status_code != 200:
            errors.append(f"{name}: {r.status_code} {r.text}")

    wanted = {f"replica{i}-{n}" for i in range(2) for n in range(PER_REPLICA)}
    threads = [threading.Thread(target=copy, args=(replicas.servers[int(name[7])], name))
               for name in sorted(wanted)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    names = [e["name"] for e in replicas.saved()]
    assert wanted <= set(names) and len(names) == len(set(names))
    assert FUTURE in replicas.saved()
    assert not list(replicas.models.glob(f".{FILE}.*.tmp"))  # no temporary file left
    # Each serves its own at once; a restart serves all of them, the other's too.
    assert {f"replica1-{n}:latest" for n in range(PER_REPLICA)} <= _listed(replicas.servers[1])
    stop_server(replicas.servers[0])
    replicas.servers[0] = replicas.start(0)
    listed = _listed(replicas.servers[0])
    assert {f"{name}:latest" for name in wanted} | {"saved-d:latest", "saved-a:latest"} <= listed


def test_deletes_change_only_their_own_entry(replicas: Replicas) -> None:
    first, second = replicas.servers
    # A copy of a made model keeps its profile, not a tie to it: saved-d stays.
    assert _client(second).delete("saved-b").status == "success"
    assert _client(first).delete("future").status == "success"  # only when asked, by name
    names = [e["name"] for e in replicas.saved()]
    assert names[:3] == ["saved-a", "team/saved-c:v1", "saved-d"]
    assert len(names) == 3 + 2 * PER_REPLICA
    assert _client(first).generate(model="saved-d", prompt="Hi").eval_count == 2


def test_a_file_it_cannot_read_is_never_written_over(replicas: Replicas) -> None:
    server = replicas.servers[0]
    path = replicas.models / FILE
    broken = path.read_text()[:-40]  # cut short, as a disk that filled up might leave it
    path.write_text(broken)
    r = httpx.post(f"{server.base_url}/api/copy",
                   json={"source": DEFAULT_MODEL, "destination": "lost"})
    assert r.status_code == 503 and FILE in r.json()["error"], r.text
    assert str(replicas.models) not in r.json()["error"]  # names the file, not its path
    r = httpx.request("DELETE", f"{server.base_url}/api/delete", json={"model": "saved-a"})
    assert r.status_code == 503
    assert path.read_text() == broken
    assert "saved-a:latest" in _listed(server)  # still served: the change was not made
