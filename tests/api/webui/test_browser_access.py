"""Who may use the server from a browser: the chat page's API-key prompt, CORS for pages of
other origins (an allow-list; others refused with a 403), and --no-webui.

One server with an API key and `--cors-origins http://127.0.0.1:<page port>`; a plain
static server on that port holds a blank page, reached as the allowed origin
(http://127.0.0.1:<port>) and as a refused one (http://localhost:<port>).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import DEFAULT_MODEL, ROOT, RunningServer, free_port, start_server, stop_server

from edge_testkit.browser import browser, console_errors, open_page, wait_for

KEY = "open-sesame"
CHAT = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2}
# From a page of another origin: a chat request that needs a preflight (JSON, a key).
CROSS_ORIGIN_FETCH = """
const [url, key, body, done] = arguments;
const headers = {"Content-Type": "application/json"};
if (key) headers.Authorization = "Bearer " + key;
fetch(url, {method: "POST", headers, body})
  .then(async (r) => done({status: r.status, replica: r.headers.get("x-edge-replica"),
                           body: await r.json()}))
  .catch((e) => done({failed: String(e)}));
"""


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A static server for a blank page; its port."""
    root = tmp_path_factory.mktemp("origin")
    (root / "blank.html").write_text("<!doctype html><title>another origin</title>")
    handler = functools.partial(QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, page_origin: int
            ) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("guarded"), "--api-key", KEY,
                          "--cors-origins", f"http://127.0.0.1:{page_origin}",
                          "--max-body-mb", "1", "--parallel", "1", "--ctx-size", "1024",
                          name="guarded")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text(), server.log_text()


@pytest.fixture(scope="module")
def allowed(page_origin: int) -> str:
    return f"http://127.0.0.1:{page_origin}"


def authorized() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def served_routes(server: RunningServer) -> list[tuple[str, str]]:
    paths = httpx.get(f"{server.base_url}/openapi.json", headers=authorized()).json()["paths"]
    return [(method.upper(), path.replace("{model}", DEFAULT_MODEL))
            for path, item in paths.items() for method in item]


def test_preflight_from_an_allowed_origin_on_every_api_route(guarded: RunningServer,
                                                              allowed: str) -> None:
    routes = served_routes(guarded)
    assert ("POST", "/v1/chat/completions") in routes and len(routes) >= 10
    for method, path in routes:
        r = httpx.options(f"{guarded.base_url}{path}", headers={
            "Origin": allowed, "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
        assert r.status_code == 200, (method, path, r.text)
        assert r.headers["access-control-allow-origin"] == allowed
        assert method in r.headers["access-control-allow-methods"]
        assert r.headers["access-control-allow-headers"] == (
            "authorization, content-type, x-stainless-os")
        assert int(r.headers["access-control-max-age"]) > 0
        assert "origin" in r.headers["vary"].lower()


def test_answers_and_errors_to_an_allowed_origin_carry_the_headers(guarded: RunningServer,
                                                                    allowed: str) -> None:
    origin = {"Origin": allowed}
    url = f"{guarded.v1}/chat/completions"
    answers = {
        "ok": httpx.post(url, json=CHAT, headers={**origin, **authorized()}, timeout=60),
        "no key": httpx.post(url, json=CHAT, headers=origin),
        "body too large": httpx.post(url, content=b"{" + b" " * 2**20 + b"}",
                                     headers={**origin, **authorized()}),
        "unknown route": httpx.get(f"{guarded.v1}/nowhere", headers={**origin, **authorized()}),
        "anthropic, no key": httpx.post(f"{guarded.v1}/messages", json=CHAT, headers=origin),
    }
    statuses = {name: r.status_code for name, r in answers.items()}
    assert statuses == {"ok": 200, "no key": 401, "body too large": 413, "unknown route": 404,
                        "anthropic, no key": 401}
    for name, r in answers.items():
        assert r.headers["access-control-allow-origin"] == allowed, name
        assert "X-Edge-Replica" in r.headers["access-control-expose-headers"], name
    assert answers["no key"].json()["error"]["code"] == "invalid_api_key"
    assert answers["anthropic, no key"].json()["error"]["type"] == "authentication_error"
    with httpx.stream("POST", url, json={**CHAT, "stream": True}, timeout=60,
                      headers={**origin, **authorized()}) as stream:
        assert stream.status_code == 200
        assert stream.headers["access-control-allow-origin"] == allowed
        assert "[DONE]" in stream.read().decode()


def test_other_origins_are_refused_in_the_protocols_shape(guarded: RunningServer) -> None:
    evil = {"Origin": "http://evil.example", **authorized()}
    chat = httpx.post(f"{guarded.v1}/chat/completions", json=CHAT, headers=evil)
    preflight = httpx.options(f"{guarded.v1}/chat/completions", headers={
        **evil, "Access-Control-Request-Method": "POST"})
    messages = httpx.post(f"{guarded.v1}/messages", json=CHAT, headers=evil)
    for r in (chat, preflight, messages):
        assert r.status_code == 403, r.text
        assert "access-control-allow-origin" not in r.headers
    error = chat.json()["error"]
    assert error["code"] == "origin_not_allowed" and "evil.example" in error["message"]
    assert preflight.json()["error"]["code"] == "origin_not_allowed"
    assert messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "permission_error"
    # The port counts: the server's own host on another port is another origin.
    other_port = httpx.post(f"{guarded.v1}/chat/completions", json=CHAT, headers={
        **authorized(), "Origin": "http://127.0.0.1:1"})
    assert other_port.status_code == 403


def test_own_origin_and_no_origin_pass(guarded: RunningServer) -> None:
    own = httpx.post(f"{guarded.v1}/chat/completions", json=CHAT, timeout=60,
                     headers={**authorized(), "Origin": guarded.base_url})
    plain = httpx.post(f"{guarded.v1}/chat/completions", json=CHAT, timeout=60,
                       headers=authorized())
    assert own.status_code == plain.status_code == 200
    assert "access-control-allow-origin" not in own.headers


def test_the_page_needs_no_key_and_has_a_strict_csp(guarded: RunningServer) -> None:
    page = httpx.get(guarded.base_url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "<script>" not in page.text and " style=" not in page.text  # no inline code
    assert page.headers["x-content-type-options"] == "nosniff"
    asset = httpx.get(guarded.base_url + "/webui/app.js")
    assert asset.status_code == 200 and "javascript" in asset.headers["content-type"]
    again = httpx.get(guarded.base_url + "/webui/app.js",
                      headers={"If-None-Match": asset.headers["etag"]})
    assert again.status_code == 304
    for name in ("nope.js", "%2E%2E/pyproject.toml", "vendor/%2E%2E/%2E%2E/api_router.py"):
        missing = httpx.get(f"{guarded.base_url}/webui/{name}")
        assert missing.status_code == 404, name  # only the page's own files, by name
        assert missing.json()["error"]["code"] == "unknown_url"
    assert httpx.get(f"{guarded.v1}/models").status_code == 401  # the API still needs it


def test_page_and_assets_stay_small() -> None:
    static = ROOT / "edge_server" / "api" / "webui" / "static"
    served = [p for p in static.rglob("*") if p.is_file() and "LICENSE" not in p.name]
    assert sum(p.stat().st_size for p in served) < 300 * 1024


def test_api_key_flow_in_the_browser(guarded: RunningServer,
                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    def by_id(element_id: str) -> Any:
        return driver.find_element(By.ID, element_id)

    def dialog_open() -> bool:
        return bool(driver.execute_script("return document.getElementById('key-dialog').open"))

    with browser(tmp_path_factory) as driver:
        open_page(driver, guarded.base_url + "/")
        assert dialog_open() and not by_id("prompt").is_enabled()
        assert driver.execute_script("return document.querySelectorAll('#model-picker option')"
                                     ".length") == 0  # nothing works without the key
        by_id("key-input").send_keys("wrong key", Keys.ENTER)
        wait_for(lambda: by_id("key-error").is_displayed(), 10, "the key to be refused")
        assert dialog_open() and "refused" in by_id("key-error").text
        by_id("key-input").send_keys(KEY, Keys.ENTER)
        wait_for(lambda: by_id("prompt").is_enabled(), 10, "the page to accept the key")
        assert not dialog_open()
        driver.execute_script("localStorage.setItem('edge-chat.settings',"
                              "JSON.stringify({max_tokens: '4'}))")
        open_page(driver, guarded.base_url + "/")  # a reload keeps the key for this tab
        assert not dialog_open() and by_id("prompt").is_enabled()
        by_id("prompt").send_keys("Hello", Keys.ENTER)
        wait_for(lambda: driver.execute_script(
            "return document.querySelector('.msg.assistant')?.dataset.state === 'done'"),
            60, "the answer")
        assert driver.execute_script("return sessionStorage.getItem('edge-chat.api-key')") == KEY
        kept = json.dumps(driver.execute_script("return {...localStorage}"))
        assert KEY not in kept  # never in the long-lived storage
        errors = console_errors(driver)
        # The refused requests show as failed loads; nothing else (no CSP violation).
        assert all("401" in e for e in errors), errors
        by_id("key-button").click()
        by_id("key-forget").click()
        open_page(driver, guarded.base_url + "/")
        assert dialog_open()


def test_cors_in_the_browser(guarded: RunningServer, page_origin: int,
                             tmp_path_factory: pytest.TempPathFactory) -> None:
    url = f"{guarded.v1}/chat/completions"
    body = json.dumps(CHAT)
    with browser(tmp_path_factory) as driver:
        driver.get(f"http://127.0.0.1:{page_origin}/blank.html")
        ok = driver.execute_async_script(CROSS_ORIGIN_FETCH, url, KEY, body)
        assert ok.get("status") == 200, ok
        assert ok["replica"]  # an exposed header is readable
        assert ok["body"]["choices"][0]["message"]["role"] == "assistant"
        no_key = driver.execute_async_script(CROSS_ORIGIN_FETCH, url, "", body)
        assert no_key.get("status") == 401  # the error is readable too
        assert no_key["body"]["error"]["code"] == "invalid_api_key"
        driver.get(f"http://localhost:{page_origin}/blank.html")  # another origin
        refused = driver.execute_async_script(CROSS_ORIGIN_FETCH, url, KEY, body)
        assert "failed" in refused, refused  # the browser saw the refusal


def test_no_webui(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--parallel", "1", "--ctx-size", "512", name="no-webui",
                          env={"EDGE_SERVER_NO_WEBUI": "1"})
    try:
        page = httpx.get(server.base_url + "/")
        assert page.status_code == 404 and page.json()["error"]["code"] == "unknown_url"
        assert httpx.get(server.base_url + "/webui/app.js").status_code == 404
        assert httpx.get(f"{server.v1}/models").status_code == 200
    finally:
        stop_server(server)


def test_bad_cors_origin_is_refused_at_start() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edge_server", "serve", "--cors-origins",
         "http://ok.example,ftp://bad.example/path"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2
    assert "ftp://bad.example/path" in result.stderr and "Traceback" not in result.stderr


def test_webui_and_cors_options_from_flags_environment_and_file(tmp_path: Path) -> None:
    import argparse

    from edge_server.config import add_serve_arguments, resolve_options

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    defaults = resolve_options(parser.parse_args([]), {})
    assert defaults.no_webui is False and defaults.cors_origins == []
    flags = parser.parse_args(["--no-webui", "--cors-origins", "http://a.example",
                               "--cors-origins", "http://b.example"])
    assert resolve_options(flags, {}).no_webui is True
    assert resolve_options(flags, {}).cors_origins == ["http://a.example", "http://b.example"]
    env = {"EDGE_SERVER_NO_WEBUI": "yes",
           "EDGE_SERVER_CORS_ORIGINS": "http://a.example, http://localhost:3000"}
    opts = resolve_options(parser.parse_args([]), env)
    assert opts.no_webui is True
    assert opts.cors_origins == ["http://a.example", "http://localhost:3000"]
    assert resolve_options(parser.parse_args([]), {"EDGE_SERVER_NO_WEBUI": "0"}).no_webui is False
    config = tmp_path / "edge.toml"
    config.write_text('no-webui = true\ncors-origins = ["https://c.example"]\n')
    from_file = resolve_options(parser.parse_args(["--config", str(config)]), {})
    assert from_file.no_webui is True and from_file.cors_origins == ["https://c.example"]
    with pytest.raises(ValueError, match="maybe"):
        resolve_options(parser.parse_args([]), {"EDGE_SERVER_NO_WEBUI": "maybe"})
