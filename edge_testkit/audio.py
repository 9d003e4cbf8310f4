"""Audio for the audio-input tests: WAV clips made of seeded noise and tones, as bytes
and as base64, and the tiny audio projector's token count per 30-second window."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np

from edge_testkit.models.make_test_audio_projector import TOKENS_PER_WINDOW

AUDIO_TOKENS_PER_WINDOW = TOKENS_PER_WINDOW  # 750: each started 30 s of a clip


def wav_bytes(seconds: float, *, seed: int = 0, rate: int = 16_000, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV clip: a seeded tone under noise (different seeds, different
    clips)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    signal = 0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + 0.05 * rng.standard_normal(n)
    frames = (np.clip(signal, -1, 1) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.repeat(frames, channels).tobytes())
    return buf.getvalue()


def wav_b64(seconds: float, **kwargs: int) -> str:
    return base64.b64encode(wav_bytes(seconds, **kwargs)).decode()
