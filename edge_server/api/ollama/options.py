"""Ollama's `options` onto the same samplers the OpenAI doors use, and `keep_alive`.

Each option is honoured or refused with a 400 naming it (`options.tfs_z`). Options the
server sets at start (threads, GPU layers, batch size, memory mapping) are refused rather
than ignored: one request cannot change them for the others sharing the model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..http.errors import from_validation_error, invalid, unsupported
from ..http.limits import INT32_MAX, check_stops

MAX_STOPS = 16

# Ollama's defaults (its Modelfile parameters), used where a request leaves one out.
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1,
            "repeat_last_n": 64}

_SET_AT_START = {
    "numa": "--threads", "num_batch": "the server", "num_gpu": "--n-gpu-layers",
    "main_gpu": "the server", "low_vram": "the server", "f16_kv": "the server",
    "logits_all": "the server", "vocab_only": "the server", "use_mmap": "the server",
    "use_mlock": "the server", "embedding_only": "the server", "num_thread": "--threads",
}
_REMOVED = {
    "tfs_z": "tail-free sampling was removed from llama.cpp",
    "penalize_newline": "newlines are penalized as any token here (Ollama dropped it too)",
}


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_predict: int | None = Field(default=None, ge=-2, le=INT32_MAX)
    num_ctx: int | None = Field(default=None, ge=1, le=INT32_MAX)
    num_keep: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    typical_p: float | None = Field(default=None, gt=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0, lt=2.0)
    repeat_last_n: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    mirostat: int | None = Field(default=None, ge=0, le=2)
    mirostat_tau: float | None = Field(default=None, gt=0.0, le=100.0)
    mirostat_eta: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stop: list[str] | None = Field(default=None, max_length=MAX_STOPS)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        return check_stops(v)

    @field_validator("num_predict")
    @classmethod
    def _predict(cls, v: int | None) -> int | None:
        if v == 0:
            raise ValueError("must be -1 (until done), -2 (fill the context) or at least 1")
        return v


@dataclass
class Sampling:
    """What the options ask of one generation."""

    chat_fields: dict[str, Any] = field(default_factory=dict)  # SamplingRequest fields
    engine_fields: dict[str, Any] = field(default_factory=dict)  # SamplingParams-only
    num_predict: int | None = None  # None: until the model ends or the context is full
    num_ctx: int | None = None
    repeat_last_n: int = -1  # -1: the whole context (held to the model's by the caller)
    stop: list[str] = field(default_factory=list)


def _checked(options: dict[str, Any]) -> _Options:
    given = {k: v for k, v in options.items() if v is not None}
    for name in given:
        if name in _SET_AT_START:
            raise unsupported(f"options.{name}", f"is set when the server starts "
                              f"({_SET_AT_START[name]}), not per request")
        if name in _REMOVED:
            raise unsupported(f"options.{name}", f"is not supported: {_REMOVED[name]}")
        if name not in _Options.model_fields:
            raise invalid(f"options.{name}", f"`options.{name}` is not an option this "
                          "server knows", "unknown_parameter")
    try:
        return _Options.model_validate(given)
    except ValidationError as exc:
        error = from_validation_error(exc)
        error.param = f"options.{error.param}"
        error.message = error.message.replace("`", "`options.", 1)
        raise error from exc


def sampling(options: dict[str, Any] | None) -> Sampling:
    opts = _checked(options or {})
    value = {**DEFAULTS, **opts.model_dump(exclude_none=True)}
    seed = value.get("seed")
    chat: dict[str, Any] = {
        "temperature": value["temperature"],
        "top_k": value["top_k"] or None,  # 0: off
        "top_p": value["top_p"] or None,
        "min_p": value.get("min_p"),
        "seed": seed,  # below 0: a fresh seed, as Ollama reads -1
        "presence_penalty": value.get("presence_penalty"),
        "frequency_penalty": value.get("frequency_penalty"),
        "repetition_penalty": value["repeat_penalty"],
    }
    engine: dict[str, Any] = {}
    if value.get("typical_p") is not None:
        engine["typical_p"] = value["typical_p"]
    if value.get("mirostat"):
        # Ollama's defaults for tau and eta; the options are read only with mirostat on.
        chat["mirostat_target"] = value.get("mirostat_tau", 5.0)
        chat["mirostat_lr"] = value.get("mirostat_eta", 0.1)
        engine["mirostat_version"] = value["mirostat"]
    predict = value.get("num_predict")
    return Sampling(chat, engine, None if predict is None or predict < 0 else predict,
                    value.get("num_ctx"), value["repeat_last_n"], value.get("stop") or [])


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                 "h": 3600.0}
_MAX_KEEP_S = 10 * 365 * 86400.0


def keep_alive_seconds(value: float | str | None, param: str = "keep_alive") -> float | None:
    """Seconds the model stays loaded after the request: Ollama reads numbers as seconds
    and strings as Go durations ("5m", "1h30m"); negative keeps it loaded for good (-1
    here), 0 unloads it as soon as the request is done. None: the server's default."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            sign = -1.0 if text.startswith("-") else 1.0
            body = text.lstrip("+-")
            parts = _DURATION.findall(body)
            if not body or "".join(a + u for a, u in parts) != body:
                raise invalid(param, f"`{param}` must be seconds or a duration such as "
                              "\"5m\" or \"1h30m\"") from None
            seconds = sign * sum(float(a) * _UNIT_SECONDS[u] for a, u in parts)
    else:
        seconds = float(value)
    if math.isnan(seconds):
        raise invalid(param, f"`{param}` must be a number of seconds or a duration")
    if seconds < 0:
        return -1.0
    return min(seconds, _MAX_KEEP_S)
