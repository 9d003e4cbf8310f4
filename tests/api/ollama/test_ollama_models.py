"""Ollama's model management through the official `ollama` client, on a server of its own
whose models come from a local stand-in of the Hugging Face Hub: /api/pull with progress
(registry ids and hf.co names), /api/copy, /api/delete, keep_alive (0 unloads), API keys
as Bearer tokens; and images (base64) on its default model, which has a projector."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest
from conftest import (
    DEFAULT_MODEL,
    RunningServer,
    start_server,
    stop_server,
    until,
    write_test_projector,
)

from edge_server.catalogue.default_model import default_model_path
from edge_testkit.servers.local_hub import LocalHub

REPO, FILE = "edge-test/tiny-chat-GGUF", "tiny-chat.Q4_1.gguf"  # a registry model's
HUB_REPO, HUB_FILE = "edge-test/other-GGUF", "other-Q4_1.gguf"  # pulled by hf.co name
HUB_NAME = f"hf.co/{HUB_REPO}:Q4_1"
KEY = "ollama-test-key"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def gguf() -> bytes:
    return default_model_path().read_bytes()


@pytest.fixture(scope="module")
def models_server(tmp_path_factory: pytest.TempPathFactory, gguf: bytes
                  ) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("ollama-models")
    registry = tmp / "registry.toml"
    registry.write_text(f'[[models]]\nid = "tiny"\nrepo = "{REPO}"\nfile = "{FILE}"\n')
    files = {(REPO, FILE): gguf, (HUB_REPO, HUB_FILE): gguf}
    with LocalHub(files) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp / "hf"),
               "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "EDGE_SERVER_MODELS_DIR": str(tmp / "models")}
        # The test projector (edge_testkit/models/make_test_projector.py): its images mean nothing
        # to the model, but every step of reading them runs.
        projector = write_test_projector(tmp / "test-mmproj.gguf")
        server = start_server(tmp, "--registry", str(registry), "--admin-api-key", KEY,
                              "--mmproj", str(projector),
                              "--parallel", "2", "--ctx-size", "2048", name="ollama-models",
                              env=env)
        try:
            yield server, tmp / "models"
        finally:
            stop_server(server)
    assert "Traceback" not in server.log_text(), server.log_text()


@pytest.fixture()
def oc(models_server: tuple[RunningServer, Path]) -> ollama.Client:
    server, _ = models_server
    return ollama.Client(host=server.base_url, timeout=120,
                         headers={"Authorization": f"Bearer {KEY}"})


def _listed(oc: ollama.Client) -> set[str]:
    return {m.model or "" for m in oc.list().models}


def _loaded(oc: ollama.Client) -> set[str]:
    return {m.model or "" for m in oc.ps().models}


def test_api_key_as_bearer_token(models_server: tuple[RunningServer, Path]) -> None:
    server, _ = models_server
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=server.base_url).list()
    assert refused.value.status_code == 401
    r = httpx.get(f"{server.base_url}/api/tags", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and set(r.json()) == {"error"}


def test_pull_registry_id_streams_progress(oc: ollama.Client, gguf: bytes) -> None:
    assert "tiny:latest" not in _listed(oc)
    with pytest.raises(ollama.ResponseError) as missing:  # not downloaded yet
        oc.chat(model="tiny", messages=HI)
    assert missing.value.status_code == 503
    steps = list(oc.pull("tiny:latest", stream=True))
    assert steps[0].status == "pulling manifest" and steps[-1].status == "success"
    progress = [s for s in steps if s.total]
    assert progress and all(s.digest == "sha256:" + hashlib.sha256(gguf).hexdigest()
                            for s in progress)
    assert all(0 <= (s.completed or 0) <= s.total for s in progress)
    assert progress[-1].completed == progress[-1].total == len(gguf)
    assert "verifying sha256 digest" in [s.status for s in steps]
    listed = next(m for m in oc.list().models if m.model == "tiny:latest")
    assert listed.digest == hashlib.sha256(gguf).hexdigest() and listed.size == len(gguf)
    answer = oc.chat(model="tiny", messages=HI, options={"num_predict": 3})
    assert answer.done and answer.eval_count <= 3


def test_pull_hub_name_then_serve_and_delete(oc: ollama.Client,
                                             models_server: tuple[RunningServer, Path]) -> None:
    _, models_dir = models_server
    done = oc.pull(HUB_NAME)  # not streamed: the last status only
    assert done.status == "success"
    assert HUB_NAME in _listed(oc)
    out = oc.generate(model=HUB_NAME, prompt="Hello", options={"num_predict": 2})
    assert out.done and out.model == HUB_NAME
    assert (models_dir / HUB_REPO / HUB_FILE).is_file()
    oc.delete(HUB_NAME)
    assert HUB_NAME not in _listed(oc)
    assert not (models_dir / HUB_REPO / HUB_FILE).exists()
    with pytest.raises(ollama.ResponseError) as gone:
        oc.generate(model=HUB_NAME, prompt="Hello", options={"num_predict": 2})
    assert gone.value.status_code == 503


def test_deleting_one_of_two_names_on_a_file_keeps_the_file(
        oc: ollama.Client, models_server: tuple[RunningServer, Path]) -> None:
    """`:Q4_1` and `:q4_1` pull one file as two models: deleting one leaves the other
    serving; the file goes with the last. /api/ps answers even when a loaded model's file
    was removed on disk."""
    server, models_dir = models_server
    upper, lower = HUB_NAME, HUB_NAME.lower().replace("hf.co/edge-test/other-gguf",
                                                      f"hf.co/{HUB_REPO}")
    assert lower.endswith(":q4_1")
    for name in (upper, lower):
        assert oc.pull(name).status == "success"
    path = models_dir / HUB_REPO / HUB_FILE
    assert oc.generate(model=lower, prompt="Hi", options={"num_predict": 1}).done
    oc.delete(upper)
    assert path.is_file()
    assert oc.generate(model=lower, prompt="Hi", options={"num_predict": 1}).done
    assert lower in _loaded(oc) and lower in _listed(oc) and upper not in _listed(oc)
    oc.delete(lower)
    assert not path.exists() and lower not in _listed(oc)
    # Pulled again and loaded, then its file moved away by hand: listed, not a 500.
    assert oc.pull(lower).status == "success"
    assert oc.generate(model=lower, prompt="Hi", options={"num_predict": 1}).done
    aside = path.rename(path.with_name("moved-away"))
    try:
        r = httpx.get(f"{server.base_url}/api/ps", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200, r.text
        assert lower in {m["model"] for m in r.json()["models"]}
        assert lower not in _listed(oc)
    finally:
        aside.rename(path)  # back before it unloads (its prompt cache is keyed by the file)
    oc.delete(lower)
    assert not path.exists()


@pytest.mark.parametrize("name", ["nothing-here", "hf.co/edge-test/missing-GGUF:Q4_1",
                                  f"hf.co/{HUB_REPO}:Q2_K"])
def test_pull_of_an_unknown_model_is_404(oc: ollama.Client, name: str) -> None:
    with pytest.raises(ollama.ResponseError) as missing:
        list(oc.pull(name, stream=True))
    assert missing.value.status_code == 404


def test_copy_then_delete_the_copy(oc: ollama.Client) -> None:
    oc.copy(DEFAULT_MODEL, "my-copy:v1")
    assert "my-copy:v1" in _listed(oc)
    answer = oc.chat(model="my-copy:v1", messages=HI, options={"num_predict": 2})
    assert answer.done and answer.model == "my-copy:v1"
    with pytest.raises(ollama.ResponseError) as taken:
        oc.copy(DEFAULT_MODEL, "my-copy:v1")
    assert taken.value.status_code == 409  # a copy never repoints a name
    oc.delete("my-copy:v1")
    assert "my-copy:v1" not in _listed(oc)
    with pytest.raises(ollama.ResponseError) as gone:
        oc.chat(model="my-copy:v1", messages=HI)
    assert gone.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as unknown:
        oc.copy("no-such-model", "x")
    assert unknown.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as embedded:  # the operator's file stays
        oc.delete(DEFAULT_MODEL)
    assert embedded.value.status_code == 403


def test_keep_alive_zero_unloads_and_load_requests(oc: ollama.Client) -> None:
    list(oc.pull("tiny"))
    loaded = oc.generate(model="tiny")  # an empty prompt loads the model
    assert loaded.done and loaded.done_reason == "load"
    assert "tiny:latest" in _loaded(oc)
    unloaded = oc.chat(model="tiny", messages=[], keep_alive=0)
    assert unloaded.done_reason == "unload" and "tiny:latest" not in _loaded(oc)

    answer = oc.chat(model="tiny", messages=HI, keep_alive=0, options={"num_predict": 2})
    assert answer.done
    assert until(lambda: "tiny:latest" not in _loaded(oc), 5.0)

    oc.generate(model="tiny", prompt="Hi", keep_alive="-1", options={"num_predict": 1})
    forever = next(m for m in oc.ps().models if m.model == "tiny:latest")
    assert forever.expires_at is not None and forever.expires_at.year > 2100
    oc.generate(model="tiny", prompt="Hi", keep_alive="90s", options={"num_predict": 1})
    soon = next(m for m in oc.ps().models if m.model == "tiny:latest")
    assert soon.expires_at is not None and soon.expires_at.year < 2100
    oc.generate(model="tiny", keep_alive=0)
    assert "tiny:latest" not in _loaded(oc)


def _png(size: tuple[int, int] = (40, 32)) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 60)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_images_on_a_model_with_a_projector(oc: ollama.Client) -> None:
    image = _png()
    shown = oc.show(DEFAULT_MODEL)
    assert "vision" in (shown.capabilities or [])
    text_only = oc.chat(model=DEFAULT_MODEL, messages=HI, options={"num_predict": 1})
    seen = oc.chat(model=DEFAULT_MODEL, options={"num_predict": 2},
                   messages=[{"role": "user", "content": "What is this?", "images": [image]}])
    assert seen.done and seen.prompt_eval_count > text_only.prompt_eval_count
    described = oc.generate(model=DEFAULT_MODEL, prompt="Describe it.", images=[image],
                            options={"num_predict": 2})
    assert described.done and described.prompt_eval_count > text_only.prompt_eval_count
    with pytest.raises(ollama.ResponseError) as corrupt:
        oc.chat(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "x",
                                                "images": ["aGVsbG8gd29ybGQ="]}])
    assert corrupt.value.status_code == 400 and "messages[0].images[0]" in corrupt.value.error
    with pytest.raises(ollama.ResponseError) as raw:
        oc.generate(model=DEFAULT_MODEL, prompt="x", images=[image], raw=True)
    assert raw.value.status_code == 400 and "images" in raw.value.error
