"""Loading a model touches no memory the server did not allocate: while one thread
allocates, zero-fills and writes 32 MiB buffers (each its own mapping, as glibc serves
them above the 1 MiB mmap threshold malloc_tuning.py sets) and frees them again, the
main thread makes real llama.cpp contexts through the server's own loading code. Every
page the writer wrote must still hold its data, and the process must not crash.

A release of "untouched" KV pages once scanned every new anonymous mapping, whoever owned
it: it read buffers being freed (SIGSEGV) and dropped pages read as zero just before
their owner wrote them (lost writes). The body runs in a child process, so a crash fails
this test instead of ending the test run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import ROOT

_BODY = textwrap.dedent("""
    import collections, threading, time
    import numpy as np
    from edge_server.catalogue.default_conversion import served_default_model_path
    from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel
    from edge_server.process.malloc_tuning import fix_mmap_threshold

    fix_mmap_threshold()
    PAGE = 4096
    PAGES = 8192  # 32 MiB: its own mapping, unmapped when freed
    WORDS = PAGE // 8
    # A new buffer every EVERY seconds, each written over LIFETIME seconds as its data
    # comes (however busy the machine), every other page first: the pages still zero
    # are many short runs. Done, a buffer is checked, kept a while, checked, and freed.
    EVERY, LIFETIME = 0.08, 1.0
    stop = threading.Event()
    counts = {"buffers": 0, "pages": 0, "lost": 0}
    ORDER = np.concatenate((np.arange(0, PAGES, 2), np.arange(1, PAGES, 2)))

    def lost(pages, stamp):
        expected = np.arange(PAGES, dtype=np.uint64) + stamp
        return int(np.count_nonzero(pages[:, 0] != expected))

    def writer():
        writing, done = [], collections.deque()
        stamp, last_new = 1, 0.0
        while not stop.is_set():
            now = time.monotonic()
            if now - last_new > EVERY:
                buffer = np.empty(PAGES * WORDS, dtype=np.uint64)
                buffer.fill(0)  # every page resident and zero, as calloc'd memory once used
                writing.append([buffer.reshape(PAGES, WORDS), stamp, now, 0])
                stamp, last_new = stamp + PAGES, now
            for item in list(writing):
                pages, first_stamp, born, at = item
                upto = min(PAGES, int(PAGES * (now - born) / LIFETIME))
                rows = ORDER[at:upto]
                pages[rows, 0] = rows.astype(np.uint64) + first_stamp
                item[3] = upto
                if upto == PAGES:
                    writing.remove(item)
                    counts["lost"] += lost(pages, first_stamp)
                    done.append(item)
                    counts["buffers"] += 1
                    counts["pages"] += PAGES
                    if len(done) > 2:
                        held = done.popleft()  # freed: unmapped
                        counts["lost"] += lost(held[0], held[1])
            time.sleep(0.001)
        for item in done:
            counts["lost"] += lost(item[0], item[1])

    thread = threading.Thread(target=writer)
    thread.start()
    path = served_default_model_path()
    started = time.monotonic()
    loads = 0
    try:
        while loads < 12 and time.monotonic() - started < 18:
            model = LlamaModel(path, ContextSettings(n_ctx=2048, n_seq_max=8, n_threads=1))
            model.close()
            loads += 1
    finally:
        stop.set()
        thread.join()
    print(f"loads={loads} buffers={counts['buffers']} pages={counts['pages']} "
          f"lost={counts['lost']}", flush=True)
""")


def test_loading_a_model_leaves_other_threads_memory_alone() -> None:
    result = subprocess.run([sys.executable, "-c", _BODY], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, f"the child ended with {result.returncode}:\n{tail}"
    line = result.stdout.strip().splitlines()[-1]
    fields = dict(part.split("=") for part in line.split())
    assert int(fields["loads"]) >= 2 and int(fields["buffers"]) >= 10, line
    assert fields["lost"] == "0", line
