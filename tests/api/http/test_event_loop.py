"""The server runs on uvicorn's own choice of event loop: uvloop where it is installed.

asyncio's loop wakes from another thread through a socket write that releases the GIL,
so every streamed token made the engine thread wait for the event loop's work on it
(about 0.5 ms of a 1.5B model's 30 ms step); uvloop's wake-up keeps the GIL.
"""

from __future__ import annotations

import importlib.util
import re
import time

import httpx
from conftest import RunningServer


def _ready_line(server: RunningServer, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"serving \S+ on http://\S+ \(event loop: (\w+)\)", server.log_text())
        if found:
            return found.group(1)
        time.sleep(0.1)
    raise AssertionError(f"no ready line in the log:\n{server.log_text()}")


def test_served_on_uvloop_where_installed(server: RunningServer) -> None:
    expected = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    assert _ready_line(server) == expected
    # ... and it streams on that loop.
    body = {"prompt": "Hello", "max_tokens": 4, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.v1}/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: {")]
    assert events and response.headers["content-type"].startswith("text/event-stream")
