"""How the fuzz campaign judges answers: an error in the protocol's shape with a 4xx,
a 503/429 for overload, or a well-formed answer; never a 5xx, a hang or a broken shape."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from edge_testkit.fuzz.bounds import DETOKENIZE, TOKENIZE
from edge_testkit.fuzz.edges import APPLY_TEMPLATE, COUNT_TOKENS, INFILL
from edge_testkit.fuzz.extras import RERANK_PATHS, SLOTS
from edge_testkit.fuzz.stored import INPUT_ITEMS, STORED, STORED_IDS
from edge_testkit.fuzz.strategies import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    MODEL,
    NATIVE,
    RESPONSES,
    TIMEOUT_S,
    Case,
)

# --- judging answers ---------------------------------------------------------------------

ERROR_KEYS = {"message", "type", "param", "code"}
# SSE and NDJSON lines end at CR, LF or CRLF only: str.splitlines() also splits at
# U+0085, U+2028 and others, which JSON strings may hold unescaped.
_LINE_END = re.compile(r"\r\n|\r|\n")


def text_lines(body: bytes) -> list[str]:
    return _LINE_END.split(body.decode("utf-8", "replace"))


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str | bytes) -> Any:
    """JSON as a strict client reads it: NaN and Infinity, which Python's json module
    writes and reads, fail it as any other text that is not JSON."""
    return json.loads(text, parse_constant=_not_json)


@dataclass
class Result:
    case: Case
    status: int | None  # None: no answer (timeout, dropped connection)
    seconds: float
    failure: str | None  # None: an answer the server may give
    detail: str  # the start of the answer, or the transport error


def _error_of(body: bytes) -> dict[str, Any] | str:
    """The error object of an error answer, or what is wrong with its shape."""
    try:
        data = strict_json(body)
    except ValueError:
        return "error answer is not JSON"
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict) or set(error) != ERROR_KEYS:
        return "error answer is not in the OpenAI shape"
    if not isinstance(error["message"], str) or not error["message"]:
        return "error message is not a non-empty string"
    return error


def _judge_stream(body: bytes, path: str) -> str | None:
    events = [line[6:] for line in text_lines(body)
              if line.startswith("data: ")]
    if path == RESPONSES:
        return _judge_response_events(events)
    if path in (NATIVE, INFILL):
        return _judge_native_events(events)
    if not events or events[-1] != "[DONE]":
        return "stream did not end with [DONE]"
    for event in events[:-1]:
        try:
            data = strict_json(event)
        except ValueError:
            return "stream event is not JSON"
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and error.get("type") == "server_error":
            return "server error inside the stream"
    return None


def _judge_native_events(events: list[str]) -> str | None:
    """llama-server's native stream: no [DONE]; it ends with a whole result (stop: true),
    or with an error event (then [DONE], as every stream of the OpenAI routes)."""
    try:
        data = [strict_json(event) for event in events if event != "[DONE]"]
    except ValueError:
        return "stream event is not JSON"
    last = data[-1] if data and isinstance(data[-1], dict) else {}
    if isinstance(last.get("error"), dict):
        return "server error inside the stream" if last["error"].get("type") == \
            "server_error" else None
    if events[-1] == "[DONE]" or last.get("stop") is not True:
        return "stream did not end with a whole result"
    return None


def _judge_response_events(events: list[str]) -> str | None:
    """A Responses stream ends with its final response, or with an error event."""
    try:
        data = [strict_json(event) for event in events]
    except ValueError:
        return "stream event is not JSON"
    last = data[-1] if data and isinstance(data[-1], dict) else {}
    if last.get("type") == "error":
        return "server error inside the stream" if last.get("code") == "server_error" else None
    if last.get("type") not in ("response.completed", "response.incomplete"):
        return "stream did not end with its final response"
    return None


def _judge_messages(status: int, content_type: str, body: bytes, path: str) -> str | None:
    """The Anthropic door: its own answer, event and error shapes."""
    text = body.decode("utf-8", "replace")
    if status == 200 and content_type.startswith("text/event-stream"):
        kinds = [line[7:] for line in text_lines(body) if line.startswith("event: ")]
        if kinds[-1:] == ["error"]:
            return "server error inside the stream" if '"api_error"' in text else None
        return None if kinds[-1:] == ["message_stop"] else "stream did not end message_stop"
    try:
        data = strict_json(body)
    except ValueError:
        return f"HTTP {status}: answer is not JSON"
    if not isinstance(data, dict):
        return f"HTTP {status}: answer is not an object"
    if status == 200 and path == COUNT_TOKENS:
        ok = type(data.get("input_tokens")) is int
        return None if ok else "200 answer has no input_tokens"
    if status == 200:
        ok = data.get("type") == "message" and isinstance(data.get("content"), list)
        return None if ok else "200 answer is not a message"
    error = data.get("error")
    if (set(data) != {"type", "error"} or not isinstance(error, dict)
            or set(error) != {"type", "message"} or not error["message"]):
        return f"HTTP {status}: error answer is not in Anthropic's shape"
    if status >= 500 and not (status == 503 and error["type"] == "overloaded_error"):
        return f"HTTP {status}"
    return None


def _judge_ollama(status: int, content_type: str, body: bytes) -> str | None:
    """Ollama's door: NDJSON streams whose last line ends the answer or is an error line,
    JSON answers (or an empty 200), and errors as {"error": "..."}."""
    if status == 200 and content_type.startswith("application/x-ndjson"):
        try:
            objects = [strict_json(line) for line in text_lines(body) if line.strip()]
        except ValueError:
            return "stream line is not JSON"
        last = objects[-1] if objects and isinstance(objects[-1], dict) else {}
        if "error" in last:
            return "server error inside the stream" if "internal" in str(last["error"]) else None
        # /api/create ends as /api/pull does, with {"status": "success"}
        done = last.get("done") is True or last.get("status") == "success"
        return None if done else "stream did not end with done: true"
    if status in (200, 201):  # 201: an upload kept (/api/blobs)
        try:
            data = strict_json(body) if body else {}
        except ValueError:
            return "200 answer is not JSON"
        return None if isinstance(data, dict) else "200 answer is not an object"
    try:
        data = strict_json(body)
    except ValueError:
        return f"HTTP {status}: answer is not JSON"
    if (not isinstance(data, dict) or set(data) != {"error"}
            or not isinstance(data["error"], str) or not data["error"]):
        return f"HTTP {status}: error answer is not in Ollama's shape"
    if status >= 500 and status != 503:
        return f"HTTP {status}"
    return None


# What a 200 answer in JSON holds: a list under this key (bare lists: TEI's rerank, /slots).
_ANSWER_LISTS = {RESPONSES: "output", EMBEDDINGS: "data", TOKENIZE: "tokens",
                 STORED: "output", INPUT_ITEMS: "data",
                 **dict.fromkeys(RERANK_PATHS, "results"), SLOTS: ""}


def _judge_json_answer(data: Any, path: str, method: str) -> str | None:
    if path in (NATIVE, INFILL):
        results = data if isinstance(data, list) else [data]
        ok = bool(results) and all(isinstance(r, dict) and isinstance(r.get("content"), str)
                                   for r in results)
        return None if ok else "200 answer has no content"
    if method == "DELETE":
        ok = isinstance(data, dict) and data.get("deleted") is True
        return None if ok else "200 answer has no deleted: true"
    if path in (DETOKENIZE, APPLY_TEMPLATE):
        key = "content" if path == DETOKENIZE else "prompt"
        ok = isinstance(data, dict) and isinstance(data.get(key), str)
        return None if ok else f"200 answer has no {key}"
    key = _ANSWER_LISTS.get(path, "choices")
    if isinstance(data, list) and (path in RERANK_PATHS or path == SLOTS):
        return None
    ok = isinstance(data, dict) and isinstance(data.get(key), list)
    return None if ok else f"200 answer has no {key or 'list'}"


def judge(status: int, content_type: str, body: bytes, path: str = CHAT,
          method: str = "POST") -> str | None:
    """None when the server may answer so; otherwise what is wrong. Statuses below 500,
    and 503 for overload or a model that cannot be loaded now, are answers; every other
    5xx is a failure, and so is any answer that is not what its status promises.
    `path` is the route's pattern where the path holds an id (Case.route)."""
    if b"Traceback (most recent call last)" in body:
        return "traceback in the answer"
    if method == "HEAD":  # a status and no body
        return None if status < 500 or status == 503 else f"HTTP {status}"
    if path in (MESSAGES, COUNT_TOKENS):
        return _judge_messages(status, content_type, body, path)
    if path.startswith("/api/"):
        return _judge_ollama(status, content_type, body)
    if status == 200:
        if content_type.startswith("text/event-stream"):
            return _judge_stream(body, path)
        try:
            data = strict_json(body)
        except ValueError:
            return "200 answer is not JSON"
        return _judge_json_answer(data, path, method)
    if not 400 <= status < 600:
        return f"HTTP {status}"
    error = _error_of(body)
    if isinstance(error, str):
        return f"HTTP {status}: {error}"
    # no_slot_available: /slots?fail_on_no_slot=1 while every slot is busy (llama-server's)
    overload = (error["type"] == "server_overloaded"
                or error["code"] in ("model_unavailable", "no_slot_available"))
    if status >= 500 and not (status == 503 and overload):
        return f"HTTP {status}"
    return None


def exchange(client: httpx.Client, case: Case, timeout: float = TIMEOUT_S) -> Result:
    """Sends one case and reads the whole answer, streams included, within `timeout`."""
    case = STORED_IDS.fill(case)
    started = time.monotonic()
    headers = {"Content-Type": "application/json"}
    try:
        with client.stream(case.method, case.path, content=case.body, headers=headers,
                           timeout=timeout) as r:
            parts = []
            for chunk in r.iter_bytes():
                parts.append(chunk)
                if time.monotonic() - started > timeout:
                    return Result(case, r.status_code, time.monotonic() - started, "timeout",
                                  "answer still streaming")
    except httpx.TimeoutException as exc:
        return Result(case, None, time.monotonic() - started, "timeout", type(exc).__name__)
    except httpx.TransportError as exc:
        return Result(case, None, time.monotonic() - started, "dropped connection",
                      f"{type(exc).__name__}: {exc}")
    body = b"".join(parts)
    STORED_IDS.harvest(case, r.status_code, body)
    if _slash_redirect(case.path, r.status_code, r.headers.get("location", "")):
        return Result(case, r.status_code, time.monotonic() - started, None, "")
    failure = judge(r.status_code, r.headers.get("content-type", ""), body,
                    case.route or case.path, case.method)
    return Result(case, r.status_code, time.monotonic() - started, failure,
                  body[:300].decode("utf-8", "replace"))


def _slash_redirect(path: str, status: int, location: str) -> bool:
    """Starlette's answer to a route's path with slashes after it (an empty id, as in
    GET /v1/responses/): a redirect to the route itself, as for every route."""
    target = urlsplit(location).path
    asked = unquote(path.split("?")[0])
    return (status in (307, 308) and bool(target) and asked.startswith(target)
            and not asked[len(target):].strip("/"))


def new_client(base_url: str) -> httpx.Client:
    # No pooled connections: a connection the server closed while idle must never pass
    # for one it dropped mid-request.
    return httpx.Client(base_url=base_url, timeout=TIMEOUT_S,
                        limits=httpx.Limits(max_keepalive_connections=0))


def server_problem(base_url: str) -> str | None:
    """None when /health answers 200 and a plain request is served; else what is wrong."""
    try:
        health = httpx.get(f"{base_url}/health", timeout=TIMEOUT_S)
        if health.status_code != 200:
            return f"/health answered {health.status_code}"
        r = httpx.post(f"{base_url}{COMPLETIONS}", timeout=TIMEOUT_S * 3, json={
            "model": MODEL, "prompt": "Hello", "max_tokens": 2})
    except httpx.HTTPError as exc:
        return f"no answer: {type(exc).__name__}: {exc}"
    return None if r.status_code == 200 else f"a plain request got {r.status_code}"
