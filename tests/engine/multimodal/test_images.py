"""Images through llama.cpp's mtmd, inside the batching engine, with a tiny synthetic
projector next to the default model (edge_testkit/models/make_test_projector.py: random weights, so
what the model says about a picture means nothing; every mechanism is real).

Asserted: image tokens counted in usage, images changing the distribution of the first
token, repeats equal to themselves, concurrency with text streams, a repeated image
cached and not encoded again, and bad input refused by name without hurting the server.
"""

from __future__ import annotations

import base64
import io
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import (
    DEFAULT_MODEL,
    RunningServer,
    start_server,
    stop_server,
    write_test_projector,
)
from PIL import Image

from edge_testkit.images import IMAGE_TOKENS, chat, png_url, stats


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("vision")
    projector = write_test_projector(tmp / "test-mmproj.gguf")
    server = start_server(tmp, "--mmproj", str(projector), "--parallel", "4",
                          "--ctx-size", "8192", name="vision")
    yield server
    stop_server(server)


def first_token_distribution(response: httpx.Response) -> dict[str, float]:
    assert response.status_code == 200, response.text
    first = response.json()["choices"][0]["logprobs"]["content"][0]
    return {t["token"]: round(t["logprob"], 2) for t in first["top_logprobs"]}


def test_models_list_the_image_input(vision: RunningServer) -> None:
    card = httpx.get(f"{vision.v1}/models/{DEFAULT_MODEL}").json()
    assert card["input_modalities"] == ["text", "image"]


def test_apply_template_and_props_show_the_image_input(vision: RunningServer) -> None:
    parts = [{"type": "image_url", "image_url": {"url": png_url(1)}},
             {"type": "text", "text": "and"},
             {"type": "image_url", "image_url": {"url": png_url(2)}}]
    r = httpx.post(f"{vision.base_url}/apply-template",
                   json={"messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"].count("<__media__>") == 2
    props = httpx.get(f"{vision.base_url}/props").json()
    assert props["modalities"] == {"vision": True, "audio": False}


def test_chat_counts_image_tokens_and_reads_the_image(vision: RunningServer) -> None:
    scored = {"logprobs": True, "top_logprobs": 5}
    a, b = png_url(1), png_url(2)
    with_a = chat(vision, a, **scored)
    text_only = httpx.post(f"{vision.v1}/chat/completions", timeout=60, json={
        "model": DEFAULT_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "text", "text": ""}, {"type": "text", "text": "What is in the picture?"}]}]})
    # The image stands where an empty text part would: the difference is its tokens.
    assert (with_a.json()["usage"]["prompt_tokens"]
            == text_only.json()["usage"]["prompt_tokens"] + IMAGE_TOKENS)
    # Temperature 0 over the same cached prefix: identical; another image: another answer.
    again = [chat(vision, a, **scored) for _ in range(2)]
    assert again[0].json()["choices"][0]["message"] == again[1].json()["choices"][0]["message"]
    assert first_token_distribution(again[0]) == first_token_distribution(again[1])
    assert first_token_distribution(chat(vision, b, **scored)) != first_token_distribution(
        again[0])
    # Two images are both read: dropping either changes what the model sees.
    both = chat(vision, a, b, **scored)
    assert both.json()["usage"]["prompt_tokens"] == with_a.json()["usage"]["prompt_tokens"] + (
        IMAGE_TOKENS + 1)  # the second image and the newline joining the parts
    assert first_token_distribution(both) != first_token_distribution(chat(vision, a, a,
                                                                           **scored))
    assert first_token_distribution(both) != first_token_distribution(chat(vision, b, b,
                                                                           **scored))


def test_completions_take_images_per_marker(vision: RunningServer) -> None:
    def tokens(text: str, add_special: bool) -> int:
        r = httpx.post(f"{vision.base_url}/tokenize", json={
            "model": DEFAULT_MODEL, "content": text, "add_special": add_special})
        return len(r.json()["tokens"])

    def complete(*images: str, stream: bool = False) -> httpx.Response:
        return httpx.post(f"{vision.v1}/completions", timeout=60, json={
            "model": DEFAULT_MODEL, "prompt": "Picture:<image>It shows", "images": list(images),
            "max_tokens": 4, "temperature": 0, "stream": stream})

    r = complete(png_url(3))
    assert r.status_code == 200, r.text
    expected = tokens("Picture:", True) + IMAGE_TOKENS + tokens("It shows", False)
    assert r.json()["usage"]["prompt_tokens"] == expected
    streamed = complete(png_url(3), stream=True)
    assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
    mismatch = complete(png_url(3), png_url(4))
    assert mismatch.status_code == 400 and mismatch.json()["error"]["param"] == "images"


def test_repeated_image_is_cached_not_encoded_again(vision: RunningServer) -> None:
    image = png_url(11)
    first = chat(vision, image, question="Describe it.")
    assert first.status_code == 200
    encoded = stats(vision)["images_encoded"]
    follow_up = chat(vision, image, question="Describe it. And its colours?")
    assert follow_up.status_code == 200
    cached = follow_up.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= IMAGE_TOKENS  # the template's head and the whole image
    assert stats(vision)["images_encoded"] == encoded
    assert stats(vision)["images_prepared"] == 0  # every finished request freed its images


def test_text_streams_keep_flowing_beside_image_requests(vision: RunningServer) -> None:
    arrivals: list[list[float]] = [[] for _ in range(4)]

    def text_stream(i: int) -> int:
        """Its completion tokens; the arrival time of each of its events is kept."""
        generated = 0
        with httpx.stream("POST", f"{vision.v1}/completions", timeout=120, json={
                "model": DEFAULT_MODEL, "prompt": f"Story {i}:", "max_tokens": 48,
                "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals[i].append(time.monotonic())
                    usage = json.loads(line[6:]).get("usage")
                    generated = usage["completion_tokens"] if usage else generated
        return generated

    def image_request(i: int) -> int:
        return chat(vision, png_url(100 + i), png_url(200 + i), question=f"Image {i}?",
                    max_tokens=8).status_code

    with ThreadPoolExecutor(8) as pool:
        texts = [pool.submit(text_stream, i) for i in range(4)]
        time.sleep(0.3)
        images = [pool.submit(image_request, i) for i in range(4)]
        assert [f.result() for f in images] == [200] * 4
        assert [f.result() for f in texts] == [48] * 4
    # Streamed as generated: many events each (a delta holds back only a split character).
    assert all(len(a) >= 24 for a in arrivals)


BAD_IMAGES = {
    "corrupt base64": "data:image/png;base64,@@@not-base64@@@",
    "text as PNG": "data:image/png;base64," + base64.b64encode(b"just some text").decode(),
    "http URL": "http://127.0.0.1:9/cat.png",
    "not a data URL": "cat.png",
}


@pytest.mark.parametrize("name", sorted(BAD_IMAGES))
def test_bad_images_are_refused_by_name(vision: RunningServer, name: str) -> None:
    r = chat(vision, BAD_IMAGES[name])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("messages[0].content[0].image_url")


def test_huge_many_audio_and_video_are_refused(vision: RunningServer) -> None:
    buf = io.BytesIO()
    Image.new("1", (20_000, 20_000)).save(buf, "PNG")  # 400 megapixels in 48 KB
    huge = chat(vision, "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    assert huge.status_code == 400 and huge.json()["error"]["code"] == "image_too_large"
    many = chat(vision, *[png_url(7)] * 50)
    assert many.status_code == 400 and many.json()["error"]["param"] == "messages"
    for part in ({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                 {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}):
        r = httpx.post(f"{vision.v1}/chat/completions", timeout=60, json={
            "model": DEFAULT_MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": [part]}]})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == f"messages[0].content[0].{part['type']}"
    assert httpx.get(f"{vision.base_url}/health").status_code == 200
    assert chat(vision, png_url(8)).status_code == 200


def test_text_only_model_refuses_images(server: RunningServer) -> None:
    r = httpx.post(f"{server.v1}/completions", timeout=60, json={
        "model": DEFAULT_MODEL, "prompt": "<image>", "images": [png_url(1)], "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "images"
    assert chat(server, png_url(1)).json()["error"]["param"] == (
        "messages[0].content[0].image_url")


BROKEN_PROJECTORS = {
    "wrong output width": ({"width": 512}, "output width 512"),
    "metadata key of the wrong type": ({"wrong_type_keys": ("clip.vision.image_size",)},
                                       "INT32"),
    "heads not dividing the width": (
        {"override_u32": {"clip.vision.attention.head_count": 3}}, "do not divide"),
    "missing projection tensor": ({"skip_tensors": ("mm.2.weight",)}, "mm.2.weight"),
    "missing attention tensor": ({"skip_tensors": ("v.blk.0.attn_q.weight",)}, "attn_q"),
    "missing position embedding": ({"skip_tensors": ("v.position_embd.weight",)},
                                   "position_embd"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_PROJECTORS))
def test_broken_projectors_are_refused_before_llama_cpp(tmp_path: Path, name: str) -> None:
    from edge_server.engine.multimodal.projector_check import ProjectorError, check_projector

    kwargs, message = BROKEN_PROJECTORS[name]
    path = write_test_projector(tmp_path / "broken.gguf", **kwargs)
    with pytest.raises(ProjectorError, match=message):
        check_projector(path, 576)


def test_truncated_projector_is_refused(tmp_path: Path) -> None:
    from edge_server.engine.multimodal.projector_check import ProjectorError, check_projector

    data = write_test_projector(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 4096])
    with pytest.raises(ProjectorError):
        check_projector(cut, 576)


def test_wrong_width_projector_fails_at_load_with_a_clear_error(tmp_path: Path) -> None:
    projector = write_test_projector(tmp_path / "narrow.gguf", width=512)
    server = start_server(tmp_path, "--mmproj", str(projector), wait=False, name="narrow")
    assert server.process.wait(timeout=120) != 0
    assert "output width 512 does not match the model's embedding width 576" in (
        server.log_text())


def test_anthropic_image_blocks(vision: RunningServer, server: RunningServer) -> None:
    import anthropic

    data = png_url(21).split(",", 1)[1]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": data}}
    question = {"type": "text", "text": "What is in the picture?"}

    def ask(client: anthropic.Anthropic, first: dict) -> int:
        r = client.messages.create(model=DEFAULT_MODEL, max_tokens=4, system="Be brief.",
                                   messages=[{"role": "user", "content": [first, question]}])
        return r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)

    with anthropic.Anthropic(base_url=vision.base_url, api_key="x", max_retries=0) as claude:
        with_image = ask(claude, image)
        assert with_image == ask(claude, {"type": "text", "text": ""}) + IMAGE_TOKENS
        counted = claude.messages.count_tokens(
            model=DEFAULT_MODEL, system="Be brief.",
            messages=[{"role": "user", "content": [image, question]}])
        assert counted.input_tokens == with_image
        # A chat-side error names the Anthropic block (the system prompt shifts chat's
        # message indices by one).
        broken = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                              "data": "@@@"}}
        with pytest.raises(anthropic.BadRequestError) as bad:
            ask(claude, broken)
        assert "messages[0].content[0].source" in str(bad.value)
    with (anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0) as claude,
          pytest.raises(anthropic.BadRequestError) as refused):
        ask(claude, image)
    assert "messages[0].content[0]" in str(refused.value)


def test_responses_input_image(vision: RunningServer, server: RunningServer) -> None:
    import openai

    def ask(base: str, first: dict) -> int:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        r = client.responses.create(model=DEFAULT_MODEL, max_output_tokens=4, input=[{
            "role": "user", "content": [first, {"type": "input_text", "text": "Describe it."}]}])
        return r.usage.input_tokens

    image = {"type": "input_image", "image_url": png_url(22), "detail": "auto"}
    assert ask(vision.base_url, image) == ask(
        vision.base_url, {"type": "input_text", "text": ""}) + IMAGE_TOKENS
    with pytest.raises(openai.BadRequestError):
        ask(server.base_url, image)
