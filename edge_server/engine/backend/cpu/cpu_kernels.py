"""Which of llama.cpp's CPU matrix kernels a model's weights run on, and placing them so.

llama.cpp copies weights at load into "extra" buffer types whose layouts its faster
kernels read: AMX (Intel's tile unit) on CPUs that report it, then CPU_REPACK (AVX2 /
AVX-512 or NEON layouts) for the types AMX does not take. Three paths:

- `amx+repack`: every extra buffer type, llama.cpp's (and llama-server's) default.
- `repack`: CPU_REPACK without AMX. On a CPU without AMX that is llama.cpp's default;
  where AMX is there but its kernels fault (some VMs: cpu_probe.py), the weights
  CPU_REPACK has kernels for are named for it in `tensor_buft_overrides`, the rest stay
  in plain CPU buffers.
- `plain`: no extra buffer (llama-server's --no-repack); Q8_0 and Q4_0 prompts still
  take llama.cpp's sgemm (llamafile) kernels.

On x86 CPU_REPACK takes Q4_0, Q4_K, IQ4_NL and MXFP4 (AVX2) and Q2_K (AVX-512) matrices
whose row count is a multiple of 8 (repack.cpp, ggml_repack_get_optimal_repack_type of
the llama.cpp that llama-cpp-python 0.3.36 vendors); Q4_1, Q5_0, Q6_K and Q8_0 it leaves
to the plain kernels. Naming a tensor of another type for it would crash the load (no
layout for it): the probe's child process loads with the same names first.
"""

from __future__ import annotations

import ctypes
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from edge_server.engine.backend.gguf_tensors import TensorInfo, read_tensors
from edge_server.engine.backend.rpc.rpc_devices import ggml

AMX_REPACK, REPACK, PLAIN = "amx+repack", "repack", "plain"
PATHS = (AMX_REPACK, REPACK, PLAIN)

_DEV_TYPE_CPU = 0
# GGML_TYPE ids: Q4_0, Q4_K, IQ4_NL, MXFP4 (repacked with AVX2), Q2_K (with AVX-512).
_REPACKED_AVX2 = frozenset({2, 12, 20, 39})
_Q2_K = 10
# Weights llama.cpp's graphs use only as the matrix of a MUL_MAT (a repacked layout is
# unreadable to any other op): attention and feed-forward projections, the output head.
# token_embd is left out: a GET_ROWS reads it (and the head, where it is tied).
_MATMUL = re.compile(r"^blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|"
                     r"ffn_up|ffn_down)\.weight$|^output\.weight$")


class _Override(ctypes.Structure):
    # struct llama_model_tensor_buft_override (llama-cpp-python binds the field, not it)
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def extra_buffer_types() -> dict[str, int]:
    """The CPU device's extra buffer types by name (AMX, CPU_REPACK, ...), as llama.cpp
    lists them for a model load."""
    g = ggml()
    dev = g.dev_by_type(_DEV_TYPE_CPU)
    proc = g.reg_proc(g.dev_reg(dev), b"ggml_backend_dev_get_extra_bufts") if dev else None
    if not proc:
        return {}
    listed = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(proc)(dev)
    found: dict[str, int] = {}
    i = 0
    while listed and listed[i]:
        found[(g.buft_name(listed[i]) or b"?").decode()] = int(listed[i])
        i += 1
    return found


def repackable(tensors: list[TensorInfo], system_info: str) -> list[str]:
    """Names of the weights CPU_REPACK has an x86 kernel for (see the module doc)."""
    types = set(_REPACKED_AVX2) if "AVX2 = 1" in system_info else set()
    if "AVX512 = 1" in system_info:
        types.add(_Q2_K)
    return [t.name for t in tensors if _MATMUL.match(t.name) and len(t.shape) == 2
            and t.shape[1] % 8 == 0 and t.ggml_type in types]


def patterns(names: list[str], tensors: list[TensorInfo]) -> list[str]:
    """Few regexes for `names` (llama.cpp compiles every pattern for every tensor): one
    per kind of weight, `\\d+` where every layer's is named, else the layers listed."""
    named: dict[str, set[str]] = defaultdict(set)
    every: dict[str, set[str]] = defaultdict(set)
    out: list[str] = []
    for t in tensors:
        if (m := _MATMUL.match(t.name)) and m.group(1) is not None:
            every[m.group(2)].add(m.group(1))
    for name in names:
        m = _MATMUL.match(name)
        if m is None:
            continue
        if m.group(1) is None:
            out.append(f"^{re.escape(name)}$")
        else:
            named[m.group(2)].add(m.group(1))
    for kind, layers in sorted(named.items()):
        which = r"\d+" if layers == every[kind] else "(" + "|".join(sorted(layers, key=int)) + ")"
        out.append(rf"^blk\.{which}\.{kind}\.weight$")
    return out


@dataclass
class Placement:
    """What a model load gets: the extra buffers switch and the overrides (kept alive
    with the array llama_model_params points to until the load returns)."""

    use_extra_bufts: bool
    overrides: ctypes.Array[_Override] | None = None
    named: int = 0  # weights named for CPU_REPACK

    def apply(self, mparams: object) -> None:
        mparams.use_extra_bufts = self.use_extra_bufts  # type: ignore[attr-defined]
        if self.overrides is not None:
            mparams.tensor_buft_overrides = ctypes.addressof(self.overrides)  # type: ignore[attr-defined]


def placement(kernels: str, path: Path, system_info: str, *, cpu_only: bool) -> Placement:
    """Model parameters for a kernel path. `repack` with AMX present names the weights,
    which would pin them to the CPU: where layers are offloaded it falls back to plain."""
    if kernels == AMX_REPACK:
        return Placement(True)
    if kernels == PLAIN:
        return Placement(False)
    bufts = extra_buffer_types()
    if "AMX" not in bufts:
        return Placement(True)  # llama.cpp's own choice is CPU_REPACK (and plain) already
    repack = bufts.get("CPU_REPACK")
    if not cpu_only or repack is None:
        return Placement(False)
    try:
        tensors = read_tensors(path)
    except (OSError, ValueError):
        return Placement(False)  # llama.cpp's load then says what is wrong with the file
    names = repackable(tensors, system_info)
    if not names:
        return Placement(False)
    regexes = [p.encode() for p in patterns(names, tensors)]
    overrides = (_Override * (len(regexes) + 1))()
    for i, regex in enumerate(regexes):
        overrides[i].pattern, overrides[i].buft = regex, repack
    overrides[len(regexes)].pattern = None  # the list ends at a NULL pattern
    return Placement(False, overrides, len(names))


def has_repackable(path: Path, system_info: str) -> bool:
    """Whether CPU_REPACK would take any of the file's weights (a probe of the `repack`
    path is worth running)."""
    try:
        return bool(repackable(read_tensors(path), system_info))
    except (OSError, ValueError):
        return False
