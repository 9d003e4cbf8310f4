"""--cors-origins names browser extensions (`chrome-extension://ID`,
`moz-extension://UUID`, `safari-web-extension://UUID`): their requests and preflights
are answered with CORS headers; other extensions get the 403 other origins get."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from conftest import ROOT, RunningServer, start_server, stop_server

from edge_server.api.http.guards.cors import check_origin

CHROME = "chrome-extension://abcdefghijklmnopabcdefghijklmnop"
FIREFOX = "moz-extension://0c2d4c4e-6c39-4b3b-9a5e-2f1f8e4f2a11"
SAFARI = "safari-web-extension://E2A4C2D0-1B7C-4F6A-9C3E-5D8B7A6F4E21"


@pytest.fixture(scope="module")
def extensions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("cors-ext"), "--cors-origins",
                          f"{CHROME},{FIREFOX}", "--cors-origins", SAFARI,
                          "--ctx-size", "512", "--parallel", "1")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


@pytest.mark.parametrize("origin", [CHROME, FIREFOX, SAFARI])
def test_an_allowed_extension_calls_the_api(extensions: RunningServer, origin: str) -> None:
    preflight = httpx.options(f"{extensions.v1}/models", headers={
        "Origin": origin, "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == origin
    answer = httpx.get(f"{extensions.v1}/models", headers={"Origin": origin})
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == origin


@pytest.mark.parametrize("origin", [
    "chrome-extension://ponmlkjihgfedcbaponmlkjihgfedcba",  # another extension
    SAFARI.lower(),  # the ID in another case is another origin
    "moz-extension://0c2d4c4e-6c39-4b3b-9a5e-2f1f8e4f2a12",
])
def test_other_extensions_are_refused(extensions: RunningServer, origin: str) -> None:
    answer = httpx.get(f"{extensions.v1}/models", headers={"Origin": origin})
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "origin_not_allowed"


@pytest.mark.parametrize("origin", [
    f"{CHROME}:8080", f"{CHROME}/popup.html", f"{CHROME}?x=1", "chrome-extension://",
    "chrome-extension://bad_id!",
])
def test_malformed_extension_origins_are_refused(origin: str) -> None:
    with pytest.raises(ValueError, match="CORS origin"):
        check_origin(origin)


def test_a_malformed_extension_origin_stops_the_server_at_start() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edge_server", "serve", "--cors-origins",
         f"{CHROME}/popup.html"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2
    assert "popup.html" in result.stderr and "Traceback" not in result.stderr
