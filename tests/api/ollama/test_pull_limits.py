"""/api/pull's bounds over real HTTP, against a slow local stand-in of the Hugging Face Hub:
two pulls at once (a third is a 503), one per file (a second is a 409), a client that
leaves cancels its download and the next pull resumes it; progress from a byte counter;
file names are the repo's own and stay under the models directory; free disk is checked
before the download (507) and while it runs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server

from edge_testkit.servers.local_hub import LocalHub

REPO = "edge-test/slow-GGUF"
SIZE = 6 * 2**20
RATE = 2**20  # bytes per second: a pull of SIZE takes about six seconds
FILES = {name: bytes([i]) * SIZE for i, name in enumerate(["a.gguf", "b.gguf", "c.gguf"], 1)}
ESCAPE = "sub/../../../escape.gguf"  # a name a hub could list


def _name(file: str) -> str:
    return f"hf.co/{REPO}:{file}"


def _hub_env(hub: LocalHub, tmp: Path, models: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp / "hf"),
            "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "EDGE_SERVER_MODELS_DIR": str(models)}


@pytest.fixture(scope="module")
def hub() -> Iterator[LocalHub]:
    files = {(REPO, name): data for name, data in FILES.items()}
    files[(REPO, ESCAPE)] = b"x" * 1024
    with LocalHub(files, rate=RATE) as running:
        yield running


@pytest.fixture(scope="module")
def pulls(tmp_path_factory: pytest.TempPathFactory,
          hub: LocalHub) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("pull-limits")
    server = start_server(tmp, "--ctx-size", "512", "--parallel", "1", name="pull-limits",
                          env=_hub_env(hub, tmp, tmp / "models"))
    yield server, tmp / "models"
    stop_server(server)
    assert "Traceback" not in server.log_text(), server.log_text()


def _gets(hub: LocalHub, file: str) -> list[str | None]:
    """The Range header of each GET of `file` (None: from its first byte)."""
    return [rng for method, path, rng in hub.requests
            if method == "GET" and path.endswith("/" + file)]


@contextlib.contextmanager
def _pulling(server: RunningServer, name: str) -> Iterator[Iterator[dict[str, Any]]]:
    """A streamed pull on a connection of its own, whose closing is the client leaving."""
    with httpx.Client(base_url=server.base_url, timeout=60) as client, \
            client.stream("POST", "/api/pull", json={"model": name}) as response:
        assert response.status_code == 200, response.read()
        yield (json.loads(text) for text in response.iter_lines() if text)


def _until_progress(lines: Iterator[dict[str, Any]]) -> dict[str, Any]:
    return next(step for step in lines if step.get("completed"))


def test_two_pulls_at_once_one_per_file_and_a_leaving_client_cancels(
        pulls: tuple[RunningServer, Path], hub: LocalHub) -> None:
    server, models = pulls
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(_pulling(server, _name("a.gguf")))
        assert next(first)["status"] == "pulling manifest"
        step = _until_progress(first)
        assert step["total"] == SIZE and 0 < step["completed"] < SIZE
        second = stack.enter_context(_pulling(server, _name("b.gguf")))
        _until_progress(second)
        third = httpx.post(f"{server.base_url}/api/pull", json={"model": _name("c.gguf")})
        assert third.status_code == 503, third.text
        assert int(third.headers["Retry-After"]) > 0 and set(third.json()) == {"error"}
        again = httpx.post(f"{server.base_url}/api/pull", json={"model": _name("a.gguf")})
        assert again.status_code == 409, again.text
        stack.pop_all().close()  # both clients leave mid-download
    assert not _gets(hub, "c.gguf")
    # Their downloads stop: the same file may be pulled again, and resumes.
    deadline = time.monotonic() + 15
    while True:
        with httpx.Client(base_url=server.base_url, timeout=60) as client, \
                client.stream("POST", "/api/pull", json={"model": _name("a.gguf")}) as r:
            if r.status_code == 200:
                steps = [json.loads(text) for text in r.iter_lines() if text]
                break
            assert r.status_code == 409 and time.monotonic() < deadline
        time.sleep(0.2)
    assert steps[-1] == {"status": "success"}, steps[-3:]
    done = [s["completed"] for s in steps if "completed" in s]
    assert done == sorted(done) and done[0] > 0 and done[-1] == SIZE
    ranges = _gets(hub, "a.gguf")
    assert ranges[0] is None and ranges[-1] is not None
    assert int(ranges[-1].removeprefix("bytes=").rstrip("-")) > 0  # resumed, not restarted
    assert (models / REPO / "a.gguf").read_bytes() == FILES["a.gguf"]
    assert (models / REPO / "b.gguf.incomplete").stat().st_size > 0  # kept to resume
    assert not (models / REPO / "b.gguf").exists()


@pytest.mark.parametrize(("name", "status"), [
    (_name("../../../outside.gguf"), 404),  # not a file the repo lists
    (f"hf.co/../{REPO.split('/')[1]}:a.gguf", 404),  # not a repo id
    (_name(ESCAPE), 400),  # listed, but it would be stored elsewhere
])
def test_file_names_are_the_repos_own_and_stay_in_the_models_directory(
        pulls: tuple[RunningServer, Path], hub: LocalHub, name: str, status: int) -> None:
    server, models = pulls
    for stream in (True, False):
        r = httpx.post(f"{server.base_url}/api/pull", json={"model": name, "stream": stream})
        assert r.status_code == status, r.text
        assert set(r.json()) == {"error"} and str(models) not in r.text
    assert not _gets(hub, "escape.gguf")
    assert not list(models.parent.glob("**/outside.gguf"))
    assert not list(models.parent.glob("**/escape.gguf"))


def test_free_disk_is_checked_before_the_download(tmp_path: Path, hub: LocalHub) -> None:
    server = start_server(tmp_path, "--ctx-size", "512", "--parallel", "1",
                          "--min-free-disk-mb", str(2**40), name="no-room",
                          env=_hub_env(hub, tmp_path, tmp_path / "models"))
    try:
        asked = len(_gets(hub, "c.gguf"))
        for stream in (True, False):
            r = httpx.post(f"{server.base_url}/api/pull",
                           json={"model": _name("c.gguf"), "stream": stream})
            assert r.status_code == 507, r.text
            assert "disk" in r.json()["error"] and str(tmp_path) not in r.text
        assert len(_gets(hub, "c.gguf")) == asked  # nothing downloaded
    finally:
        stop_server(server)


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 160 MiB filesystem of its own (a tmpfs), so that a test can fill it."""
    where = tmp_path / "small-disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(where)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip("filling a disk needs a small filesystem: mounting a tmpfs needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_disk_filling_during_the_download_stops_it(tmp_path: Path,
                                                     small_disk: Path) -> None:
    big = bytes(range(256)) * (100 * 2**20 // 256)  # 100 MiB: past one disk check
    with LocalHub({(REPO, "big.gguf"): big}, rate=16 * 2**20) as hub:
        server = start_server(tmp_path, "--ctx-size", "512", "--parallel", "1",
                              "--min-free-disk-mb", "8", "--prompt-cache-mb", "0",
                              name="filling", env=_hub_env(hub, tmp_path, small_disk / "m"))
        try:
            with _pulling(server, _name("big.gguf")) as steps:
                _until_progress(steps)
                # Someone else takes the disk: room left for the first 64 MiB, not the rest.
                filler = small_disk / "filler"
                with open(filler, "wb") as fh:
                    os.posix_fallocate(fh.fileno(), 0,
                                       shutil.disk_usage(small_disk).free - 72 * 2**20)
                last = list(steps)[-1]
            assert "disk" in last.get("error", ""), last
            partial = small_disk / "m" / REPO / "big.gguf.incomplete"
            assert 64 * 2**20 <= partial.stat().st_size < len(big)
            filler.unlink()
            with _pulling(server, _name("big.gguf")) as steps:
                assert list(steps)[-1] == {"status": "success"}
            assert _gets(hub, "big.gguf")[-1] is not None  # resumed where it stopped
            assert (small_disk / "m" / REPO / "big.gguf").read_bytes() == big
        finally:
            stop_server(server)
