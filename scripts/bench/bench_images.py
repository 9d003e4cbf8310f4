"""Prints what images cost inside the batching engine, with the tiny test projector
(edge_testkit/models/make_test_projector.py) next to the default model:

- first image request vs the same image again with a new question: time to first
  token, cached prompt tokens, and whether the image was encoded again;
- 4 text streams alone vs beside 4 concurrent two-image requests: their token rate and
  the longest gap between two tokens of one stream.

    .venv/bin/python scripts/bench/bench_images.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from edge_testkit.bench.common import start_edge_server
from edge_testkit.models.make_test_projector import write_projector

MODEL = "default"


def png_url(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, (240, 320, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def start(projector: Path, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    return start_edge_server(
        ["--mmproj", str(projector), "--parallel", "8", "--ctx-size", "16384"],
        env={**os.environ, "XDG_DATA_HOME": str(work / "data")}, log=work / "server.log")


def image_chat(base: str, images: list[str], question: str, max_tokens: int = 8
               ) -> tuple[float, dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in images]
    parts.append({"type": "text", "text": question})
    started = time.monotonic()
    with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=300, json={
            "model": MODEL, "messages": [{"role": "user", "content": parts}], "stream": True,
            "max_tokens": max_tokens, "stream_options": {"include_usage": True}}) as r:
        first, usage = None, {}
        for line in r.iter_lines():
            if line.startswith("data: {"):
                first = first or time.monotonic() - started
                if '"usage"' in line and '"prompt_tokens"' in line:
                    usage = httpx.Response(200, content=line[6:]).json().get("usage") or {}
    return first or 0.0, usage


def text_stream(base: str, i: int) -> list[float]:
    arrivals = []
    with httpx.stream("POST", f"{base}/v1/completions", timeout=300, json={
            "model": MODEL, "prompt": f"Story number {i}:", "max_tokens": 64,
            "ignore_eos": True, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
    return arrivals


def streams_beside(base: str, with_images: bool, seed: int) -> tuple[float, float]:
    """4 text streams (and 4 two-image requests): total tokens/s, longest gap."""
    with ThreadPoolExecutor(8) as pool:
        texts = [pool.submit(text_stream, base, seed * 10 + i) for i in range(4)]
        if with_images:
            time.sleep(0.2)
            images = [pool.submit(image_chat, base, [png_url(seed * 100 + 2 * i),
                                                     png_url(seed * 100 + 2 * i + 1)],
                                  f"Compare them ({i}).") for i in range(4)]
            for f in images:
                f.result()
        arrivals = [f.result() for f in texts]
    span = max(a[-1] for a in arrivals) - min(a[0] for a in arrivals)
    gap = max(max(np.diff(a)) for a in arrivals)
    return sum(len(a) for a in arrivals) / span, gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        projector = write_projector(work / "test-mmproj.gguf")
        proc, base = start(projector, work)
        try:
            def encoded() -> int:
                stats = httpx.get(f"{base}/health").json()["models"]
                return next(iter(stats.values()))["images_encoded"]

            firsts, repeats = [], []
            for r in range(args.rounds):
                image = png_url(1000 + r)
                before = encoded()
                t1, u1 = image_chat(base, [image], "Describe this picture.")
                t2, u2 = image_chat(base, [image], "Describe this picture. What colours?")
                firsts.append(t1)
                repeats.append(t2)
                print(f"round {r}: first {t1 * 1000:.0f} ms (prompt {u1['prompt_tokens']}, "
                      f"cached {u1['prompt_tokens_details']['cached_tokens']}), same image "
                      f"again {t2 * 1000:.0f} ms (cached "
                      f"{u2['prompt_tokens_details']['cached_tokens']}); images encoded: "
                      f"{encoded() - before}")
            print(f"TTFT median: new image {statistics.median(firsts) * 1000:.0f} ms, "
                  f"repeated image {statistics.median(repeats) * 1000:.0f} ms")
            alone, beside = [], []
            for r in range(args.rounds):  # alternate, to share the machine's swings
                alone.append(streams_beside(base, False, 2 * r))
                beside.append(streams_beside(base, True, 2 * r + 1))
            for name, runs in (("text alone", alone), ("beside images", beside)):
                rate = statistics.median(x[0] for x in runs)
                gap = statistics.median(x[1] for x in runs)
                print(f"4 text streams, {name}: {rate:.1f} tok/s, longest gap "
                      f"{gap * 1000:.0f} ms (medians of {args.rounds})")
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
