"""Ollama's official JavaScript client (npm `ollama`, ollama-js) against the server's
/api/* routes on the real default model, next to the Python client's tests: it lists,
shows, generates, chats (streamed, with `think`), embeds with `num_ctx`, and gets a
ResponseError with status 404 for a model the server does not have.

The package is installed from npm on first use into a cache outside the checkout
(~/.cache/edge-server-tests/ollama-js); without node and npm, or without the registry,
the test is skipped, saying why."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import DEFAULT_MODEL, RunningServer

PACKAGE = "ollama@0.6"
CACHE = Path.home() / ".cache" / "edge-server-tests" / "ollama-js"

SCRIPT = r"""
import { Ollama } from "ollama";

const [host, model] = process.argv.slice(2);
const client = new Ollama({ host });
const out = {};
out.listed = (await client.list()).models.map((m) => m.model);
const shown = await client.show({ model });
out.family = shown.details.family;
out.capabilities = shown.capabilities;
const generated = await client.generate({
  model, prompt: "Name a colour.", stream: false, options: { num_predict: 4, temperature: 0 },
});
out.generated = { done: generated.done, eval_count: generated.eval_count,
                  response: generated.response };
const parts = await client.chat({
  model, messages: [{ role: "user", content: "Say hello." }], stream: true, think: true,
  options: { num_predict: 4, temperature: 0 },
});
out.chunks = [];
for await (const part of parts) {
  out.chunks.push({ done: part.done, content: part.message.content,
                    thinking: part.message.thinking ?? "", reason: part.done_reason ?? null });
}
const embedded = await client.embed({ model, input: ["first text", "second text"],
                                      options: { num_ctx: 2048 } });
out.embeddings = embedded.embeddings.map((v) => v.length);
try {
  await client.chat({ model: "no-such-model:7b", messages: [{ role: "user", content: "x" }] });
  out.missing = null;
} catch (error) {
  out.missing = { name: error.name, status_code: error.status_code, error: error.error };
}
console.log(JSON.stringify(out));
"""


def _installed() -> Path:
    """The package's folder, installed into the cache when it is not there yet."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for ollama-js (apt-get install nodejs npm)")
    package = CACHE / "node_modules" / "ollama" / "package.json"
    if not package.is_file() or not json.loads(package.read_text())["version"].startswith("0.6"):
        CACHE.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([npm, "install", "--prefix", str(CACHE), "--no-audit",
                               "--no-fund", "--no-save", PACKAGE],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not package.is_file():
            pytest.skip(f"npm could not install {PACKAGE}: {done.stderr.strip()[-300:]}")
    return CACHE


def test_ollama_js_client(server: RunningServer) -> None:
    folder = _installed()
    # In the cache folder, so that `import "ollama"` finds its node_modules.
    script = folder / f"run-{uuid.uuid4().hex}.mjs"
    script.write_text(SCRIPT)
    try:
        done = subprocess.run(["node", str(script), server.base_url, DEFAULT_MODEL],
                              capture_output=True, text=True, timeout=600)
    finally:
        script.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert f"{DEFAULT_MODEL}:latest" in out["listed"]
    assert out["family"] == "llama" and "completion" in out["capabilities"]
    assert out["generated"]["done"] and 0 < out["generated"]["eval_count"] <= 4
    chunks = out["chunks"]
    assert chunks[-1]["done"] and chunks[-1]["reason"] in ("stop", "length")
    assert not any(c["done"] for c in chunks[:-1])
    assert "".join(c["content"] + c["thinking"] for c in chunks)
    assert out["embeddings"] == [576, 576]
    assert out["missing"]["name"] == "ResponseError"
    assert out["missing"]["status_code"] == 404 and "not found" in out["missing"]["error"]
