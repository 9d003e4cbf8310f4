"""The embedded model as served: the packaged Q4_1 file or its Q8_0 conversion, whichever
runs faster on this machine's kernels, measured once.

llama.cpp has no repacked or llamafile (sgemm) kernel for the packaged file's Q4_1 on x86,
while its sgemm kernels take Q8_0 prompts; but with plain kernels a Q4_1 token reads half
the bytes of a Q8_0 one. Which wins depends on the CPU (docs/models.md: The default model), so by
default (`auto`) both files are timed once on the kernel path each loads with
(engine/backend/file_speed.py) and the choice is kept next to the conversion, keyed by
the llama.cpp build, the CPU and the packaged file. The Q8_0 conversion stays within a
mean KL divergence of 0.006 from the Q4_1 logits. The packaged file is never touched:
the conversion lives in $XDG_CACHE_HOME/edge-server/default-model/, named by the source
file's identity, so a reinstalled or upgraded package converts (and measures) again.
Whatever goes wrong, a file still serves, with one warning.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.metadata
import json
import logging
import os
import time
from pathlib import Path

from edge_server.catalogue.default_model import default_model_path

log = logging.getLogger(__name__)

# --default-model-quant: whichever is faster here, the conversion, or the packaged file.
AUTO, Q8_0, PACKAGED = "auto", "q8_0", "packaged"
_STEM = "SmolLM2-135M-Instruct.Q8_0"
_THREADS = 2  # the conversion takes about a second; leave other cores to what else starts


class ConversionError(RuntimeError):
    pass


def cache_dir() -> Path:
    """Shared by every server of the user, whatever its models directory."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge-server" / "default-model"


def served_default_model_path(quant: str = AUTO, repack: str = "auto") -> Path:
    """The file to serve for the embedded model: for `auto` the faster of the packaged
    file and its Q8_0 conversion on the kernels `repack` (--repack) gives them; the
    conversion (made now if it is not there yet) for `q8_0`; the packaged file for
    `packaged`, or where the conversion fails."""
    source = default_model_path()
    if quant == PACKAGED:
        return source
    try:
        converted = convert_q8_0(source, cache_dir())
    # Anything at all (a read-only or full disk, a llama.cpp without the symbol): the
    # packaged file still serves, so the server starts.
    except Exception as exc:
        log.warning("serving the packaged Q4_1 default model: its Q8_0 conversion failed "
                    "(%s: %s)", type(exc).__name__, exc)
        return source
    if quant != AUTO:
        return converted
    try:
        return _faster(source, converted, repack)
    except Exception as exc:  # a load or timing that failed: the conversion, as before
        log.warning("serving the Q8_0 conversion of the default model: timing it against "
                    "the packaged file failed (%s: %s)", type(exc).__name__, exc)
        return converted


def _choice_key(source: Path, repack: str) -> str:
    import llama_cpp as lc

    from edge_server.engine.backend.runtime import init_backend

    init_backend()
    info = lc.llama_print_system_info().decode(errors="replace")
    stat = source.stat()
    identity = f"{stat.st_size}:{stat.st_mtime_ns}:{lc.__version__}:{info}:{repack}"
    return hashlib.sha256(identity.encode()).hexdigest()[:24]


def _faster(source: Path, converted: Path, repack: str) -> Path:
    """The file the kept choice names, or the faster of the two, timed now and kept."""
    choices = cache_dir() / "choice.json"
    key = _choice_key(source, repack)
    kept = _read_choices(choices).get(key)
    if kept in (Q8_0, PACKAGED):
        chosen = converted if kept == Q8_0 else source
        log.info("default model: %s (the faster here, as measured before)", chosen.name)
        return chosen
    import fcntl  # here: where it is missing (Windows), the conversion was not made

    with open(cache_dir() / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # servers starting together time the files once
        kept = _read_choices(choices).get(key)
        if kept in (Q8_0, PACKAGED):
            return converted if kept == Q8_0 else source
        return _measure(source, converted, repack, choices, key)


def _measure(source: Path, converted: Path, repack: str, choices: Path, key: str) -> Path:
    import llama_cpp as lc

    from edge_server.engine.backend.cpu.cpu_kernels import PLAIN
    from edge_server.engine.backend.cpu.cpu_probe import kernel_path
    from edge_server.engine.backend.measure.file_speed import CLIENTS, time_files

    started = time.monotonic()
    times = time_files([source, converted], repack)
    if times is None:
        log.warning("default model: serving its Q8_0 conversion; this machine was too busy "
                    "to time it against the packaged file (timed again at the next start)")
        return converted
    chosen = source if times[0].mix <= times[1].mix else converted
    info = lc.llama_print_system_info().decode(errors="replace")
    kernels = "/".join(kernel_path(p, repack, info) if repack != "off" else PLAIN
                       for p in (source, converted))
    shown = [" / ".join(f"{1000 * x:.1f}" for x in (t.chunk, *t.steps)) for t in times]
    log.info("default model: %s, the faster on this machine's kernels (%s): the reference "
             "mix (1, 4 and 8 clients, 64-token prompts, 128 tokens each) took %.2f s of "
             "CPU on one thread on the packaged Q4_1 file and %.2f s on its Q8_0 "
             "conversion; ms of a 64-token prompt chunk / a step of %s sequences: %s and "
             "%s; timed in %.1f s, once (--default-model-quant overrides)", chosen.name,
             kernels, times[0].mix, times[1].mix, "/".join(map(str, CLIENTS)), shown[0], shown[1],
             time.monotonic() - started)
    _write_choice(choices, key, PACKAGED if chosen == source else Q8_0)
    return chosen


def _read_choices(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_choice(path: Path, key: str, choice: str) -> None:
    data = _read_choices(path)
    data[key] = choice
    try:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only costs a timing per start


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

    from edge_server.engine.backend.runtime import init_backend

    init_backend()  # llama.cpp's log routed to ours: no line per tensor on stderr
    params = lc.llama_model_quantize_default_params()
    params.ftype = lc.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True  # the source is quantized already (Q4_1)
    params.nthread = _THREADS
    code = lc.llama_model_quantize(str(source).encode(), str(out).encode(),
                                  ctypes.byref(params))
    if code != 0:
        raise ConversionError(f"llama_model_quantize returned {code} for {source}")
