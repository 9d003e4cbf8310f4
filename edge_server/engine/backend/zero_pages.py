"""Gives back to the OS the pages of new anonymous memory that hold only zeros.

llama.cpp clears a KV cache's whole buffer when it creates a context (a memset in
llama_kv_cache's constructor), so every cell of every sequence's stream is resident from
the start, used or not: eight 8,192-token streams of SmolLM2 are 1.4 GiB of RSS at idle.
A private anonymous page that holds only zeros reads back as zeros after
madvise(MADV_DONTNEED), so dropping it changes nothing the process can observe, and the
page comes back (zeroed) only when a cell on it is written. Memory then grows with the
cells requests use, as llama-server's unified cache does, while each sequence keeps a
stream of its own.

Only pages that are all zeros are dropped, so no allocator header or written data is
touched, whatever else shares those mappings. Call it while no other thread writes to
the mappings (right after the context is made, before any decode).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import sys

import numpy as np

log = logging.getLogger(__name__)

_MADV_DONTNEED = 4
# Where /proc/self/maps and madvise's zero-fill semantics are there to use.
RELEASES_PAGES = sys.platform.startswith("linux")
# Pages read at once when looking for zeros (64 MiB of 4 KiB pages).
_SCAN_PAGES = 16384
# Mappings smaller than this are not worth a scan (thread stacks, small heaps).
_MIN_MAPPING = 16 << 20


def anonymous_mappings() -> dict[int, int]:
    """Start address -> size of this process's private, writable, anonymous mappings;
    empty where /proc is not there (then nothing is released)."""
    mappings: dict[int, int] = {}
    if not RELEASES_PAGES:
        return mappings
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) == 5 and fields[1].startswith("rw") and fields[1][3] == "p":
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    mappings[start] = end - start
    except OSError:
        return {}
    return mappings


class ReleasedPages:
    """The runs of pages given back, and all the new mappings scanned (`mappings`: the
    KV streams and the compute buffers; empty where residency cannot be known). How
    many released pages are resident again (written since) is what the memory account
    adds back to the KV cache; what the mappings hold beyond that is what steps used of
    the compute buffers."""

    def __init__(self, runs: list[tuple[int, int]],
                 mappings: list[tuple[int, int]] | None = None) -> None:
        self.runs = runs  # (address, bytes), each inside one of the mappings
        self.bytes = sum(length for _, length in runs)
        self.mappings = mappings or []  # (address, bytes)

    def resident_again(self) -> int:
        """Bytes of the released pages that are resident now (written since, or read:
        a read maps the shared zero page, which mincore counts too)."""
        return self.residency()[0]

    def residency(self) -> tuple[int, int]:
        """(bytes of the released pages resident again, bytes resident in all the
        mappings), from one mincore pass over the mappings: the runs lie inside them."""
        page = mmap.PAGESIZE
        again = total = 0
        for start, length in self.mappings:
            flags = _mincore(start, length)
            if flags is None:
                continue
            total += int(np.count_nonzero(flags)) * page
            for run_start, run_length in self.runs:
                if start <= run_start < start + length:
                    first = (run_start - start) // page
                    again += int(np.count_nonzero(
                        flags[first:first + run_length // page])) * page
        return again, total


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library with madvise and mincore typed (None where they are not there)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    except (OSError, AttributeError):
        return None
    return libc


def _mincore(address: int, length: int) -> np.ndarray | None:
    """One flag per page: resident (a page mapped, zero page included) or not."""
    libc = _libc()
    if libc is None:
        return None
    flags = np.zeros(length // mmap.PAGESIZE, dtype=np.uint8)
    return flags & 1 if libc.mincore(address, length, flags.ctypes.data) == 0 else None


def _drop(address: int, length: int) -> bool:
    """madvise(MADV_DONTNEED) of whole pages: they read back as zeros."""
    libc = _libc()
    return libc is not None and libc.madvise(address, length, _MADV_DONTNEED) == 0


def discard_range(address: int, length: int) -> int:
    """Gives back the whole pages inside [address, address + length) whatever they hold:
    only for scratch memory that no other thread uses now and that is written before it
    is next read. Returns the bytes given back."""
    if not RELEASES_PAGES:
        return 0
    page = mmap.PAGESIZE
    start = -(-address // page) * page
    end = (address + length) // page * page
    return end - start if end > start and _drop(start, end - start) else 0


def new_mappings(before: dict[int, int]) -> list[tuple[int, int]]:
    """(address, bytes) of anonymous memory mapped since `before` (an earlier
    anonymous_mappings()), in ranges worth a scan. The kernel merges a new mapping with
    an adjacent old one, so what `before` held is cut out of each range."""
    old = sorted(before.items())
    ranges: list[tuple[int, int]] = []
    for start, size in anonymous_mappings().items():
        pieces = [(start, start + size)]
        for old_start, old_size in old:
            old_end = old_start + old_size
            pieces = [part for lo, hi in pieces for part in
                      ((lo, min(hi, old_start)), (max(lo, old_end), hi)) if part[1] > part[0]]
        ranges += [(lo, hi - lo) for lo, hi in pieces if hi - lo >= _MIN_MAPPING]
    return ranges


def release_zero_pages(before: dict[int, int]) -> ReleasedPages:
    """Drops the resident all-zero pages of anonymous mappings that are new or changed
    since `before` (an earlier anonymous_mappings())."""
    runs: list[tuple[int, int]] = []
    scanned: list[tuple[int, int]] = []
    if _libc() is None:
        return ReleasedPages(runs)
    page = mmap.PAGESIZE
    for start, size in new_mappings(before):
        # Resident first: reading a page never touched would map the zero page.
        resident = _mincore(start, size)
        if resident is None:
            continue
        scanned.append((start, size))
        pages = np.ctypeslib.as_array((ctypes.c_uint64 * (size // 8)).from_address(start))
        pages = pages.reshape(-1, page // 8)
        zero = np.zeros(len(resident), dtype=bool)
        # In slices, read in place: a cache of gigabytes is never copied.
        for first in range(0, len(zero), _SCAN_PAGES):
            held = resident[first:first + _SCAN_PAGES].astype(bool)
            if held.any():
                zero[first:first + _SCAN_PAGES] = held & ~pages[
                    first:first + _SCAN_PAGES].any(axis=1)
        # Runs of resident zero pages: one madvise call each.
        edges = np.flatnonzero(np.diff(np.concatenate(([0], zero.view(np.int8), [0]))))
        for first, end in zip(edges[::2], edges[1::2], strict=True):
            address, length = start + int(first) * page, int(end - first) * page
            if _drop(address, length):
                runs.append((address, length))
    released = ReleasedPages(runs, scanned)
    if released.bytes:
        log.info("gave back %d MiB of zeroed memory (KV cells not yet used)",
                 released.bytes >> 20)
    return released
