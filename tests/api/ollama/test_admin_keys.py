"""Two tiers of API keys over real HTTP: an ordinary key uses models but gets a 403 for
managing them (pull, copy, delete, keep_alive 0 or longer than the default), an admin key
(--admin-api-key) manages them; `GET /props?model=` and `GET /slots?model=` never load a
model for a caller that may not load one (any web page can make a browser send a GET);
an ordinary key sees only its own work's counts (/slots) and none of every key's
(/health's counters, /metrics); a copy to a hub name followed by a pull of that name
leaves every name on its weights; copied names are bounded; the default model's file is
not deleted."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

from edge_server.catalogue.default_model import default_model_path
from edge_server.catalogue.names import MAX_RUNTIME_NAMES
from edge_testkit.servers.local_hub import LocalHub

USER, ADMIN = "user-key", "admin-key"
HUB_REPO, HUB_FILE = "edge-test/other-GGUF", "other-Q4_1.gguf"
SECOND = "second-model"  # a registry model whose file is present: loadable at once


def _registry(tmp: Path) -> Path:
    registry = tmp / "registry.toml"
    registry.write_text(f'[[models]]\nid = "{SECOND}"\npath = "{default_model_path()}"\n')
    return registry


@pytest.fixture(scope="module")
def hub() -> Iterator[LocalHub]:
    with LocalHub({(HUB_REPO, HUB_FILE): default_model_path().read_bytes()}) as running:
        yield running


def _hub_env(hub: LocalHub, tmp: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp / "hf"),
            "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "EDGE_SERVER_MODELS_DIR": str(tmp / "models")}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, hub: LocalHub) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("admin-keys")
    server = start_server(tmp, "--registry", str(_registry(tmp)), "--api-key", USER,
                          "--admin-api-key", ADMIN, "--parallel", "2", "--ctx-size", "1024",
                          "--slots", name="admin-keys", env=_hub_env(hub, tmp))
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text(), server.log_text()


def _client(server: RunningServer, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.base_url, headers=headers, timeout=120)


def _loaded(server: RunningServer) -> set[str]:
    with _client(server, ADMIN) as admin:
        return {m["model"] for m in admin.get("/api/ps").json()["models"]}


def test_ordinary_key_uses_models_but_cannot_manage_them(keyed: RunningServer,
                                                          hub: LocalHub) -> None:
    asked = len(hub.requests)
    with _client(keyed, USER) as user:
        answer = user.post("/api/generate", json={"model": DEFAULT_MODEL, "prompt": "Hi",
                                                  "stream": False,
                                                  "options": {"num_predict": 2}})
        assert answer.status_code == 200, answer.text
        refused = [
            user.post("/api/pull", json={"model": f"hf.co/{HUB_REPO}:Q4_1"}),
            user.post("/api/copy", json={"source": DEFAULT_MODEL, "destination": "mine"}),
            user.request("DELETE", "/api/delete", json={"model": DEFAULT_MODEL}),
            user.post("/api/generate", json={"model": DEFAULT_MODEL, "keep_alive": 0}),
            user.post("/api/chat", json={"model": DEFAULT_MODEL, "messages": [],
                                         "keep_alive": 0}),
            user.post("/api/generate", json={"model": DEFAULT_MODEL, "prompt": "Hi",
                                             "keep_alive": 0, "options": {"num_predict": 1}}),
        ]
    for r in refused:
        assert r.status_code == 403, r.text
        assert set(r.json()) == {"error"} and "admin" in r.json()["error"]
    assert len(hub.requests) == asked  # the refused pull asked the hub nothing
    assert DEFAULT_MODEL + ":latest" in _loaded(keyed)  # nobody unloaded it
    with _client(keyed, None) as anonymous:
        assert anonymous.post("/api/pull", json={"model": "x"}).status_code == 401
    with _client(keyed, "wrong") as wrong:
        assert wrong.post("/api/copy", json={"source": DEFAULT_MODEL,
                                             "destination": "x"}).status_code == 401


def test_admin_key_manages_models(keyed: RunningServer) -> None:
    with _client(keyed, ADMIN) as admin:
        copied = admin.post("/api/copy", json={"source": DEFAULT_MODEL, "destination": "mine"})
        assert copied.status_code == 200, copied.text
        with _client(keyed, USER) as user:  # the copy serves every key
            used = user.post("/v1/chat/completions", json={
                "model": "mine", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2})
            assert used.status_code == 200, used.text
        deleted = admin.request("DELETE", "/api/delete", json={"model": "mine"})
        assert deleted.status_code == 200, deleted.text


@pytest.mark.parametrize("path", ["/props", "/slots"])
def test_a_get_never_loads_for_an_ordinary_key(keyed: RunningServer, path: str) -> None:
    assert SECOND + ":latest" not in _loaded(keyed)
    with _client(keyed, USER) as user:
        refused = user.get(path, params={"model": SECOND})
        assert refused.status_code == 403, refused.text
        assert SECOND + ":latest" not in _loaded(keyed)
        assert user.get(path).status_code == 200  # the default model


def test_get_props_loads_for_the_admin_key(keyed: RunningServer) -> None:
    with _client(keyed, USER) as user, _client(keyed, ADMIN) as admin:
        loaded = admin.get("/props", params={"model": SECOND})
        assert loaded.status_code == 200 and loaded.json()["model_alias"] == SECOND
        assert SECOND + ":latest" in _loaded(keyed)
        # Loaded: an ordinary key reads it, without loading anything.
        seen = user.get("/props", params={"model": SECOND})
        assert seen.status_code == 200, seen.text
        unloaded = admin.post("/api/generate", json={"model": SECOND, "keep_alive": 0})
        assert unloaded.json()["done_reason"] == "unload"
    assert SECOND + ":latest" not in _loaded(keyed)


def test_an_ordinary_key_sees_only_its_own_work(keyed: RunningServer) -> None:
    prompt = "Ledger of the admin: " + "amber cedar ember " * 60
    with _client(keyed, ADMIN) as admin, _client(keyed, USER) as user:
        done = admin.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": prompt,
                                                   "max_tokens": 1})
        assert done.status_code == 200, done.text
        held = [s for s in admin.get("/slots").json() if s["n_cached_tokens"] > 100]
        assert held, "the admin key's prompt stays cached in a slot"
        seen = {s["id"]: s for s in user.get("/slots").json()}
        assert all(seen[s["id"]]["n_cached_tokens"] == 0 for s in held)
        health = user.get("/health").json()
        assert health["status"] == "ok" and not {"models", "memory"} & health.keys()
        assert {"models", "memory"} <= admin.get("/health").json().keys()
        metrics = user.get("/metrics")
        assert metrics.status_code == 403 and "admin" in metrics.json()["error"]["message"]
        assert "edge_server_" in admin.get("/metrics").text


@pytest.mark.parametrize("keep_alive", [-1, "-1m", 301, "1h"])
def test_an_ordinary_key_cannot_keep_a_model_longer(keyed: RunningServer,
                                                    keep_alive: int | str) -> None:
    body = {"model": DEFAULT_MODEL, "prompt": "Hi", "stream": False,
            "options": {"num_predict": 1}, "keep_alive": keep_alive}
    with _client(keyed, USER) as user:
        refused = user.post("/api/generate", json=body)
        assert refused.status_code == 403, refused.text
        assert "admin" in refused.json()["error"]
        assert user.post("/api/generate", json={**body, "keep_alive": 60}).status_code == 200
    with _client(keyed, ADMIN) as admin:
        assert admin.post("/api/generate", json=body).status_code == 200
        # Back to the server's default for the tests that follow.
        assert admin.post("/api/generate", json={**body, "keep_alive": 300}).status_code == 200


def test_copy_to_a_hub_name_then_pull_keeps_every_name_on_its_weights(
        keyed: RunningServer, hub: LocalHub) -> None:
    name = f"hf.co/{HUB_REPO}:Q4_1"
    with _client(keyed, ADMIN) as admin:
        assert admin.post("/api/copy", json={"source": SECOND,
                                             "destination": name}).status_code == 200
        before = {m["name"]: m["digest"] for m in admin.get("/api/tags").json()["models"]}
        asked = len(hub.requests)
        for stream in (True, False):
            pulled = admin.post("/api/pull", json={"model": name, "stream": stream})
            assert pulled.status_code == 409, pulled.text
            assert set(pulled.json()) == {"error"}
        assert len(hub.requests) == asked  # nothing listed, nothing downloaded
        after = {m["name"]: m["digest"] for m in admin.get("/api/tags").json()["models"]}
        assert after == before
        shown = admin.post("/api/show", json={"model": name})
        assert shown.status_code == 200 and "FROM " + SECOND in shown.json()["modelfile"]
        # A copy never repoints a taken name either.
        taken = admin.post("/api/copy", json={"source": DEFAULT_MODEL, "destination": name})
        assert taken.status_code == 409, taken.text
        assert admin.request("DELETE", "/api/delete", json={"model": name}).status_code == 200


def test_copied_names_are_bounded(keyed: RunningServer) -> None:
    with _client(keyed, ADMIN) as admin:
        long = admin.post("/api/copy", json={"source": DEFAULT_MODEL, "destination": "n" * 201})
        assert long.status_code == 400, long.text
        names = [f"copy-{i}" for i in range(MAX_RUNTIME_NAMES)]
        for name in names:
            r = admin.post("/api/copy", json={"source": DEFAULT_MODEL, "destination": name})
            assert r.status_code == 200, r.text
        over = admin.post("/api/copy", json={"source": DEFAULT_MODEL, "destination": "more"})
        assert over.status_code == 409, over.text
        for name in names:
            assert admin.request("DELETE", "/api/delete",
                                 json={"model": name}).status_code == 200


def test_keyless_server_never_loads_on_a_get_nor_deletes_the_default(
        tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "local").mkdir(parents=True)
    default_file = models / "local" / "mine.gguf"
    shutil.copy(default_model_path(), default_file)
    server = start_server(tmp_path, "--model", str(default_file), "--registry",
                          str(_registry(tmp_path)), "--ctx-size", "1024", "--parallel", "1",
                          name="keyless", env={"EDGE_SERVER_MODELS_DIR": str(models)})
    try:
        with _client(server, None) as anyone:
            refused = anyone.get("/props", params={"model": SECOND})
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["code"] == "model_not_loaded"
            running = {m["model"] for m in anyone.get("/api/ps").json()["models"]}
            assert SECOND + ":latest" not in running
            assert anyone.get("/props").status_code == 200
            kept = anyone.request("DELETE", "/api/delete", json={"model": "mine"})
            assert kept.status_code == 403, kept.text
        assert default_file.is_file()
    finally:
        stop_server(server)
