"""The tensor table of a GGUF file (name, ggml type, shape), read from its header alone.

The metadata before it is skipped value by value without decoding (a 262k-token
vocabulary included), so the table reads in milliseconds; gguf's GGUFReader builds an
object per array element and takes seconds for the same file.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# Sizes of GGUF's fixed-size value types (gguf.GGUFValueType), by type id.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int  # a GGML_TYPE_* id
    shape: tuple[int, ...]  # ne[0], ne[1], ...: ne[0] is the row length


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def skip_string(self) -> None:
        self.at += 8 + self.take("<Q")

    def string(self) -> str:
        size = self.take("<Q")
        text = bytes(self.data[self.at:self.at + size]).decode("utf-8", "replace")
        self.at += size
        return text

    def skip_value(self, kind: int) -> None:
        if kind == _STRING:
            self.skip_string()
        elif kind == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item in _FIXED:
                self.at += _FIXED[item] * count
            else:
                for _ in range(count):
                    self.skip_value(item)
        elif kind in _FIXED:
            self.at += _FIXED[kind]
        else:
            raise ValueError(f"unknown GGUF value type {kind}")


def read_tensors(path: Path) -> list[TensorInfo]:
    """Raises ValueError (or OSError) for a file that is not a readable GGUF."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if bytes(data[:4]) != b"GGUF":
            raise ValueError("not a GGUF file")
        cursor = _Cursor(data)
        cursor.at = 8  # magic, version
        n_tensors, n_fields = cursor.take("<Q"), cursor.take("<Q")
        try:
            for _ in range(n_fields):
                cursor.skip_string()
                cursor.skip_value(cursor.take("<I"))
            tensors = []
            for _ in range(n_tensors):
                name = cursor.string()
                shape = tuple(cursor.take("<Q") for _ in range(cursor.take("<I")))
                ggml_type = cursor.take("<I")
                cursor.take("<Q")  # offset into the data section
                tensors.append(TensorInfo(name, ggml_type, shape))
        except struct.error as exc:
            raise ValueError("the GGUF header runs past the end of the file") from exc
    return tensors
