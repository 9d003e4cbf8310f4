"""Stopping an engine mid-step, and saved prompt caches across restarts.

- Closing an engine whose thread is still inside a step (a long prefill here; a step
  longer than the stop timeout in production) neither snapshots its KV (a torn entry
  with a valid checksum, trusted after a restart) nor frees the context under it.
- A saved prefix holding an image (negative placeholder ids) is loaded after a restart
  and reused: the image is not encoded again.
- A prompt cache file that vanishes between listing and reading (replicas sharing a
  models directory prune it) does not keep a model from loading.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from conftest import DEFAULT_MODEL, start_server, stop_server, write_test_projector

from edge_testkit.images import IMAGE_TOKENS, chat, png_url, stats

# Prefixes under 128 tokens are not worth saving: a question that makes the prompt longer.
LONG_QUESTION = "You look at pictures for a museum catalogue. " * 20 + "Describe it."


def test_close_during_a_long_prefill_saves_and_frees_nothing(tmp_path: Path) -> None:
    from edge_server.catalogue.default_model import default_model_path
    from edge_server.engine import ContextSettings, Engine, EngineError, EngineSettings
    from edge_server.engine.kv.prompt_store import load_entries
    from edge_server.engine.request import GenerationRequest

    settings = EngineSettings(context=ContextSettings(n_ctx=4096, n_seq_max=1, n_threads=1),
                              prompt_cache_dir=tmp_path)
    engine = Engine("smollm2", default_model_path(), settings)
    prompt = engine.tokenize("The history of the long road. " * 500)[:4000]

    async def close_mid_prefill() -> None:
        handle = engine.submit(GenerationRequest(prompt_tokens=prompt, max_tokens=2))
        while engine.scheduler.step_started is None:  # the prefill's first step runs
            await asyncio.sleep(0.001)
        # As if the step outlasted the stop timeout: the thread is still inside it.
        await asyncio.to_thread(engine.close, 0.0)
        assert not list(tmp_path.rglob("*.kv")), "KV was saved while a step wrote it"
        assert engine.model.ctx, "the context was freed under a running step"
        # The step ends; the request gets its answer, the process stays up.
        with pytest.raises(EngineError, match="shutting down"):
            async for _ in handle.deltas():
                pass

    asyncio.run(close_mid_prefill())
    # Once the thread is gone, closing again saves only what is whole, and frees.
    engine.close()
    saved = [e for d in tmp_path.iterdir()
             for e in load_entries(d, d.name, 1 << 30, max_tokens=4096)]
    assert all(e.tokens == prompt[: len(e.tokens)] for e in saved)


def test_saved_image_prefixes_are_reused_after_a_restart(tmp_path: Path) -> None:
    projector = write_test_projector(tmp_path / "mmproj.gguf")
    args = ("--mmproj", str(projector), "--parallel", "1")
    image = png_url(61)
    server = start_server(tmp_path, *args, name="before-restart")
    try:
        first = chat(server, image, question=LONG_QUESTION)
        assert first.status_code == 200, first.text
    finally:
        assert stop_server(server) == 0  # saves the prompt cache
    saved = list((tmp_path / "data").rglob("prompt-cache/*/*.kv"))
    assert saved, "nothing was saved at shutdown"
    # A file another replica removes between our listing and our reading of it.
    (saved[0].parent / "vanished.kv").symlink_to(tmp_path / "gone.kv")

    server = start_server(tmp_path, *args, name="after-restart")
    try:
        again = chat(server, image, question=LONG_QUESTION + " And its colours?")
        assert again.status_code == 200, again.text
        cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= IMAGE_TOKENS + 128  # the head, the image and the question, from disk
        assert stats(server)["images_encoded"] == 0
        # Another image is not mistaken for the saved one.
        other = chat(server, png_url(62), question=LONG_QUESTION + " And its colours?")
        assert other.json()["usage"]["prompt_tokens_details"]["cached_tokens"] < cached
        assert stats(server)["images_encoded"] == 1
        assert httpx.get(f"{server.base_url}/v1/models/{DEFAULT_MODEL}").status_code == 200
    finally:
        stop_server(server)
