"""Audio through llama.cpp's mtmd, inside the batching engine, with a tiny synthetic
Whisper-style projector next to the default model (edge_testkit/models/
make_test_audio_projector.py: random weights, so what the model says about a clip means
nothing; every mechanism is real), through the official `openai` client.

Asserted: audio tokens counted (750 per started 30 s window, so a longer clip has more),
a clip changing the first token's distribution, transcriptions in each served format and
streamed, Responses' input_audio, and bounds and bad input refused by name.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import httpx
import openai
import pytest
from conftest import (
    DEFAULT_MODEL,
    RunningServer,
    start_server,
    stop_server,
    write_test_audio_projector,
)

from edge_testkit.audio import AUDIO_TOKENS_PER_WINDOW, wav_b64, wav_bytes

MAX_SECONDS = 40


def answer_bound_of(seconds: float) -> int:
    return 32 + math.ceil(12 * seconds)


@pytest.fixture(scope="module")
def hearing(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("hearing")
    projector = write_test_audio_projector(tmp / "test-audio-mmproj.gguf")
    server = start_server(tmp, "--mmproj", str(projector), "--parallel", "2",
                          "--ctx-size", "4096", "--max-audio-seconds", str(MAX_SECONDS),
                          name="hearing")
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def client(hearing: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=hearing.v1, api_key="unused", timeout=120, max_retries=0)


def audio_part(seconds: float, seed: int = 0) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": wav_b64(seconds, seed=seed),
                                                   "format": "wav"}}


def chat(client: openai.OpenAI, *parts: dict[str, Any], **extra: Any) -> Any:
    content = [*parts, {"type": "text", "text": "What is said?"}]
    return client.chat.completions.create(
        model=DEFAULT_MODEL, max_tokens=1, temperature=0,
        messages=[{"role": "user", "content": content}], **extra)  # type: ignore[arg-type]


def test_models_and_props_list_the_audio_input(hearing: RunningServer) -> None:
    card = httpx.get(f"{hearing.v1}/models/{DEFAULT_MODEL}").json()
    assert card["input_modalities"] == ["text", "audio"]
    assert httpx.get(f"{hearing.base_url}/props").json()["modalities"] == {
        "vision": False, "audio": True}


def test_a_clip_reaches_the_model_as_audio_tokens(client: openai.OpenAI) -> None:
    short, longer = chat(client, audio_part(2.0)), chat(client, audio_part(35.0))
    # Whisper-style encoders read 30 s windows: a clip past one takes a second.
    assert (longer.usage.prompt_tokens - short.usage.prompt_tokens
            == AUDIO_TOKENS_PER_WINDOW)
    assert short.usage.prompt_tokens > AUDIO_TOKENS_PER_WINDOW
    assert short.usage.prompt_tokens_details.audio_tokens == AUDIO_TOKENS_PER_WINDOW
    assert longer.usage.prompt_tokens_details.audio_tokens == 2 * AUDIO_TOKENS_PER_WINDOW
    # The end of turn is never the first token here: a token with logprobs always is.
    scored = {"logprobs": True, "top_logprobs": 5, "extra_body": {"ignore_eos": True}}

    def first(response: Any) -> dict[str, float]:
        return {t.token: round(t.logprob, 2)
                for t in response.choices[0].logprobs.content[0].top_logprobs}

    # Evaluated once, then twice over the same cached prefix: identical (a first
    # evaluation's last token shares its batch with the prompt's, whose kernels round
    # otherwise, as with text).
    chat(client, audio_part(2.0, seed=1), **scored)
    a = [first(chat(client, audio_part(2.0, seed=1), **scored)) for _ in range(2)]
    b = first(chat(client, audio_part(2.0, seed=2), **scored))
    assert a[0] == a[1]
    shared = a[0].keys() & b.keys()
    # Another clip: another distribution, by far more than rounding.
    assert shared != a[0].keys() or max(abs(a[0][t] - b[t]) for t in shared) > 0.05, (a, b)


def test_transcriptions_in_each_format(client: openai.OpenAI) -> None:
    clip = ("clip.wav", wav_bytes(1.0, seed=3))
    plain = client.audio.transcriptions.create(model=DEFAULT_MODEL, file=clip)
    assert isinstance(plain.text, str)
    usage = plain.usage
    assert usage is not None and usage.type == "tokens"
    assert usage.input_token_details is not None
    assert usage.input_token_details.audio_tokens == AUDIO_TOKENS_PER_WINDOW
    assert usage.input_tokens == (usage.input_token_details.audio_tokens
                                  + usage.input_token_details.text_tokens)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    verbose = client.audio.transcriptions.create(model=DEFAULT_MODEL, file=clip,
                                                 response_format="verbose_json",
                                                 language="en")
    assert verbose.duration == pytest.approx(1.0, abs=0.01)
    assert verbose.language == "en" and verbose.segments is not None
    [segment] = verbose.segments
    assert segment.start == 0 and segment.end == pytest.approx(1.0, abs=0.01)
    assert segment.text == verbose.text
    # A transcript ends within the bound its clip's duration sets, ended or not.
    assert len(segment.tokens) <= answer_bound_of(1.0)
    text = client.audio.transcriptions.create(model=DEFAULT_MODEL, file=clip,
                                              response_format="text")
    assert isinstance(text, str)
    translated = client.audio.translations.create(model=DEFAULT_MODEL, file=clip)
    assert isinstance(translated.text, str)


def test_streamed_transcription_events(client: openai.OpenAI) -> None:
    events = list(client.audio.transcriptions.create(
        model=DEFAULT_MODEL, file=("clip.wav", wav_bytes(1.0, seed=4)), stream=True,
        temperature=1.0))
    *deltas, done = events
    assert all(e.type == "transcript.text.delta" for e in deltas)
    assert done.type == "transcript.text.done"
    assert done.text == "".join(e.delta for e in deltas).strip()
    assert done.usage is not None and done.usage.input_token_details is not None
    assert done.usage.input_token_details.audio_tokens == AUDIO_TOKENS_PER_WINDOW


def test_responses_read_input_audio(client: openai.OpenAI) -> None:
    def tokens(seconds: float) -> int:
        response = client.responses.create(
            model=DEFAULT_MODEL, max_output_tokens=1, store=False,
            input=[{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": wav_b64(seconds, seed=5),
                                                        "format": "wav"}},
                {"type": "input_text", "text": "What is said?"}]}])  # type: ignore[list-item]
        assert response.usage is not None
        return response.usage.input_tokens

    assert tokens(31.0) - tokens(3.0) == AUDIO_TOKENS_PER_WINDOW


def _error(exc: pytest.ExceptionInfo[openai.BadRequestError]) -> dict[str, Any]:
    body = exc.value.body
    assert isinstance(body, dict)
    return body.get("error", body)


def test_bounds_and_bad_audio_are_refused_by_name(client: openai.OpenAI,
                                                  hearing: RunningServer) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        chat(client, audio_part(MAX_SECONDS + 5))
    assert _error(exc)["param"] == "messages[0].content[0].input_audio.data"
    assert _error(exc)["code"] == "audio_too_long"
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.transcriptions.create(model=DEFAULT_MODEL,
                                           file=("long.wav", wav_bytes(MAX_SECONDS + 5)))
    assert _error(exc)["param"] == "file" and _error(exc)["code"] == "audio_too_long"
    bad = [({"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}},
            "messages[0].content[0].input_audio.data"),
           ({"type": "input_audio", "input_audio": {
               "data": base64.b64encode(b"RIFF\x00\x00\x00\x00WAVEjunk").decode(),
               "format": "wav"}}, "messages[0].content[0].input_audio.data"),
           ({"type": "input_audio", "input_audio": {"data": wav_b64(1.0), "format": "mp3"}},
            "messages[0].content[0].input_audio.data"),
           ({"type": "input_audio", "input_audio": {"data": wav_b64(1.0), "format": "aiff"}},
            "messages[0].content[0].input_audio.format")]
    for part, param in bad:
        with pytest.raises(openai.BadRequestError) as exc:
            chat(client, part)
        assert _error(exc)["param"] == param, part
    with pytest.raises(openai.BadRequestError) as exc:
        chat(client, *[audio_part(0.5, seed=s) for s in range(5)])
    assert _error(exc)["code"] == "too_many_audio_clips"
    for extra, param in (({"response_format": "srt"}, "response_format"),
                         ({"include": ["logprobs"]}, "include"),
                         ({"timestamp_granularities": ["word"]}, "timestamp_granularities"),
                         ({"temperature": 1.5}, "temperature")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.audio.transcriptions.create(model=DEFAULT_MODEL, **extra,  # type: ignore[call-overload]
                                               file=("c.wav", wav_bytes(0.5)))
        assert _error(exc)["param"].startswith(param), extra
    r = httpx.post(f"{hearing.v1}/audio/transcriptions", timeout=30,
                   json={"model": DEFAULT_MODEL, "file": "x"})
    assert r.status_code == 400 and "multipart" in r.json()["error"]["message"]
    r = httpx.post(f"{hearing.v1}/audio/transcriptions", timeout=30,
                   data={"model": DEFAULT_MODEL})
    assert r.status_code == 400
    assert httpx.get(f"{hearing.base_url}/health").status_code == 200


def test_a_model_without_audio_refuses_it_naming_the_model(server: RunningServer) -> None:
    plain = openai.OpenAI(base_url=server.v1, api_key="unused", timeout=60, max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        plain.audio.transcriptions.create(model=DEFAULT_MODEL,
                                          file=("c.wav", wav_bytes(0.5)))
    assert _error(exc)["param"] == "model"
    assert DEFAULT_MODEL in _error(exc)["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        chat(plain, audio_part(0.5))
    assert _error(exc)["param"] == "messages[0].content[0].input_audio"
    assert DEFAULT_MODEL in _error(exc)["message"]
