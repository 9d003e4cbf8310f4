"""Images for the multimodal tests: PNG data URLs, a chat that sends them, the default
model's counters, and a local image origin on 127.0.0.1 (with the tiny test projector)
for the image-URL tests of several suites."""

from __future__ import annotations

import base64
import http.server
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from edge_testkit.models.cache import write_test_projector
from edge_testkit.servers.process import DEFAULT_MODEL, RunningServer

IMAGE_TOKENS = 16  # (32 / 8) ** 2 patches of the test projector


def png_url(seed: int, size: tuple[int, int] = (48, 40)) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(server: RunningServer, *images: str, question: str = "What is in the picture?",
         **extra: Any) -> httpx.Response:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}}
                                   for u in images]
    parts.append({"type": "text", "text": question})
    return httpx.post(f"{server.v1}/chat/completions", timeout=120, json={
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": parts}],
        "max_tokens": 6, "temperature": 0, **extra})


def stats(server: RunningServer) -> dict[str, int]:
    models: dict[str, dict[str, int]] = httpx.get(f"{server.base_url}/health").json()["models"]
    return models[DEFAULT_MODEL]


PNG = base64.b64decode(png_url(5).split(",", 1)[1])
RELEASE = threading.Event()  # /held.png answers once it is set


class Origin(http.server.BaseHTTPRequestHandler):
    """/picture.png; /trickle.png (a byte a second); /held.png (a first byte, the rest
    once RELEASE is set); /to?url=U (a redirect to U)."""

    def do_GET(self) -> None:
        if self.path.startswith("/to?url="):
            self.send_response(302)
            self.send_header("Location", self.path[len("/to?url="):])
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        if self.path == "/trickle.png":
            try:
                for byte in PNG:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(1.0)
            except OSError:
                pass  # the server gave up on us: as it should
            return
        if self.path == "/held.png":
            self.wfile.write(PNG[:1])
            self.wfile.flush()
            RELEASE.wait(120)
            self.wfile.write(PNG[1:])
            return
        self.wfile.write(PNG)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_test_projector(tmp_path_factory.mktemp("urls") / "mmproj.gguf")
