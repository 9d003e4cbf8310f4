"""Zeroed pages given back: only pages holding nothing but zeros go, what was written
stays byte for byte, memory drops by the pages given back, and a page written again
counts as resident again."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from edge_server.engine.backend.zero_pages import anonymous_mappings, release_zero_pages

PAGES = 8192  # 32 MiB of 4 KiB pages: past the smallest mapping scanned


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_only_zero_pages_go_and_written_ones_stay() -> None:
    page = mmap.PAGESIZE
    before = anonymous_mappings()
    # A private anonymous mapping, every page touched as llama.cpp's cache clear does.
    region = mmap.mmap(-1, PAGES * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        view = np.frombuffer(region, dtype=np.uint8).reshape(PAGES, page)
        view[:] = 0
        written = np.arange(0, PAGES, 7)  # every 7th page holds data
        view[written, 5] = 0xAB
        view[written[:10], page - 1] = 0x01
        expected = view.copy()
        resident = rss_bytes()

        released = release_zero_pages(before)

        zero_pages = PAGES - len(written)
        assert released.bytes >= zero_pages * page
        assert rss_bytes() <= resident - (zero_pages * page) * 0.9
        assert released.resident_again() < 4 * 2**20  # (a read maps the zero page)
        view[1, 0] = 0x7F  # a cell written after: its page is memory again
        assert released.resident_again() >= page
        expected[1, 0] = 0x7F
        assert np.array_equal(view, expected)  # zeros read back as zeros, data as data
    finally:
        del view
        region.close()


def test_mappings_that_existed_before_are_left_alone() -> None:
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, PAGES * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        view = np.frombuffer(region, dtype=np.uint8)
        view[:] = 0
        before = anonymous_mappings()
        resident = rss_bytes()
        release_zero_pages(before)
        assert rss_bytes() >= resident - 4 * 2**20  # nothing of the old mapping went
    finally:
        del view
        region.close()

