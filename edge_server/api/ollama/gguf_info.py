"""What Ollama's /api/tags, /api/show and /api/ps tell of a model, read from its GGUF
file: details (format, family, parameter size, quantization level), model_info (the
file's scalar metadata) and the digest (the file's SHA-256).

Reading a header and hashing a file take seconds for large models, so each is done
once per file version (path, size, modification time) and kept; callers run these off
the event loop.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

from ...model_store import sha256_of

log = logging.getLogger(__name__)

_LONG_ARRAY = 64  # arrays longer than this (the vocabulary) are shown only with verbose


@dataclass(frozen=True)
class GGUFInfo:
    details: dict[str, Any]
    model_info: dict[str, Any]
    long_arrays: dict[str, list[Any]] = field(default_factory=dict)
    chat_template: str | None = None

    def show_info(self, verbose: bool) -> dict[str, Any]:
        if verbose:
            return {**self.model_info, **self.long_arrays}
        return {**self.model_info, **{k: [] for k in self.long_arrays}}


def _size_label(parameters: int) -> str:
    """Ollama's parameter_size: 135M, 8.0B."""
    if parameters >= 10**9:
        return f"{parameters / 10**9:.1f}B"
    if parameters >= 10**6:
        return f"{parameters / 10**6:.0f}M"
    return f"{parameters / 10**3:.0f}K"


def _quantization(file_type: int | None) -> str:
    try:
        name = gguf.LlamaFileType(file_type).name if file_type is not None else "unknown"
    except ValueError:
        return "unknown"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _value(reader_field: Any) -> Any:
    value = reader_field.contents()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or infinity
    return value


def read_info(path: Path) -> GGUFInfo:
    reader = gguf.GGUFReader(str(path))
    info: dict[str, Any] = {}
    arrays: dict[str, list[Any]] = {}
    for key, item in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            value = _value(item)
        except (ValueError, TypeError, UnicodeDecodeError):
            continue
        if isinstance(value, list) and len(value) > _LONG_ARRAY:
            arrays[key] = value
        else:
            info[key] = value
    parameters = sum(int(t.n_elements) for t in reader.tensors)
    info["general.parameter_count"] = parameters
    architecture = str(info.get("general.architecture", "unknown"))
    file_type = info.get("general.file_type")
    details = {
        "parent_model": "",
        "format": "gguf",
        "family": architecture,
        "families": [architecture],
        "parameter_size": _size_label(parameters),
        "quantization_level": _quantization(file_type if isinstance(file_type, int) else None),
    }
    template = info.get("tokenizer.chat_template")
    return GGUFInfo(details, info, arrays, template if isinstance(template, str) else None)


class FileFacts:
    """GGUF information and digests, kept per file version."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._info: dict[tuple[str, int, int], GGUFInfo] = {}
        self._digests: dict[tuple[str, int, int], str] = {}

    @staticmethod
    def _key(path: Path) -> tuple[str, int, int]:
        stat = path.stat()
        return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)

    def info(self, path: Path) -> GGUFInfo:
        key = self._key(path)
        with self._lock:
            known = self._info.get(key)
        if known is None:
            try:
                known = read_info(path)
            except Exception as exc:  # a truncated or foreign file: listed, never a 500
                log.warning("could not read the GGUF header of %s: %s", path.name, exc)
                known = GGUFInfo({"parent_model": "", "format": "gguf", "family": "unknown",
                                  "families": None, "parameter_size": "unknown",
                                  "quantization_level": "unknown"}, {})
            with self._lock:
                self._info[key] = known
        return known

    def digest(self, path: Path) -> str:
        key = self._key(path)
        with self._lock:
            known = self._digests.get(key)
        if known is None:
            known = sha256_of(path)
            with self._lock:
                self._digests[key] = known
        return known


FACTS = FileFacts()
