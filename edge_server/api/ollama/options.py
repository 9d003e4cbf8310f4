"""Ollama's `options` onto the same samplers the OpenAI doors use, and `keep_alive`.

Every option some Ollama release accepts is accepted here and type-checked (a 400 naming
it, `options.top_p`, when its value is wrong); only a name no Ollama release knows is
refused. The sampling options and `num_ctx` / `num_predict` are applied; the ones about
Ollama's own runner (threads, batch, GPU layers, memory mapping, draft length) are set
once per server here, so one request's value cannot change them for the others sharing
the model: they are ignored, as are the ones llama.cpp dropped (IGNORED says why).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from edge_server.api.http.errors import from_validation_error, invalid
from edge_server.api.http.limits import INT32_MAX, check_stops

MAX_STOPS = 16

# Ollama's defaults (its Modelfile parameters), used where a request leaves one out.
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1,
            "repeat_last_n": 64}

# Accepted, checked and ignored: why each has no per-request effect here.
_PER_SERVER = "set once per server (%s), shared by every request on the model"
IGNORED = {
    "num_thread": _PER_SERVER % "--threads",
    "num_batch": _PER_SERVER % "the engine's batch",
    "num_gpu": _PER_SERVER % "--n-gpu-layers",
    "main_gpu": _PER_SERVER % "the backend's device",
    "use_mmap": _PER_SERVER % "the model's loader",
    "use_mlock": _PER_SERVER % "the model's loader",
    "numa": _PER_SERVER % "the backend",
    "low_vram": _PER_SERVER % "the backend",
    "f16_kv": _PER_SERVER % "--cache-type-k/-v",
    "logits_all": "logits are kept as each request needs them",
    "vocab_only": "a served model always has its weights",
    "embedding_only": "the embedding context is made when first needed",
    "rope_frequency_base": "read from the model's file",
    "rope_frequency_scale": "read from the model's file",
    "num_gqa": "read from the model's file",
    "draft_num_predict": _PER_SERVER % "--draft-max",
    "tfs_z": "tail-free sampling was removed from llama.cpp (and from Ollama)",
    "penalize_newline": "newlines are penalized as any token (Ollama dropped it too)",
}


class _Ignored(BaseModel):
    """The types Ollama reads the ignored options with: a wrong type is still a 400."""

    model_config = ConfigDict(extra="ignore")
    num_thread: int | None = Field(default=None, ge=0, le=INT32_MAX)
    num_batch: int | None = Field(default=None, ge=0, le=INT32_MAX)
    num_gpu: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    main_gpu: int | None = Field(default=None, ge=0, le=INT32_MAX)
    num_gqa: int | None = Field(default=None, ge=0, le=INT32_MAX)
    draft_num_predict: int | None = Field(default=None, ge=0, le=INT32_MAX)
    use_mmap: StrictBool | None = None
    use_mlock: StrictBool | None = None
    numa: StrictBool | None = None
    low_vram: StrictBool | None = None
    f16_kv: StrictBool | None = None
    logits_all: StrictBool | None = None
    vocab_only: StrictBool | None = None
    embedding_only: StrictBool | None = None
    penalize_newline: StrictBool | None = None
    rope_frequency_base: float | None = Field(default=None, ge=0.0)
    rope_frequency_scale: float | None = Field(default=None, ge=0.0)
    tfs_z: float | None = Field(default=None, ge=0.0)


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
    num_keep: int | None = None  # prompt tokens a cut to fit the context keeps first
    # num_predict given at all (-1 and -2 too): the caller bounded the answer, or chose not to
    predict_given: bool = False


def _validated(model: type[BaseModel], given: dict[str, Any]) -> Any:
    try:
        return model.model_validate(given)
    except ValidationError as exc:
        error = from_validation_error(exc)
        error.param = f"options.{error.param}"
        error.message = error.message.replace("`", "`options.", 1)
        raise error from exc


def _checked(options: dict[str, Any]) -> _Options:
    given = {k: v for k, v in options.items() if v is not None}
    for name, value in given.items():
        if name not in _Options.model_fields and name not in IGNORED:
            raise invalid(f"options.{name}", f"`options.{name}` is not an option Ollama "
                          "knows", "unknown_parameter")
        if isinstance(value, str) and name != "stop":  # Ollama reads no option from text
            raise invalid(f"options.{name}", f"`options.{name}` must be a number or a "
                          "boolean, not a string")
    _validated(_Ignored, {k: v for k, v in given.items() if k in IGNORED})
    result: _Options = _validated(_Options, {k: v for k, v in given.items()
                                             if k not in IGNORED})
    return result


def check(options: dict[str, Any] | None) -> int | None:
    """Options of a request that samples nothing (embeddings): all checked, `num_ctx`
    (the longest input, in tokens) returned, the rest meaningless there."""
    return _checked(options or {}).num_ctx


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
                    value.get("num_ctx"), value["repeat_last_n"], value.get("stop") or [],
                    value.get("num_keep"), predict is not None)


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
