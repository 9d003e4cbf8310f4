"""Audio as the engine takes it: mono float32 samples at the projector's sample rate,
decoded, mixed down, resampled and bounded in Python before llama.cpp sees them (the
API layer's audio_input does that), and the bounds themselves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AudioLimits:
    max_clips: int = 4  # per request
    max_bytes: int = 25 << 20  # one clip's file, after base64 decoding (OpenAI's limit)
    max_seconds: float = 120.0  # one clip's duration
    min_sample_rate: int = 8_000  # of the file as sent; resampled to the projector's
    max_sample_rate: int = 192_000
    max_channels: int = 8  # mixed down to one


@dataclass(frozen=True)
class PcmAudio:
    samples: bytes  # float32 native-endian, mono, at `sample_rate`
    sample_rate: int
    digest: str  # sha256 of the bytes the client sent

    @property
    def n_samples(self) -> int:
        return len(self.samples) // 4

    @property
    def seconds(self) -> float:
        return self.n_samples / self.sample_rate
