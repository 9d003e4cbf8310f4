"""Schemas of POST /v1/audio/transcriptions and /v1/audio/translations (OpenAI's shape:
multipart/form-data in, JSON, text or server-sent events out)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Task = Literal["transcribe", "translate"]


class TranscriptionRequest(BaseModel):
    """The form's fields; `file` is the clip (wav, mp3, flac or ogg vorbis)."""

    model_config = ConfigDict(extra="forbid")
    file: bytes = Field(json_schema_extra={"format": "binary"})
    model: str = Field(min_length=1, max_length=256)
    # ISO-639-1 (or -3) code of the clip's language: said to the model, never detected.
    language: str | None = Field(default=None, pattern=r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})?$")
    # Earlier text or spellings to follow (OpenAI's `prompt`); given to the model.
    prompt: str | None = Field(default=None, max_length=8192)
    response_format: Literal["json", "text", "verbose_json"] = "json"
    temperature: float = Field(default=0.0, ge=0.0, le=1.0)
    stream: bool = False
    # verbose_json's segments are the one granularity served ("word" needs timestamps).
    timestamp_granularities: list[Literal["segment"]] = Field(default_factory=list,
                                                              max_length=2)


class TokenUsageDetails(BaseModel):
    text_tokens: int
    audio_tokens: int


class TranscriptionTokenUsage(BaseModel):
    type: Literal["tokens"] = "tokens"
    input_tokens: int
    input_token_details: TokenUsageDetails
    output_tokens: int
    total_tokens: int


class TranscriptionDurationUsage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: float


class Transcription(BaseModel):
    text: str
    usage: TranscriptionTokenUsage | None = None


class TranscriptionSegment(BaseModel):
    """The whole clip as one segment: the model writes no timestamps of its own."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float  # not estimated: always 0


class TranscriptionVerbose(BaseModel):
    task: Task
    language: str
    duration: float
    text: str
    segments: list[TranscriptionSegment]
    usage: TranscriptionDurationUsage
