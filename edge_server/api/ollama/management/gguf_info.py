"""What Ollama's /api/tags, /api/show and /api/ps tell of a model, read from its GGUF
file: details (format, family, parameter size, quantization level), model_info (the
file's scalar metadata) and the digest (the file's SHA-256).

Hashing a file takes seconds for large models, so digests (and headers) are computed
once per file version (path, size, modification time) and kept; callers run these off
the event loop.
"""

from __future__ import annotations

import logging
import math
import mmap
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from edge_server.catalogue.hub_download import sha256_of

log = logging.getLogger(__name__)

_LONG_ARRAY = 64  # arrays longer than this (the vocabulary) are shown only with verbose


@dataclass(frozen=True)
class GGUFInfo:
    details: dict[str, Any]
    model_info: dict[str, Any]  # scalars and short arrays
    long_keys: tuple[str, ...] = ()  # arrays of more than _LONG_ARRAY items
    chat_template: str | None = None


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


# GGUF value types (gguf.GGUFValueType): struct formats of the fixed-size ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Header:
    """Reads a GGUF header from a memory map: metadata and tensor shapes, skipping the
    elements of long arrays (the vocabulary) rather than decoding each one, so a header
    reads in milliseconds (gguf's GGUFReader builds an object per array element)."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.take("<Q")
        if size > len(self.data) - self.at:
            raise ValueError("a string runs past the end of the file")
        text = bytes(self.data[self.at:self.at + size]).decode("utf-8", "replace")
        self.at += size
        return text

    def value(self, kind: int, keep: bool = True) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item in _SCALARS and not (keep and count <= _LONG_ARRAY):
                self.at += struct.calcsize(_SCALARS[item]) * count  # skipped whole
                return None
            if item == _STRING and not (keep and count <= _LONG_ARRAY):
                for _ in range(count):  # each string's length, then past it
                    self.at += 8 + struct.unpack_from("<Q", self.data, self.at)[0]
                return None
            items = [self.value(item, keep and count <= _LONG_ARRAY) for _ in range(count)]
            return items if keep and count <= _LONG_ARRAY else None
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        value = self.take(_SCALARS[kind])
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)  # JSON has no NaN or infinity
        return value


def read_info(path: Path) -> GGUFInfo:
    info: dict[str, Any] = {}
    long_keys: list[str] = []
    parameters = 0
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        header = _Header(data)
        if bytes(data[:4]) != b"GGUF":
            raise ValueError("not a GGUF file")
        header.at = 4
        header.take("<I")  # version
        tensors, fields = header.take("<Q"), header.take("<Q")
        for _ in range(fields):
            key, kind = header.string(), header.take("<I")
            value = header.value(kind)
            if value is None:
                long_keys.append(key)
            else:
                info[key] = value
        for _ in range(tensors):
            header.string()  # name
            dims = [header.take("<Q") for _ in range(header.take("<I"))]
            header.take("<I")  # type
            header.take("<Q")  # offset
            parameters += math.prod(dims)
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
    return GGUFInfo(details, info, tuple(long_keys),
                    template if isinstance(template, str) else None)


def long_arrays(path: Path, keys: tuple[str, ...]) -> dict[str, list[Any]]:
    """The long arrays' values (`verbose`), through gguf's full reader."""
    reader = gguf.GGUFReader(str(path))
    out: dict[str, list[Any]] = {}
    for key in keys:
        field_ = reader.fields.get(key)
        if field_ is not None:
            value = field_.contents()
            out[key] = value if isinstance(value, list) else []
    return out


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

    def show_info(self, path: Path, verbose: bool) -> dict[str, Any]:
        """model_info as /api/show gives it: long arrays empty unless `verbose`."""
        info = self.info(path)
        if not verbose:
            return {**info.model_info, **{k: [] for k in info.long_keys}}
        return {**info.model_info, **long_arrays(path, info.long_keys)}

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
