"""llama.cpp's process-wide state: its backends, initialised once, and its log routed
to ours. Below the model and the RPC modules, which both need it."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import threading
from collections.abc import Iterator

import llama_cpp as lc

_backend_ready = False
_llama_log = logging.getLogger("llama.cpp")
_LEVEL_INFO, _LEVEL_WARN, _LEVEL_ERROR = 2, 3, 4  # ggml_log_level
# With RPC servers, where llama.cpp put weights, KV cache and compute buffers is worth
# a line per device in our log ("RPC0 model buffer size = ... MiB").
_log_buffer_sizes = False
# "llama_kv_cache: CPU KV buffer size = 384.00 MiB": what each buffer llama.cpp allocates
# holds, read from its log on the thread that loads (see recording_buffers). A weights
# buffer named "..._Mapped" is the model file memory-mapped, not a copy.
_BUFFER_LINE = re.compile(
    rb"(\S+)\s+(model|KV|RS|compute|output) buffer size\s*=\s*([0-9.]+) MiB")
_BUFFER_KIND = {b"model": "weights", b"KV": "kv_cache", b"RS": "kv_cache",
                b"compute": "compute", b"output": "compute"}
# "load_tensors: CPU_REPACK model buffer size = 12.66 MiB": weights in a repacked layout
# (AMX tiles, CPU_REPACK, KleidiAI), also counted as `repacked` (cpu_kernels.py).
_REPACKED_LINE = re.compile(rb"\b(AMX|\w*REPACK\w*|\w*KLEIDIAI\w*) model buffer size\s*=\s*"
                            rb"([0-9.]+) MiB")
_recorder = threading.local()


@lc.llama_log_callback
def forward_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # llama.cpp narrates every load at INFO on stderr; keep only its warnings and errors.
    if level in (_LEVEL_WARN, _LEVEL_ERROR):
        message = text.decode("utf-8", errors="replace").rstrip()
        if message:
            _llama_log.log(logging.ERROR if level == _LEVEL_ERROR else logging.WARNING, message)
    elif level == _LEVEL_INFO and b"buffer size" in text:
        sizes = getattr(_recorder, "sizes", None)
        found = _BUFFER_LINE.search(text)
        if sizes is not None and found:
            name, kind = found.group(1), _BUFFER_KIND[found.group(2)]
            size = int(float(found.group(3)) * 2**20)
            sizes[kind] = sizes.get(kind, 0) + size
            if kind == "weights" and name.endswith(b"_Mapped"):
                sizes["weights_mapped"] = sizes.get("weights_mapped", 0) + size
            repacked = _REPACKED_LINE.search(text)
            if repacked:
                size = int(float(repacked.group(2)) * 2**20)
                sizes["repacked"] = sizes.get("repacked", 0) + size
        if _log_buffer_sizes:
            _llama_log.info(" ".join(text.decode("utf-8", errors="replace").split()))


@contextlib.contextmanager
def recording_buffers() -> Iterator[dict[str, int]]:
    """Bytes of the buffers llama.cpp allocates on this thread meanwhile, by what they
    hold: `weights` (of which `weights_mapped` is the mapped file and `repacked` the part
    in a repacked layout), `kv_cache`, `compute` (for the memory account and the model
    pool's budget)."""
    sizes: dict[str, int] = {}
    _recorder.sizes = sizes
    try:
        yield sizes
    finally:
        _recorder.sizes = None


def init_backend() -> None:
    """Initialise llama.cpp's backends once per process, with its log routed to ours."""
    global _backend_ready
    if not _backend_ready:
        lc.llama_log_set(forward_llama_log, ctypes.c_void_p(0))
        lc.llama_backend_init()
        _backend_ready = True


def log_buffer_sizes() -> None:
    """From now on, log where llama.cpp puts each buffer (wanted once RPC devices exist)."""
    global _log_buffer_sizes
    _log_buffer_sizes = True
