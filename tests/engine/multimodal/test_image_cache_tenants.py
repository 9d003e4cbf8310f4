"""Tenants and images: with API keys, an image one key sent is encoded again for another
key (the embedding cache is kept per key, so neither the time an encode takes nor a
counter tells a key what another sent), and /health tells a caller without a valid key
the status alone, an ordinary key no per-model counters (image_encodes_skipped among
them), the admin key everything."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server, write_test_projector

from edge_testkit.images import png_url

KEY_A, KEY_B, ADMIN = "image-tenant-a", "image-tenant-b", "image-tenant-admin"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("image-tenants")
    projector = write_test_projector(tmp / "mmproj.gguf")
    server = start_server(tmp, "--mmproj", str(projector), "--parallel", "2",
                          "--api-key", KEY_A, "--api-key", KEY_B, "--admin-api-key", ADMIN,
                          name="image-tenants")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _ask(server: RunningServer, key: str, opening: str, image: str) -> None:
    """A chat whose text before the image differs per call: the KV prefix cache ends
    before the image, so the image is decoded again (encoded, or taken from the cache)."""
    parts = [{"type": "text", "text": opening},
             {"type": "image_url", "image_url": {"url": image}},
             {"type": "text", "text": "What is in the picture?"}]
    r = httpx.post(f"{server.v1}/chat/completions", timeout=180, headers=_bearer(key), json={
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": parts}],
        "max_tokens": 1})
    assert r.status_code == 200, r.text


def _images(server: RunningServer) -> tuple[int, int]:
    """(images_encoded, image_encodes_skipped), as the admin key sees them."""
    stats = httpx.get(f"{server.base_url}/health", headers=_bearer(ADMIN)).json()
    model = stats["models"][DEFAULT_MODEL]
    return model["images_encoded"], model["image_encodes_skipped"]


def test_an_image_is_encoded_again_for_another_key(keyed: RunningServer) -> None:
    image = png_url(91)
    encoded, skipped = _images(keyed)
    _ask(keyed, KEY_A, "First look.", image)
    assert _images(keyed) == (encoded + 1, skipped)
    # Key A again, the image after other text: its cached encoding is used ...
    _ask(keyed, KEY_A, "A second look, from elsewhere.", image)
    assert _images(keyed) == (encoded + 1, skipped + 1)
    # ... but key B's request encodes it anew: B learns nothing of what A sent.
    _ask(keyed, KEY_B, "Another tenant looks.", image)
    assert _images(keyed) == (encoded + 2, skipped + 1)
    # B's own encoding is cached for B.
    _ask(keyed, KEY_B, "Another tenant looks once more.", image)
    assert _images(keyed) == (encoded + 2, skipped + 2)


@pytest.mark.parametrize("headers", [{}, _bearer("not-a-key"), {"x-api-key": "wrong"}])
def test_health_tells_a_caller_without_a_key_the_status_alone(
        keyed: RunningServer, headers: dict[str, str]) -> None:
    r = httpx.get(f"{keyed.base_url}/health", headers=headers)
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


@pytest.mark.parametrize("headers", [_bearer(KEY_B), {"x-api-key": KEY_A}])
def test_health_tells_an_ordinary_key_no_counters(
        keyed: RunningServer, headers: dict[str, str]) -> None:
    body = httpx.get(f"{keyed.base_url}/health", headers=headers).json()
    assert body["status"] == "ok" and body["default_model"] == DEFAULT_MODEL
    assert "kv_cache" in body and not {"models", "memory"} & body.keys()


def test_health_tells_the_admin_key_everything(keyed: RunningServer) -> None:
    body = httpx.get(f"{keyed.base_url}/health", headers=_bearer(ADMIN)).json()
    assert body["status"] == "ok" and body["default_model"] == DEFAULT_MODEL
    assert "image_encodes_skipped" in body["models"][DEFAULT_MODEL]
    assert {"memory", "kv_cache"} <= body.keys()
