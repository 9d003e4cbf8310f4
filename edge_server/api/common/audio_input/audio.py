"""Audio clips in requests (chat and Responses `input_audio` parts, transcription
uploads) decoded and checked in Python with miniaudio before anything reaches llama.cpp.

Every bound is checked before the work it bounds: the base64 text's length before it is
decoded, the file's header (format, sample rate, channels, duration) before its samples
are. What passes reaches the engine as mono float32 samples at the projector's sample
rate, so llama.cpp's own audio decoders never parse a client's bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from typing import Any

import miniaudio

from edge_server.api.http.errors import invalid
from edge_server.engine.multimodal.audio import AudioLimits, PcmAudio

# Formats read, by the name a client gives (OpenAI's `format`: wav, mp3) and the
# header that identifies them.
_INFO: dict[str, Callable[[bytes], miniaudio.SoundFileInfo]] = {
    "wav": miniaudio.wav_get_info,
    "mp3": miniaudio.mp3_get_info,
    "flac": miniaudio.flac_get_info,
    "ogg": miniaudio.vorbis_get_info,
}
FORMATS = tuple(_INFO)
_MIN_SECONDS = 0.01


def sniff_format(data: bytes) -> str | None:
    """The container a file's first bytes say it is, or None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def decode_audio_part(part: Any, limits: AudioLimits, sample_rate: int,
                      param: str) -> PcmAudio:
    """An `input_audio` object ({"data": base64, "format": "wav"}) into checked samples;
    a 400 naming `param` (or its fields) for anything else."""
    if not isinstance(part, dict):
        raise invalid(param, "expected {\"data\": base64 audio, \"format\": \"wav\"}")
    fmt, data = part.get("format"), part.get("data")
    if fmt is not None and fmt not in _INFO:
        raise invalid(f"{param}.format", f"format must be one of {', '.join(FORMATS)}",
                      "invalid_audio_format")
    if not isinstance(data, str) or not data:
        raise invalid(f"{param}.data", "expected the clip as base64 text")
    if data[:5].lower() == "data:":  # a data URL where bare base64 belongs: take its payload
        data = data.partition(",")[2]
    if len(data) > (limits.max_bytes * 4) // 3 + 4:
        raise invalid(f"{param}.data", f"the clip is larger than {limits.max_bytes >> 20} MiB",
                      "audio_too_large")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(f"{param}.data", "the audio data is not valid base64",
                      "invalid_audio") from exc
    return decode_audio_bytes(raw, fmt, limits, sample_rate, f"{param}.data")


def decode_audio_bytes(raw: bytes, fmt: str | None, limits: AudioLimits, sample_rate: int,
                       param: str) -> PcmAudio:
    """A clip's file (wav, mp3, flac, ogg vorbis) into mono float32 samples at
    `sample_rate` Hz, its header checked against `limits` first."""
    if not raw:
        raise invalid(param, "the clip is empty", "invalid_audio")
    if len(raw) > limits.max_bytes:
        raise invalid(param, f"the clip is larger than {limits.max_bytes >> 20} MiB",
                      "audio_too_large")
    found = sniff_format(raw)
    if found is None:
        raise invalid(param, f"not audio in a supported format ({', '.join(FORMATS)})",
                      "invalid_audio")
    if fmt is not None and found != fmt:
        raise invalid(param, f"the clip is {found}, not {fmt} as its format says",
                      "invalid_audio")
    try:
        info = _INFO[found](raw)
    except miniaudio.MiniaudioError as exc:
        raise invalid(param, f"the {found} data is corrupt or truncated",
                      "invalid_audio") from exc
    _check_header(info, limits, param)
    try:
        decoded = miniaudio.decode(raw, output_format=miniaudio.SampleFormat.FLOAT32,
                                   nchannels=1, sample_rate=sample_rate)
    except miniaudio.MiniaudioError as exc:
        raise invalid(param, f"the {found} data is corrupt or truncated",
                      "invalid_audio") from exc
    samples = decoded.samples.tobytes()
    if len(samples) // 4 < _MIN_SECONDS * sample_rate:
        raise invalid(param, "the clip holds no audio", "invalid_audio")
    # Decoders may run past what the header declared; never past the bound.
    samples = samples[:int(limits.max_seconds * sample_rate) * 4]
    return PcmAudio(samples, sample_rate, hashlib.sha256(raw).hexdigest())


def _check_header(info: miniaudio.SoundFileInfo, limits: AudioLimits, param: str) -> None:
    if not limits.min_sample_rate <= info.sample_rate <= limits.max_sample_rate:
        raise invalid(param, f"the clip's sample rate is {info.sample_rate} Hz; "
                      f"{limits.min_sample_rate}-{limits.max_sample_rate} Hz are accepted",
                      "invalid_audio")
    if not 1 <= info.nchannels <= limits.max_channels:
        raise invalid(param, f"the clip has {info.nchannels} channels; at most "
                      f"{limits.max_channels} are accepted", "invalid_audio")
    if info.num_frames <= 0:
        raise invalid(param, "the clip holds no audio", "invalid_audio")
    if info.duration > limits.max_seconds:
        raise invalid(param, f"the clip is {info.duration:.1f} s long; at most "
                      f"{limits.max_seconds:g} s are accepted", "audio_too_long")


def check_clip_count(count: int, limits: AudioLimits, param: str) -> None:
    if count > limits.max_clips:
        raise invalid(param, f"{count} audio clips; at most {limits.max_clips} per request",
                      "too_many_audio_clips")
