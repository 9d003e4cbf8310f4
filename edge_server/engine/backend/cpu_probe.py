"""Whether llama.cpp's CPU "extra buffers" (weights repacked for AMX or AVX kernels) are
safe to use on this machine.

llama.cpp picks AMX kernels whenever the CPU reports AMX. On some virtual machines
those kernels fault (general protection fault in the AMX matrix multiply) on every
batch of more than one token, which kills the whole process. A crash cannot be caught
in-process, so the first load of a model on an AMX machine runs one batched decode in
a child process; if the child dies, models load without extra buffers (plain CPU
kernels, slightly slower prompt processing, never a crash). The verdict is cached per
llama.cpp build, CPU features and model file, so later starts skip the probe.

Run as `python -m edge_server.engine.backend.cpu_probe MODEL.gguf`: exit status 0 if a batched
decode with extra buffers works.
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

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 120
_verdicts: dict[str, bool] = {}


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge-server" / "cpu-probe.json"


def _key(path: Path, system_info: str) -> str:
    stat = path.stat()
    identity = f"{lc.__version__}|{system_info}|{path.name}|{stat.st_size}"
    return hashlib.sha256(identity.encode()).hexdigest()[:24]


def _read_cache() -> dict[str, bool]:
    try:
        data = json.loads(_cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, bool)}


def _write_cache(key: str, verdict: bool) -> None:
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


def extra_buffers_safe(path: Path, mode: str, system_info: str) -> bool:
    """`mode` "on"/"off" decides; "auto" probes (once) on machines with AMX."""
    if mode in ("on", "off"):
        return mode == "on"
    if "AMX" not in system_info:
        return True
    key = _key(path, system_info)
    if key in _verdicts:
        return _verdicts[key]
    cached = _read_cache().get(key)
    if cached is None:
        cached = _probe(path)
        _write_cache(key, cached)
    if not cached:
        log.warning(
            "llama.cpp's AMX kernels crash on this machine; %s uses plain CPU kernels "
            "(set --repack on to override)", path.name,
        )
    _verdicts[key] = cached
    return cached


def _probe(path: Path) -> bool:
    try:
        result = subprocess.run(
            [sys.executable, "-m", __name__, str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _main(model_path: str) -> int:
    from .batch import DecodeBatch

    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    mparams.use_extra_bufts = True
    mparams.n_gpu_layers = 0
    model = lc.llama_model_load_from_file(model_path.encode(), mparams)
    if not model:
        return 2
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = 256
    cparams.n_batch = cparams.n_ubatch = 64
    cparams.n_threads = cparams.n_threads_batch = 1
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        return 2
    vocab = lc.llama_model_get_vocab(model)
    batch = DecodeBatch(64)
    first = max(lc.llama_vocab_bos(vocab), 0)
    batch.add_span([first] * 32, 0, 0, logits_last=True)
    return 0 if batch.decode(ctx) == 0 else 3


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1]))
