"""Hands large freed buffers back to the system at once (glibc only).

The server makes big short-lived buffers all the time: a sequence's KV snapshot for the
prompt store (tens of MB, copied once more into bytes), logits rows, JSON bodies. glibc
serves an allocation above its mmap threshold from its own mapping and unmaps it on
free, but the threshold slides: each such free raises it to the freed size (up to 32 MiB
on 64-bit), so later buffers of that size come from the heap, where freed memory stays
resident behind whatever was allocated after it. Measured here (SmolLM2, prompt store
full, 12 new 1,500-token system prompts): RSS less the prompt store grew 764 - 600 MiB
with the sliding threshold and stayed at 605 MiB with it fixed at 1 MiB. Setting it by
hand (mallopt, as MALLOC_MMAP_THRESHOLD_ would at start) also stops the sliding.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fixes glibc's mmap threshold (unless the environment set it); False elsewhere."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False  # the operator chose
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to fix
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = mallopt(_M_MMAP_THRESHOLD, threshold) == 1
    if not done:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused")
    return done
