"""Hostile or oversized input: every path from HTTP to llama.cpp is bounded and validated.

Each refusal is a 4xx in the OpenAI error shape, answered within seconds, and the same
keep-alive connection then serves a normal request, and heavy request preparation runs
off the event loop (caller text as control tokens: test_control_token_text.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, free_port, start_server, stop_server

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]
FAST = 5.0  # seconds within which every refusal must come

# A ChatML template that skips system messages with {% continue %} and stops after 20
# messages with {% break %}: both need Jinja's loopcontrols extension.
LOOP_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{%- continue -%}{%- endif -%}"
    "{%- if loop.index > 20 -%}{%- break -%}{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A 1 MiB body cap, a 512-token context and a template with loop controls."""
    tmp = tmp_path_factory.mktemp("hardening")
    template = tmp / "loops.jinja"
    template.write_text(LOOP_TEMPLATE)
    server = start_server(
        tmp, "--max-body-mb", "1", "--ctx-size", "512", "--parallel", "2",
        "--chat-template-file", str(template), name="small",
    )
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text(), server.log_text()


def connection_of(response: httpx.Response) -> object:
    """The client's address of the connection that carried the response."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


def assert_refused(
    response: httpx.Response, elapsed: float, status: int, param: str | None = None
) -> dict:
    assert response.status_code == status, response.text
    assert elapsed < FAST, elapsed
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in response.text
    assert "/" not in error["message"].replace("/v1", "")  # no file paths
    if param is not None:
        assert error["param"] == param, error
    return error


def refused_then_served(
    base_url: str, status: int, param: str | None, *, path: str = CHAT, **request: object
) -> dict:
    """Sends the bad request, then a normal one on the same keep-alive connection."""
    with httpx.Client(base_url=base_url, timeout=60) as client:
        started = time.monotonic()
        bad = client.post(path, **request)  # type: ignore[arg-type]
        error = assert_refused(bad, time.monotonic() - started, status, param)
        good = client.post(CHAT, json={"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2})
        assert good.status_code == 200, good.text
        assert connection_of(good) == connection_of(bad), "the connection was dropped"
    return error


def raw(body: bytes) -> dict:
    return {"content": body, "headers": {"Content-Type": "application/json"}}


# --- malformed and oversized bodies ----------------------------------------------------


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_deeply_nested_body(server: RunningServer, depth: int) -> None:
    refused_then_served(server.base_url, 400, None, **raw(b"[" * depth))


def test_deeply_nested_field(server: RunningServer) -> None:
    body = b'{"model": "%s", "messages": [], "user": %s%s}' % (
        DEFAULT_MODEL.encode(), b"[" * 200, b"]" * 200)
    refused_then_served(server.base_url, 400, None, **raw(body))


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "messages": [], "temperature": NaN}',
        b'{"model": "m", "messages": [], "temperature": 1e400}',
        b'{"model": "m", "messages": [], "seed": 1' + b"0" * 5000 + b"}",
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
    ],
    ids=["nan", "overflow", "huge-int", "lone-surrogate"],
)
def test_bodies_json_cannot_carry(server: RunningServer, body: bytes) -> None:
    refused_then_served(server.base_url, 400, None, **raw(body))


def test_too_many_json_objects(server: RunningServer) -> None:
    messages = [{"role": "user", "content": "a"}] * 25_000
    error = refused_then_served(
        server.base_url, 413, None, json={"model": DEFAULT_MODEL, "messages": messages})
    assert error["code"] == "request_too_large"


def test_body_over_cap_by_content_length(small_server: RunningServer) -> None:
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "x" * 2**21}]}
    error = refused_then_served(small_server.base_url, 413, None, json=body)
    assert error["code"] == "request_too_large"


def test_body_over_cap_while_chunked(small_server: RunningServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "%s", "messages": [{"role": "user", "content": "' % DEFAULT_MODEL.encode()
        for _ in range(3):
            yield b"x" * 2**19
        yield b'"}]}'

    refused_then_served(small_server.base_url, 413, None, content=chunks(),
                        headers={"Content-Type": "application/json"})


def test_body_under_cap_is_read(small_server: RunningServer) -> None:
    body = {"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2, "user": "u" * 900_000}
    r = httpx.post(f"{small_server.base_url}{CHAT}", json=body, timeout=60)
    assert r.status_code == 200, r.text


# --- fields --------------------------------------------------------------------------------

FIELD_CASES = [
    # (path, extra fields, status, param)
    (COMP, {"logit_bias": {"²": 1}}, 400, "logit_bias"),
    (COMP, {"logit_bias": {"٣": 1}}, 400, "logit_bias"),
    (COMP, {"logit_bias": {"1" * 40: 1}}, 400, "logit_bias"),
    (COMP, {"logit_bias": {str(i): 1 for i in range(1025)}}, 400, "logit_bias"),
    (COMP, {"stop": ""}, 400, "stop"),
    (COMP, {"stop": ["a", ""]}, 400, "stop"),
    (CHAT, {"stop": "x" * 513}, 400, "stop"),
    (COMP, {"top_k": 2**40}, 400, "top_k"),
    (COMP, {"seed": 2**70}, 400, "seed"),
    (COMP, {"prompt": ["a"] * 129}, 400, "prompt"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]},
     400, "tools"),
    (
        CHAT,
        {"messages": [*MSG, {"role": "assistant", "content": None,
                             "tool_calls": [{"id": "c1", "type": "function", "function": "f"}]}]},
        400,
        "messages[1].tool_calls[0].function",
    ),
    (
        CHAT,
        {"messages": [*MSG, {"role": "assistant", "content": None,
                             "tool_calls": [{"id": "c1", "type": "function",
                                             "function": {"name": "f", "arguments": 5}}]}]},
        400,
        "messages[1].tool_calls[0].function.arguments",
    ),
]


@pytest.mark.parametrize(("path", "fields", "status", "param"), FIELD_CASES)
def test_bad_field(server: RunningServer, path: str, fields: dict, status: int,
                   param: str) -> None:
    base = {"model": DEFAULT_MODEL, "max_tokens": 2}
    base.update({"messages": MSG} if path == CHAT else {"prompt": "x"})
    refused_then_served(server.base_url, status, param, path=path, json={**base, **fields})


def test_tool_call_arguments_as_object_are_accepted(http: httpx.Client) -> None:
    messages = [
        {"role": "user", "content": "Add 2 and 3"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2}}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    r = http.post(CHAT, json={"model": DEFAULT_MODEL, "messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text


# --- prompt sizes, refused before tokenizing -------------------------------------------------


def test_megabytes_of_prompt_text(server: RunningServer) -> None:
    body = {"model": DEFAULT_MODEL, "prompt": "hello world " * 500_000, "max_tokens": 2}
    error = refused_then_served(server.base_url, 400, "prompt", path=COMP, json=body)
    assert error["type"] == "invalid_request_error"


def test_megabytes_of_chat_message(server: RunningServer) -> None:
    body = {"model": DEFAULT_MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello world " * 500_000}]}
    error = refused_then_served(server.base_url, 400, "messages", json=body)
    assert error["type"] == "invalid_request_error"


def test_token_prompt_longer_than_context(server: RunningServer) -> None:
    body = {"model": DEFAULT_MODEL, "prompt": [42] * 1_000_000, "max_tokens": 2}
    refused_then_served(server.base_url, 400, "prompt", path=COMP, json=body)


def test_more_messages_than_context(small_server: RunningServer) -> None:
    body = {"model": DEFAULT_MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": "a"}] * 600}
    refused_then_served(small_server.base_url, 400, "messages", json=body)


# --- prompt injection -----------------------------------------------------------------------


# --- templates and engine lifecycle ----------------------------------------------------------


def test_template_with_loop_controls(small_server: RunningServer) -> None:
    with httpx.Client(base_url=small_server.base_url, timeout=60) as client:
        r = client.post(CHAT, json={"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2})
        assert r.status_code == 200, r.text

        def tokens(messages: list[dict]) -> list[int]:
            r = client.post("/tokenize", json={"model": DEFAULT_MODEL, "messages": messages})
            assert r.status_code == 200, r.text
            return r.json()["tokens"]

        with_system = tokens([{"role": "system", "content": "Zebra stripes."}, *MSG])
        assert with_system == tokens(MSG)  # {% continue %} skipped the system message
        # Few enough to tokenize within a stream (/tokenize is bounded like a prompt).
        many = [{"role": "user", "content": "a"}] * 30
        assert tokens(many) == tokens(many[:20])  # {% break %} stopped after 20


def test_engine_frees_the_model_when_the_template_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_server.catalogue.default_model import default_model_path
    from edge_server.engine import ContextSettings, Engine, EngineSettings
    from edge_server.engine.backend.llama_model import LlamaModel
    from edge_server.engine.chat_template import TemplateError

    closed: list[LlamaModel] = []
    close = LlamaModel.close

    def recording_close(self: LlamaModel) -> None:
        closed.append(self)
        close(self)

    monkeypatch.setattr(LlamaModel, "close", recording_close)
    settings = EngineSettings(context=ContextSettings(n_ctx=256), chat_template="{% for %}")
    with pytest.raises(TemplateError):
        Engine("broken", default_model_path(), settings)
    assert len(closed) == 1
    assert closed[0].model is None and closed[0].ctx is None


def test_unexpected_error_is_500_and_keeps_the_connection() -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from edge_server.api.http.errors import EXCEPTION_HANDLERS, ErrorBoundary

    async def boom(_: Request) -> JSONResponse:
        raise RuntimeError("a bug")

    async def fine(_: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/boom", boom), Route("/fine", fine)],
                    middleware=[Middleware(ErrorBoundary)],
                    exception_handlers=EXCEPTION_HANDLERS)  # type: ignore[arg-type]
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            bad = client.get("/boom")
            assert bad.status_code == 500
            assert bad.json()["error"]["type"] == "server_error"
            assert "a bug" not in bad.text
            good = client.get("/fine")
            assert good.status_code == 200
            assert connection_of(good) == connection_of(bad)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


# --- preparation off the event loop ----------------------------------------------------------


def test_huge_requests_do_not_stall_a_stream(server: RunningServer) -> None:
    """While megabyte requests are read, rendered, tokenized or refused, the event loop
    keeps answering other connections and the stream runs to its end."""
    text = "hello world " * 340_000  # about 4 MB
    heavy = [
        (CHAT, {"model": DEFAULT_MODEL, "max_tokens": 1,
                "messages": [{"role": "user", "content": text}]}, 400),
        # More tokens than a prompt may hold: refused like one, after reading 4 MB.
        ("/tokenize", {"model": DEFAULT_MODEL, "content": text}, 400),
    ]
    results: list[tuple[int, int, float]] = []
    latencies: list[float] = []
    done = threading.Event()

    def send(path: str, body: dict, expected: int) -> None:
        started = time.monotonic()
        r = httpx.post(f"{server.base_url}{path}", json=body, timeout=60)
        results.append((expected, r.status_code, time.monotonic() - started))

    def probe() -> None:
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            while not done.is_set():
                started = time.monotonic()
                client.get("/v1/models")
                latencies.append(time.monotonic() - started)
                time.sleep(0.02)

    body = {"model": DEFAULT_MODEL, "prompt": "Once upon a time", "max_tokens": 16,
            "ignore_eos": True, "temperature": 0, "stream": True}
    chunks = 0
    workers: list[threading.Thread] = []
    with httpx.stream("POST", f"{server.base_url}{COMP}", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunks += 1
            if chunks == 1:  # the stream is running: now the heavy requests arrive
                workers = [threading.Thread(target=send, args=h) for h in heavy]
                workers.append(threading.Thread(target=probe))
                for worker in workers:
                    worker.start()
    for worker in workers[:-1]:
        worker.join()
    done.set()
    workers[-1].join()

    assert chunks >= 16  # the stream ran to its end
    for expected, status, elapsed in results:
        assert status == expected
        assert status == 200 or elapsed < FAST
    assert latencies and max(latencies) < 1.0, latencies

