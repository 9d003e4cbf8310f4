"""Clients that give up at every stage (queued, prefilling, decoding, non-stream
timeouts) leave nothing running, waiting or leased; the idle model then unloads after its
keep_alive, and SIGTERM stops the idle server at once. A short run of
edge_testkit.soak.disconnects, which scripts/soak/soak_disconnects.py runs for longer."""

from __future__ import annotations

import os

from conftest import THREADS_ENV

from edge_testkit.soak import disconnects as soak


def test_disconnects_leave_nothing_behind() -> None:
    server = soak.start(keep_alive=2, threads=int(os.environ.get(THREADS_ENV, "1")))
    try:
        report = soak.soak(server.base_url, server, plain=20, streams=20, concurrency=6,
                           keep_alive=2)
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    report.print()
    assert not report.problems, report.problems
    assert report.figures.get("leases") != "absent from /health"
