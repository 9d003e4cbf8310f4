"""--ssl-certfile / --ssl-keyfile: the server speaks https (uvicorn's TLS), checked
against a self-signed certificate this test makes with the openssl command."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, RunningServer, free_port, stop_server

from edge_testkit.models.make_test_fim_model import write_model as write_fim_model

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_https_with_a_self_signed_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    model = write_fim_model(tmp_path / "fim.gguf")
    port = free_port()
    log = tmp_path / "tls.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "edge_server", "serve", "--port", str(port), "--model",
         str(model), "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    server = RunningServer(f"https://127.0.0.1:{port}", process, log)
    try:
        # conftest's health probe speaks plain http: this one trusts the certificate.
        trusted = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(verify=trusted, timeout=60) as client:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if client.get(f"{server.base_url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert process.poll() is None and time.monotonic() < deadline, \
                    server.log_text()
                time.sleep(0.2)
            r = client.post(f"{server.base_url}/v1/completions",
                            json={"prompt": "def", "max_tokens": 2})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] >= 1
        with pytest.raises(httpx.HTTPError):  # plain http on the TLS port
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is not trusted
            httpx.get(f"{server.base_url}/health", timeout=10)
    finally:
        assert stop_server(server) == 0
    assert "Traceback" not in server.log_text()


def test_a_keyfile_alone_is_refused(tmp_path: Path) -> None:
    _, key = self_signed(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "edge_server", "serve", "--ssl-keyfile", str(key)],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "go together" in result.stderr
