"""The metadata of a GGUF file's header, read without llama.cpp: what the model pool needs
to know of a model before it loads it (its shape, for the memory it will take).

Scalars are decoded; of arrays only the length is kept, with the values of short
numeric ones (a per-layer head count). The vocabulary's strings are stepped over, not
decoded, so a 262k-token header reads in well under a second.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

# GGUF value types: struct formats of the fixed-size ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_SHORT_ARRAY = 4096  # numeric arrays up to this long keep their values
_MAX_KEYS = 1 << 16


class GGUFHeader:
    """`values`: scalars (and short numeric arrays, as tuples) by key; `lengths`: the
    length of every array."""

    def __init__(self, path: Path) -> None:
        self.values: dict[str, object] = {}
        self.lengths: dict[str, int] = {}
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            self._data, self._at = data, 0
            try:
                self._read()
            except (struct.error, UnicodeDecodeError, IndexError) as exc:
                raise ValueError(f"not a readable GGUF header: {exc}") from exc
            finally:
                del self._data

    def _take(self, fmt: str) -> object:
        (value,) = struct.unpack_from(fmt, self._data, self._at)
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        size = int(self._take("<Q"))  # type: ignore[call-overload]
        if size > len(self._data) - self._at:
            raise ValueError("a string runs past the end of the file")
        text = bytes(self._data[self._at:self._at + size]).decode("utf-8")
        self._at += size
        return text

    def _read(self) -> None:
        if bytes(self._data[:4]) != b"GGUF":
            raise ValueError("not a GGUF file")
        self._at = 4
        if self._take("<I") not in (2, 3):
            raise ValueError("unsupported GGUF version")
        self._take("<Q")  # tensor count
        n_keys = int(self._take("<Q"))  # type: ignore[call-overload]
        if n_keys > _MAX_KEYS:
            raise ValueError("implausibly many metadata keys")
        for _ in range(n_keys):
            key = self._string()
            kind = int(self._take("<I"))  # type: ignore[call-overload]
            if kind == _ARRAY:
                self._array(key)
            else:
                self.values[key] = self._value(kind)

    def _value(self, kind: int) -> object:
        if kind == _STRING:
            return self._string()
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        return self._take(_SCALARS[kind])

    def _array(self, key: str) -> None:
        kind = int(self._take("<I"))  # type: ignore[call-overload]
        count = int(self._take("<Q"))  # type: ignore[call-overload]
        self.lengths[key] = count
        if kind == _STRING:
            data, at = self._data, self._at
            for _ in range(count):  # stepped over: each is a length and its bytes
                at += 8 + int.from_bytes(data[at:at + 8], "little")
            if at > len(data):
                raise ValueError("an array runs past the end of the file")
            self._at = at
        elif kind in _SCALARS:
            size = struct.calcsize(_SCALARS[kind])
            if count <= _SHORT_ARRAY:
                self.values[key] = struct.unpack_from(f"<{count}{_SCALARS[kind][1]}",
                                                      self._data, self._at)
            self._at += size * count
            if self._at > len(self._data):
                raise ValueError("an array runs past the end of the file")
        else:
            raise ValueError(f"unsupported GGUF array type {kind}")

    def number(self, key: str, default: int = 0) -> int:
        """An integer key (the largest entry of a per-layer array); `default` if absent."""
        value = self.values.get(key, default)
        if isinstance(value, tuple):
            value = max(value, default=default)
        return int(value) if isinstance(value, int | float) else default
