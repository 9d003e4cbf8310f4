"""Prepared images: chunk identity and their release on every path.

- A tiling projector (edge_testkit/models/make_test_projector.py --tiles: an idefics3 projector,
  SmolVLM's kind, whose preprocessing splits an image into an overview and tiles) makes
  several image chunks of one image in this llama.cpp: each is keyed and encoded apart.
- The cap on prepared images counts chunks, checked for each.
- Requests that fail after their images were prepared (a 400, a queue timeout, a client
  gone) leave nothing prepared behind, without waiting for a garbage collection.
- Freeing a chunk takes no lock: a collection on the engine thread inside `encode`
  (which holds the projector's lock) cannot deadlock it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server, write_test_projector

from edge_testkit.images import chat, png_url, stats

TILE_TOKENS = 4  # a 32-pixel tile: 4 x 4 patches, merged 2 x 2


@pytest.fixture(scope="module")
def tiling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("tiling")
    projector = write_test_projector(tmp / "tiling-mmproj.gguf", tiles=2)
    server = start_server(tmp, "--mmproj", str(projector), "--parallel", "2", name="tiling")
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def queued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One slot and a short queue timeout: image requests can be left waiting."""
    tmp = tmp_path_factory.mktemp("queued")
    projector = write_test_projector(tmp / "mmproj.gguf")
    # No drafting and a long context: one stream can hold the slot for many seconds.
    server = start_server(tmp, "--mmproj", str(projector), "--parallel", "1",
                          "--queue-timeout", "2", "--draft-max", "0", "--ctx-size", "4096",
                          name="queued")
    yield server
    stop_server(server)


def test_tiles_of_one_image_are_keyed_and_encoded_apart(tiling: RunningServer) -> None:
    before = stats(tiling)
    # 64 x 64 pixels: an overview and 2 x 2 tiles, five chunks of one image.
    first = chat(tiling, png_url(1, (64, 64)), max_tokens=2)
    assert first.status_code == 200, first.text
    after = stats(tiling)
    # One key per chunk: all five encoded. With one key per image, the overview's
    # embeddings stood in for every tile (four "skipped" encodes).
    assert after["images_encoded"] - before["images_encoded"] == 5
    assert after["image_encodes_skipped"] == before["image_encodes_skipped"]
    # Asked again: the prefix cache holds all five chunks' tokens, nothing is encoded.
    again = chat(tiling, png_url(1, (64, 64)), max_tokens=2)
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 5 * TILE_TOKENS
    assert stats(tiling)["images_encoded"] == after["images_encoded"]
    assert stats(tiling)["images_prepared"] == 0


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The tiling projector loaded in this process, over the default model."""
    from edge_server.catalogue.default_model import default_model_path
    from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel
    from edge_server.engine.multimodal.projector import Projector

    path = write_test_projector(tmp_path_factory.mktemp("proj") / "tiles.gguf", tiles=2)
    model = LlamaModel(default_model_path(), ContextSettings(n_ctx=512, n_seq_max=1,
                                                             n_threads=1))
    loaded = Projector(path, model, use_gpu=False)
    yield loaded
    loaded.close()
    model.close()


def rgb(seed: int, side: int = 64):  # type: ignore[no-untyped-def]
    from edge_server.engine.multimodal.projector import RgbImage

    pixels = np.random.default_rng(seed).integers(0, 255, (side, side, 3), np.uint8).tobytes()
    return RgbImage(side, side, pixels, hashlib.sha256(pixels).hexdigest())


def image_chunks(pieces: list) -> list:  # type: ignore[type-arg]
    from edge_server.engine.multimodal.projector import ImageChunk

    return [p for p in pieces if isinstance(p, ImageChunk)]


def test_chunk_keys_hold_the_index_and_the_projector(projector) -> None:  # type: ignore[no-untyped-def]
    from edge_server.engine.multimodal.projector import chunk_key

    chunks = image_chunks(projector.image_prompt(rgb(1)))
    assert len(chunks) == 5
    assert len({c.key for c in chunks}) == 5
    placeholders = [t for c in chunks for t in c.placeholders]
    assert len(set(placeholders)) == len(placeholders) and all(t < 0 for t in placeholders)
    # The same image gives the same keys; another projector file, other keys.
    assert [c.key for c in image_chunks(projector.image_prompt(rgb(1)))] == [
        c.key for c in chunks]
    other = hashlib.sha256(b"another projector").digest()
    assert chunk_key(other, rgb(1).digest, 0) != chunks[0].key


def test_prepared_cap_counts_and_checks_every_chunk(projector) -> None:  # type: ignore[no-untyped-def]
    from edge_server.engine.multimodal.projector import MAX_PREPARED_IMAGES, ProjectorBusy

    held = []
    with pytest.raises(ProjectorBusy):
        for seed in range(MAX_PREPARED_IMAGES):
            held.append(projector.image_prompt(rgb(seed)))
    # Five chunks an image: 12 images fit in 64, the 13th is refused part-way, and the
    # chunks it had made are freed at once; the cap is never passed.
    assert len(held) == MAX_PREPARED_IMAGES // 5
    assert projector.prepared == 5 * len(held) <= MAX_PREPARED_IMAGES
    for pieces in held:
        for chunk in image_chunks(pieces):
            chunk.close()
    assert projector.prepared == 0


def test_freeing_a_chunk_takes_no_lock(projector) -> None:  # type: ignore[no-untyped-def]
    chunks = image_chunks(projector.image_prompt(rgb(7)))
    done = threading.Event()

    def collect_inside_encode() -> None:
        # As a garbage collection on the engine thread would, inside encode's lock.
        with projector._lock:
            chunks.clear()  # the last references: the finalizers run here
        done.set()

    worker = threading.Thread(target=collect_inside_encode, daemon=True)
    worker.start()
    assert done.wait(10), "freeing a chunk blocked on the projector's lock"
    assert projector.prepared == 0


def test_failed_requests_leave_no_prepared_images(queued: RunningServer) -> None:
    def failing(i: int) -> httpx.Response:
        # Prepared (eight images), then refused: max_tokens cannot fit the context.
        return chat(queued, *[png_url(100 * i + k) for k in range(8)], max_tokens=100_000,
                    context_length_exceeded_behavior="error")

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(failing, range(8)))
    assert [r.status_code for r in answers] == [400] * 8, answers[0].text
    assert {r.json()["error"]["param"] for r in answers} == {"max_tokens"}
    assert stats(queued)["images_prepared"] == 0
    # Counted, then dropped: /v1/messages/count_tokens prepares images it never queues.
    data = png_url(3).split(",", 1)[1]
    counted = httpx.post(f"{queued.base_url}/v1/messages/count_tokens", timeout=60, json={
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": data}},
            {"type": "text", "text": "What is it?"}]}]})
    assert counted.status_code == 200, counted.text
    assert stats(queued)["images_prepared"] == 0


def test_queued_image_requests_release_images_on_expiry_and_disconnect(
        queued: RunningServer) -> None:
    def busy() -> None:
        # Holds the only slot until this client gives up (and the server cancels it).
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{queued.v1}/completions", timeout=20, json={
                "model": DEFAULT_MODEL, "prompt": "Count:", "max_tokens": 3500,
                "ignore_eos": True})

    def leaving() -> None:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{queued.v1}/chat/completions", timeout=1.0, json={
                "model": DEFAULT_MODEL, "max_tokens": 2, "messages": [{
                    "role": "user", "content": [
                        {"type": "image_url", "image_url": {"url": png_url(33)}},
                        {"type": "text", "text": "What is it?"}]}]})

    with ThreadPoolExecutor(3) as pool:
        holder = pool.submit(busy)
        deadline = time.monotonic() + 30
        while not stats(queued)["busy_slots"] and time.monotonic() < deadline:
            time.sleep(0.1)
        expiring = pool.submit(chat, queued, png_url(31), png_url(32))
        pool.submit(leaving).result()
        expired = expiring.result()  # queued past --queue-timeout
        assert expired.status_code == 503, expired.text
        while stats(queued)["images_prepared"] and time.monotonic() < deadline:
            time.sleep(0.2)
        # Both left the queue while the slot was still taken: their images are freed.
        assert stats(queued)["busy_slots"] == 1
        assert stats(queued)["images_prepared"] == 0
        holder.result()
