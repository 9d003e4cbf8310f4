"""Fuzzing the audio doors through the real server, under a small box's address space:
WAV files with their header fields at the edges (channels, sample rate, sizes), cut,
bit-flipped, or other bytes behind each format's magic, sent as chat `input_audio` parts
and as transcription uploads with form fields at their edges. Every answer must be a 200
or a 4xx in OpenAI's error shape within the time limit, and the server must serve
normally afterwards: miniaudio's decoders and mtmd never see what they could crash on."""

from __future__ import annotations

import base64
import os
import struct
from collections.abc import Iterator

import httpx
import pytest
from conftest import (
    DEFAULT_MODEL,
    THREADS_ENV,
    RunningServer,
    start_server,
    stop_server,
    write_test_audio_projector,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from edge_testkit.audio import wav_bytes

MEMORY_LIMIT_MB = 3072
TIMEOUT_S = 60.0
fuzz_settings = settings(deadline=None, derandomize=True, database=None,
                         phases=(Phase.explicit, Phase.generate),
                         suppress_health_check=list(HealthCheck), max_examples=40)
BASE = wav_bytes(0.3, seed=9)
# (offset, struct format) of the canonical 44-byte header's fields.
HEADER_FIELDS = [(4, "<I"), (16, "<I"), (20, "<H"), (22, "<H"), (24, "<I"), (28, "<I"),
                 (32, "<H"), (34, "<H"), (40, "<I")]
EDGES = [0, 1, 2, 3, 7, 8, 16, 24, 32, 64, 7_999, 8_000, 192_000, 192_001, 0xFFFF,
         0x7FFFFFFF, 0xFFFFFFFF]
MAGIC = [b"RIFF\xff\xff\xff\xffWAVEfmt ", b"ID3\x04\x00\x00\x7f\x7f\x7f\x7f", b"\xff\xfb\x90\x00",
         b"fLaC\x00\x00\x00\x22", b"OggS\x00\x02"]


@pytest.fixture(scope="module")
def hearing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("fuzz-audio")
    projector = write_test_audio_projector(tmp / "a.gguf")
    server = start_server(tmp, "--mmproj", str(projector), "--ctx-size", "2048",
                          "--parallel", "2", "--max-audio-seconds", "5",
                          "--threads", os.environ.get(THREADS_ENV, "1"),
                          name="fuzz-audio", memory_limit_mb=MEMORY_LIMIT_MB)
    yield server
    stop_server(server)


@st.composite
def clips(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["field", "cut", "flip", "magic"]))
    data = bytearray(BASE)
    if kind == "field":
        for _ in range(draw(st.integers(1, 3))):
            offset, fmt = draw(st.sampled_from(HEADER_FIELDS))
            limit = 0xFFFF if fmt == "<H" else 0xFFFFFFFF
            value = min(draw(st.sampled_from(EDGES)), limit)
            struct.pack_into(fmt, data, offset, value)
    elif kind == "cut":
        data = data[:draw(st.integers(0, len(data)))]
    elif kind == "flip":
        for _ in range(draw(st.integers(1, 16))):
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
    else:
        data = bytearray(draw(st.sampled_from(MAGIC)) + draw(st.binary(max_size=512)))
    return bytes(data)


FORM_EDGES = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from(["0", "1", "1.0000001", "-0", "-1", "nan", "inf",
                                    "1e309", "x"]),
    "response_format": st.sampled_from(["json", "text", "verbose_json", "srt", "", "JSON"]),
    "stream": st.sampled_from(["true", "false", "1", "maybe"]),
    "language": st.sampled_from(["en", "", "english", "x" * 300, "zh-Hant"]),
    "prompt": st.sampled_from(["", "spell it Ada", "\ud7ff" * 10, "p" * 9000]),
})


def _judge(response: httpx.Response) -> str | None:
    if response.status_code == 200:
        return None
    if response.status_code not in (400, 413, 429, 503):
        return f"HTTP {response.status_code}"
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return "an error not in OpenAI's shape"
    return None if isinstance(error.get("message"), str) else "an error without a message"


@fuzz_settings
@given(clip=clips(), via=st.sampled_from(["chat", "transcription"]), form=FORM_EDGES)
def test_fuzz_audio(hearing: RunningServer, clip: bytes, via: str,
                    form: dict[str, str]) -> None:
    with httpx.Client(timeout=TIMEOUT_S) as client:
        if via == "chat":
            part = {"type": "input_audio", "input_audio": {
                "data": base64.b64encode(clip).decode(), "format": "wav"}}
            response = client.post(f"{hearing.v1}/chat/completions", json={
                "model": DEFAULT_MODEL, "max_tokens": 2,
                "messages": [{"role": "user", "content": [part]}]})
        else:
            response = client.post(f"{hearing.v1}/audio/transcriptions",
                                   data={"model": DEFAULT_MODEL, **form},
                                   files={"file": ("clip.wav", clip)})
    problem = _judge(response)
    if problem is not None:
        code = hearing.process.poll()
        state = "" if code is None else f" (the server exited with {code})"
        pytest.fail(f"{problem}{state}: {via} {form} clip {clip[:48]!r}…\n"
                    f"answer: {response.text[:300]!r}", pytrace=False)


def test_server_serves_after_fuzzing(hearing: RunningServer) -> None:
    assert httpx.get(f"{hearing.base_url}/health", timeout=30).status_code == 200
    with httpx.Client(timeout=TIMEOUT_S) as client:
        ok = client.post(f"{hearing.v1}/audio/transcriptions", data={"model": DEFAULT_MODEL},
                         files={"file": ("clip.wav", BASE)})
    assert ok.status_code == 200, ok.text
    log = hearing.log_text()
    assert "Traceback" not in log, log[log.index("Traceback"):][:3000]
