"""A model whose file is deleted while it is loaded keeps serving until it is unloaded,
and unloads cleanly: its prompt caches, keyed by the file, are not kept, and nothing
raises."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
from conftest import start_server, stop_server

from edge_server.catalogue.default_model import default_model_path

SPARE = "spare-model"


def test_a_model_whose_file_went_away_unloads_cleanly(tmp_path: Path) -> None:
    spare = tmp_path / "spare.gguf"
    shutil.copy(default_model_path(), spare)
    registry = tmp_path / "registry.toml"
    registry.write_text(f'[[models]]\nid = "{SPARE}"\npath = "{spare}"\n')
    server = start_server(tmp_path, "--registry", str(registry), "--parallel", "1",
                          "--ctx-size", "1024", name="file-removed")
    try:
        prompt = "Ledger: " + "amber cedar ember " * 60  # long enough to be worth keeping
        first = httpx.post(f"{server.v1}/completions", timeout=120, json={
            "model": SPARE, "prompt": prompt, "max_tokens": 2})
        assert first.status_code == 200, first.text
        spare.unlink()
        unloaded = httpx.post(f"{server.base_url}/api/generate", timeout=120,
                              json={"model": SPARE, "keep_alive": 0})
        assert unloaded.status_code == 200 and unloaded.json()["done_reason"] == "unload"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ps = httpx.get(f"{server.base_url}/api/ps", timeout=30)
            assert ps.status_code == 200, ps.text
            if not any(m["model"].startswith(SPARE) for m in ps.json()["models"]):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the model was not unloaded")
    finally:
        stop_server(server)
    log = server.log_text()
    assert "Traceback" not in log, log
    assert "its file is gone" in log
