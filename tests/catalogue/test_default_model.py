"""The embedded model is served from the faster, on this machine, of its packaged Q4_1 file
and its Q8_0 conversion, made once into the user's cache by the real llama.cpp quantizer
(and timed once); the packaged file stays as it is, and serves where the conversion
cannot be made or is turned off."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import DEFAULT_MODEL, ROOT, start_server, stop_server

from edge_server.catalogue.default_conversion import (
    PACKAGED,
    ConversionError,
    cache_dir,
    convert_q8_0,
    served_default_model_path,
)
from edge_server.catalogue.default_conversion import Q8_0 as Q8_0_QUANT
from edge_server.catalogue.default_model import default_model_path

Q4_1, Q8_0 = 3, 7  # general.file_type (llama_ftype)


def file_type(path: Path) -> int:
    """general.file_type as llama.cpp reads it (a vocabulary-only load: no weights)."""
    import llama_cpp as lc

    from edge_server.engine.backend.runtime import init_backend

    init_backend()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    assert model, path
    try:
        value = ctypes.create_string_buffer(32)
        assert lc.llama_model_meta_val_str(model, b"general.file_type", value, 32) > 0
        return int(value.value)
    finally:
        lc.llama_model_free(model)


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An XDG_CACHE_HOME holding the packaged model's conversion, made once here."""
    home = tmp_path_factory.mktemp("cache-home")
    convert_q8_0(default_model_path(), home / "edge-server" / "default-model")
    return home


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    """A copy of the packaged file, whose identity a test may change."""
    copy = tmp_path / "src" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    copy.parent.mkdir()
    shutil.copy2(default_model_path(), copy)
    return copy


def test_conversion_is_q8_0_and_leaves_the_packaged_file(
        cache_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packaged = default_model_path()
    before = packaged.stat()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    served = served_default_model_path(Q8_0_QUANT)
    assert served.parent == cache_home / "edge-server" / "default-model" == cache_dir()
    assert served.name.startswith("SmolLM2-135M-Instruct.Q8_0.") and served.suffix == ".gguf"
    assert file_type(served) == Q8_0 and file_type(packaged) == Q4_1
    after = packaged.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    # Only the converted file and the lock: no partial file left behind.
    assert sorted(p.name for p in served.parent.iterdir()) == [".lock", served.name]


def test_a_second_call_reuses_the_file(cache_home: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    first = served_default_model_path(Q8_0_QUANT)
    mtime = first.stat().st_mtime_ns
    started = time.monotonic()
    again = served_default_model_path(Q8_0_QUANT)
    assert again == first and again.stat().st_mtime_ns == mtime
    assert time.monotonic() - started < 0.5  # a stat, not a conversion (about a second)


def test_a_changed_source_converts_again(source: Path, tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    directory.mkdir()
    dead = directory / ".SmolLM2-135M-Instruct.Q8_0.0.gguf.1.part"  # a killed conversion's
    dead.write_bytes(b"GGUF")
    first = convert_q8_0(source, directory)
    assert not dead.exists()
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # reinstalled
    second = convert_q8_0(source, directory)
    assert second != first and second.parent == directory
    assert file_type(second) == Q8_0 and first.is_file()


def test_servers_starting_together_convert_once(source: Path, tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO)\n"
            "from pathlib import Path\n"
            "from edge_server.catalogue.default_conversion import convert_q8_0\n"
            "print(convert_q8_0(Path(sys.argv[1]), Path(sys.argv[2])))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(source), str(directory)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert outputs[0][0] == outputs[1][0]
    assert sum("converted the default model" in err for _, err in outputs) == 1, outputs
    assert file_type(Path(outputs[0][0].strip())) == Q8_0


def test_a_failed_conversion_leaves_no_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    directory = tmp_path / "cache"
    with pytest.raises(ConversionError):
        convert_q8_0(broken, directory)
    assert [p.name for p in directory.iterdir()] == [".lock"]


def test_an_unwritable_cache_serves_the_packaged_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A regular file where the cache directory would go: unwritable even for root.
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with caplog.at_level(logging.WARNING, logger="edge_server.catalogue.default_conversion"):
        assert served_default_model_path() == default_model_path()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "packaged" in warnings[0].getMessage()


def _pull_default(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_server", "pull", DEFAULT_MODEL],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_the_opt_out_serves_the_packaged_file(
        cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(empty))
    assert served_default_model_path(PACKAGED) == default_model_path()
    assert not empty.exists()  # nothing converted
    # Through the command line: the variable and the config file reach the store.
    opted_out = _pull_default({"XDG_CACHE_HOME": str(empty),
                               "EDGE_SERVER_DEFAULT_MODEL_QUANT": "packaged"})
    assert opted_out.returncode == 0, opted_out.stderr
    assert opted_out.stdout.strip() == str(default_model_path())
    config = tmp_path / "edge.toml"
    config.write_text('default-model-quant = "packaged"\n')
    from_file = _pull_default({"XDG_CACHE_HOME": str(empty), "EDGE_SERVER_CONFIG": str(config)})
    assert from_file.stdout.strip() == str(default_model_path()), from_file.stderr
    served = _pull_default({"XDG_CACHE_HOME": str(cache_home)})
    assert served.returncode == 0, served.stderr
    assert Path(served.stdout.strip()).parent == cache_home / "edge-server" / "default-model"
    wrong = _pull_default({"EDGE_SERVER_DEFAULT_MODEL_QUANT": "q4_0"})
    assert wrong.returncode != 0 and "--default-model-quant" in wrong.stderr


def test_auto_serves_the_faster_file_timed_once(tmp_path: Path) -> None:
    """`auto` (the default) times the packaged file against its conversion on this
    machine's kernels, serves the faster and keeps the choice; a machine too busy to time
    them within the budget serves the conversion and times again at the next start."""
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache), "EDGE_SERVER_DEFAULT_MODEL_QUANT": "auto"}
    first = _pull_default(env)
    assert first.returncode == 0, first.stderr
    served = Path(first.stdout.strip())
    directory = cache / "edge-server" / "default-model"
    choices = directory / "choice.json"
    if "too busy" in first.stderr:
        assert served.parent == directory and not choices.exists()
        return
    assert "the faster on this machine's kernels" in first.stderr
    kept = json.loads(choices.read_text())
    assert list(kept.values()) == ["packaged" if served == default_model_path() else "q8_0"]
    again = _pull_default(env)
    assert again.stdout == first.stdout
    assert "as measured before" in again.stderr and "timed in" not in again.stderr


def test_the_server_serves_the_conversion(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    server = start_server(tmp_path, "--parallel", "1", "--ctx-size", "512",
                          "--default-model-quant", "q8_0", env={"XDG_CACHE_HOME": str(cache)})
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            props = http.get("/props").json()
            assert props["model_path"].startswith("SmolLM2-135M-Instruct.Q8_0.")
            assert (cache / "edge-server" / "default-model" / props["model_path"]).is_file()
            shown = http.post("/api/show", json={"model": DEFAULT_MODEL}).json()
            assert shown["details"]["quantization_level"] == "Q8_0"
            answer = http.post("/v1/completions", json={
                "model": DEFAULT_MODEL, "prompt": "The capital of France is",
                "max_tokens": 4, "temperature": 0}).json()
            assert answer["usage"]["completion_tokens"] > 0 and answer["choices"][0]["text"]
    finally:
        stop_server(server)
    assert "converted the default model to Q8_0" in server.log_text()
    assert "Traceback" not in server.log_text()
