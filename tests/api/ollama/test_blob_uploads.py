"""Blob uploads (/api/blobs) share the disk's room: uploads in flight together cannot take
more than the free disk less the margin, and an upload that does not finish leaves no
file, whether its client goes, the server stops mid-way, or a process died with it.

Real servers over raw sockets (an upload that declares more than it sends, as a client
cut off mid-way would); their models directory is on a RAM disk where there is one, so
that the free space the test counts on is not moved by other programs writing files."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RunningServer, start_server, stop_server, until

MIB = 2**20
ROOM = 300 * MIB  # what the server may fill: the free space less --min-free-disk-mb
DIGEST = "sha256:" + "0" * 64


def _models_dir(tmp: Path) -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="edge-blobs-", dir=shm))
    return tmp / "models"


def _start(tmp: Path, models: Path, name: str, *args: str) -> RunningServer:
    models.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(models).free
    return start_server(tmp, "--ctx-size", "512", "--parallel", "1", "--threads", "1",
                        "--min-free-disk-mb", str((free - ROOM) // MIB), *args, name=name,
                        env={"EDGE_SERVER_MODELS_DIR": str(models)})


@pytest.fixture()
def models(tmp_path: Path) -> Iterator[Path]:
    path = _models_dir(tmp_path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _uploads(models: Path) -> list[Path]:
    return list((models / "blobs").glob(".upload-*"))


def _upload(server: RunningServer, declared: int | None, send: int = MIB) -> socket.socket:
    """An upload that sends `send` bytes of the `declared` (None: chunked) and waits."""
    port = int(server.base_url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    framing = "Transfer-Encoding: chunked" if declared is None else f"Content-Length: {declared}"
    sock.sendall(f"POST /api/blobs/{DIGEST} HTTP/1.1\r\nHost: 127.0.0.1\r\n{framing}\r\n\r\n"
                 .encode())
    body = b"GGUF" + bytes(send - 4)
    sock.sendall(body if declared is not None else b"%x\r\n%s\r\n" % (len(body), body))
    return sock


def _answer(sock: socket.socket, seconds: float) -> str | None:
    """The status line the server sent within `seconds`, None when it sent none (it is
    still reading the upload)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(4096).decode("latin-1").split("\r\n", 1)[0] or None
    except TimeoutError:
        return None


@pytest.mark.parametrize(("first", "second"), [
    (200 * MIB, 200 * MIB),  # declared: reserved at once
    (None, 260 * MIB),  # chunked: reserved 64 MiB at a time as it arrives
])
def test_uploads_in_flight_share_the_room(tmp_path: Path, models: Path, first: int | None,
                                          second: int) -> None:
    server = _start(tmp_path, models, "blobs-room")
    try:
        held = _upload(server, first)
        assert until(lambda: len(_uploads(models)) == 1)
        assert _answer(held, 0.5) is None  # admitted: being read
        # Fits the free disk alone, not with the first: refused at once.
        refused = _upload(server, second, send=4)
        assert (_answer(refused, 10) or "").endswith("413 Request Entity Too Large")
        refused.close()
        held.close()  # the client goes: its file and its room with it
        assert until(lambda: not _uploads(models)), _uploads(models)
        admitted = _upload(server, second)
        assert _answer(admitted, 1.0) is None
        admitted.close()
        assert until(lambda: not _uploads(models)), _uploads(models)
    finally:
        stop_server(server)
    assert "Traceback" not in server.log_text(), server.log_text()


def test_an_upload_cut_by_a_stopping_server_leaves_no_file(tmp_path: Path, models: Path
                                                           ) -> None:
    server = _start(tmp_path, models, "blobs-stop", "--drain-timeout", "1")
    held = _upload(server, 100 * MIB)
    try:
        assert until(lambda: len(_uploads(models)) == 1)
        server.process.send_signal(signal.SIGTERM)  # the drain ends before the upload
        server.process.wait(timeout=60)
    finally:
        held.close()
        stop_server(server)
    assert not _uploads(models)


def test_unfinished_uploads_nobody_writes_go_at_start(tmp_path: Path, models: Path) -> None:
    blobs = models / "blobs"
    blobs.mkdir(parents=True)
    hour_ago = time.time() - 3600
    stale, held, fresh = (blobs / f".upload-{n}" for n in ("stale", "held", "fresh"))
    for path in (stale, held, fresh):
        path.write_bytes(b"GGUF")
    for path in (stale, held):
        os.utime(path, (hour_ago, hour_ago))
    with open(held, "rb") as writing:  # another replica's upload in flight
        fcntl.flock(writing, fcntl.LOCK_EX)
        server = _start(tmp_path, models, "blobs-start")
        stop_server(server)
    assert not stale.exists()
    assert held.exists() and fresh.exists()  # being written, or maybe just created
