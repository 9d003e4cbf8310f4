"""The embedded model as served: its Q8_0 conversion, made once into the user's cache.

llama.cpp has no repacked or llamafile (sgemm) kernel for the packaged file's Q4_1 on x86;
its Q8_0 conversion decoded faster at 1, 4 and 8 clients and processed prompts about twice
as fast, at a mean KL divergence of 0.006 from the Q4_1 logits (README: The default
model). The packaged file is never touched: the conversion lives in
$XDG_CACHE_HOME/edge-server/default-model/, named by the source file's identity, so a
reinstalled or upgraded package converts again. Whatever goes wrong, the packaged file is
served instead, with one warning.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.metadata
import logging
import os
import time
from pathlib import Path

from .default_model import default_model_path

log = logging.getLogger(__name__)

# --default-model-quant: the conversion, or the packaged file as it is.
Q8_0, PACKAGED = "q8_0", "packaged"
_STEM = "SmolLM2-135M-Instruct.Q8_0"
_THREADS = 2  # the conversion takes about a second; leave other cores to what else starts


class ConversionError(RuntimeError):
    pass


def cache_dir() -> Path:
    """Shared by every server of the user, whatever its models directory."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge-server" / "default-model"


def served_default_model_path(quant: str = Q8_0) -> Path:
    """The file to serve for the embedded model: the Q8_0 conversion (made now if it is
    not there yet), the packaged file for `packaged` or where the conversion fails."""
    source = default_model_path()
    if quant == PACKAGED:
        return source
    try:
        return convert_q8_0(source, cache_dir())
    # Anything at all (a read-only or full disk, a llama.cpp without the symbol): the
    # packaged file still serves, so the server starts.
    except Exception as exc:
        log.warning("serving the packaged Q4_1 default model: its Q8_0 conversion failed "
                    "(%s: %s)", type(exc).__name__, exc)
        return source


def converted_name(source: Path) -> str:
    """Keyed by the source's size and mtime and by the llama.cpp that converts it."""
    stat = source.stat()
    version = importlib.metadata.version("llama-cpp-python")
    key = f"{stat.st_size}:{stat.st_mtime_ns}:{version}"
    return f"{_STEM}.{hashlib.sha256(key.encode()).hexdigest()[:12]}.gguf"


def convert_q8_0(source: Path, directory: Path) -> Path:
    """`source` converted to Q8_0 in `directory`, once: later calls, and other processes
    waiting on the lock meanwhile, find the file. Raises on failure."""
    import fcntl  # here: where it is missing (Windows), the packaged file serves

    target = directory / converted_name(source)
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():  # converted by another process while this one waited
            return target
        # Whoever holds the lock is the only writer: any partial file is a dead one's.
        for stale in directory.glob(".*.part"):
            stale.unlink(missing_ok=True)
        partial = directory / f".{target.name}.{os.getpid()}.part"
        try:
            started = time.monotonic()
            _quantize(source, partial)
            with open(partial, "rb") as written:  # on disk before it takes the final name
                os.fsync(written.fileno())
            os.replace(partial, target)
        finally:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
    log.info("converted the default model to Q8_0 in %.1f s: %s",
             time.monotonic() - started, target)
    return target


def _quantize(source: Path, out: Path) -> None:
    import llama_cpp as lc

    from .engine.backend.runtime import init_backend

    init_backend()  # llama.cpp's log routed to ours: no line per tensor on stderr
    params = lc.llama_model_quantize_default_params()
    params.ftype = lc.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True  # the source is quantized already (Q4_1)
    params.nthread = _THREADS
    code = lc.llama_model_quantize(str(source).encode(), str(out).encode(),
                                  ctypes.byref(params))
    if code != 0:
        raise ConversionError(f"llama_model_quantize returned {code} for {source}")
