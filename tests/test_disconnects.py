"""Clients that give up at every stage (queued, prefilling, decoding, non-stream
timeouts) leave nothing running, waiting or leased; the idle model then unloads after its
keep_alive, and SIGTERM stops the idle server at once. A short run of
scripts/soak_disconnects.py, which soaks the same for longer."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

from conftest import ROOT, THREADS_ENV


def load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "soak_disconnects", ROOT / "scripts" / "soak_disconnects.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_disconnects_leave_nothing_behind() -> None:
    soak = load_soak()
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
