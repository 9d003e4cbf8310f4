"""llama.cpp's process-wide state: its backends, initialised once, and its log routed
to ours. Below the model and the RPC modules, which both need it."""

from __future__ import annotations

import ctypes
import logging

import llama_cpp as lc

_backend_ready = False
_llama_log = logging.getLogger("llama.cpp")
_LEVEL_INFO, _LEVEL_WARN, _LEVEL_ERROR = 2, 3, 4  # ggml_log_level
# With RPC servers, where llama.cpp put weights, KV cache and compute buffers is worth
# a line per device in our log ("RPC0 model buffer size = ... MiB").
_log_buffer_sizes = False


@lc.llama_log_callback
def forward_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # llama.cpp narrates every load at INFO on stderr; keep only its warnings and errors.
    if level in (_LEVEL_WARN, _LEVEL_ERROR):
        message = text.decode("utf-8", errors="replace").rstrip()
        if message:
            _llama_log.log(logging.ERROR if level == _LEVEL_ERROR else logging.WARNING, message)
    elif level == _LEVEL_INFO and _log_buffer_sizes and b"buffer size" in text:
        _llama_log.info(" ".join(text.decode("utf-8", errors="replace").split()))


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
