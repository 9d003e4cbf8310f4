"""Which of llama.cpp's CPU kernel paths (cpu_kernels.py) is safe on this machine.

llama.cpp picks AMX kernels whenever the CPU reports AMX. On some virtual machines
those kernels fault (general protection fault in the AMX matrix multiply, for Q4_1,
Q8_0, Q4_K and Q6_K alike) on every batch of more than one token, which kills the whole
process, while the AVX-512 repacked kernels (CPU_REPACK) run fine. A crash cannot be
caught in-process, so the first load of a model on an AMX machine decodes a few batches
in a child process with every extra buffer (`amx+repack`); if that child dies, another
tries CPU_REPACK alone (`repack`, where the model has weights it takes); if that dies
too, or there is nothing to repack, the model loads with plain kernels (`plain`, never
a crash). The verdict is cached per llama.cpp build, CPU features and model file, so
later starts skip the probe.

Run as `python -m edge_server.engine.backend.cpu.cpu_probe MODEL.gguf [PATH]`: exit status 0
if batched decodes on kernel path PATH (default amx+repack) work.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import llama_cpp as lc

from edge_server.engine.backend.cpu.cpu_kernels import (
    AMX_REPACK,
    PATHS,
    PLAIN,
    REPACK,
    has_repackable,
    placement,
)

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 120
_CACHE_VERSION = "kernels-2"  # verdicts were booleans before: those are probed again
_verdicts: dict[str, str] = {}


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge-server" / "cpu-probe.json"


def _key(path: Path, system_info: str) -> str:
    stat = path.stat()
    identity = f"{_CACHE_VERSION}|{lc.__version__}|{system_info}|{path.name}|{stat.st_size}"
    return hashlib.sha256(identity.encode()).hexdigest()[:24]


def _read_cache() -> dict[str, object]:
    try:
        data = json.loads(_cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(key: str, verdict: str) -> None:
    data = _read_cache()
    data[key] = verdict
    try:
        path = _cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a read-only home only costs a probe per start


def kernel_path(path: Path, mode: str, system_info: str) -> str:
    """`mode` (--repack) "on" / "off" decides; "auto" probes (once) on machines with AMX."""
    has_amx = "AMX" in system_info
    if mode == "off":
        return PLAIN
    if mode == "on" or not has_amx:
        return AMX_REPACK if has_amx else REPACK
    key = _key(path, system_info)
    if key in _verdicts:
        return _verdicts[key]
    cached = _read_cache().get(key)
    verdict = cached if isinstance(cached, str) and cached in PATHS else None
    if verdict is None:
        verdict = _probe_paths(path, system_info)
        _write_cache(key, verdict)
    if verdict != AMX_REPACK:
        log.warning(
            "llama.cpp's AMX kernels crash on this machine; %s uses %s (set --repack on to "
            "override)", path.name,
            "the AVX repacked kernels without AMX" if verdict == REPACK
            else "plain CPU kernels")
    _verdicts[key] = verdict
    return verdict


def extra_buffers_safe(path: Path, mode: str, system_info: str) -> bool:
    """Whether every extra buffer type (llama.cpp's default, AMX included) is safe: what a
    plain llama.cpp load (llama-cpp-python's Llama, llama-server without --no-repack)
    needs before it may run here."""
    verdict = kernel_path(path, mode, system_info)
    return verdict == AMX_REPACK or (verdict == REPACK and "AMX" not in system_info)


def _probe_paths(path: Path, system_info: str) -> str:
    if _probe(path, AMX_REPACK):
        return AMX_REPACK
    if has_repackable(path, system_info) and _probe(path, REPACK):
        return REPACK
    return PLAIN


def _probe(path: Path, kernels: str) -> bool:
    try:
        result = subprocess.run(
            [sys.executable, "-m", __name__, str(path), kernels],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _main(model_path: str, kernels: str) -> int:
    from edge_server.engine.backend.batch import DecodeBatch

    lc.llama_backend_init()
    system_info = lc.llama_print_system_info().decode(errors="replace")
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = 0
    where = placement(kernels, Path(model_path), system_info, cpu_only=True)
    where.apply(mparams)
    model = lc.llama_model_load_from_file(model_path.encode(), mparams)
    if not model:
        return 2
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = 256
    cparams.n_batch = cparams.n_ubatch = 64
    cparams.n_threads = cparams.n_threads_batch = 2  # the kernels' split across threads too
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        return 2
    vocab = lc.llama_model_get_vocab(model)
    first = max(lc.llama_vocab_bos(vocab), 0)
    batch = DecodeBatch(64)
    position = 0
    # A prompt chunk (AMX tiles, repacked GEMM), one row (GEMV), and a row count off the
    # kernels' 4- and 16-row blocks.
    for rows in (32, 1, 5):
        batch.clear()
        batch.add_span([first] * rows, position, 0, logits_last=True)
        if batch.decode(ctx) != 0:
            return 3
        position += rows
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else AMX_REPACK))
