"""Template renders stop once their output passes what could fit the context
(n_ctx x the vocabulary's longest token), with a 400 naming the problem: Ollama's
`template` (issue: `{{.Prompt}}` 5,957 times over a 300 KB prompt took 4.6 s and 1 GB),
its `system`, and the model's Jinja chat template driven by `chat_template_kwargs`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server

# A chat template that repeats each message repeat x repeat times (ChatML otherwise).
AMPLIFYING_TEMPLATE = """\
{%- for message in messages -%}
{%- for i in range(repeat | default(1)) -%}{%- for j in range(repeat | default(1)) -%}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor -%}{%- endfor -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""
ISSUE_TEMPLATE = "{{.Prompt}}" * 5957


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("render-bounds")
    template = tmp / "amplify.jinja"
    template.write_text(AMPLIFYING_TEMPLATE)
    # An address-space cap: before the fix a render here allocated without bound.
    server = start_server(tmp, "--ctx-size", "4096", "--parallel", "1",
                          "--chat-template-file", str(template), memory_limit_mb=4096)
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def _peak_growth_bytes(pid: int, send: object) -> int:
    """How far the server's peak resident set grew while `send()` ran (the kernel's
    high-water mark, reset to the current RSS first)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = _status_kb(pid, "VmHWM")
    send()  # type: ignore[operator]
    return (_status_kb(pid, "VmHWM") - before) * 1024


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{key} not in /proc/{pid}/status")


def _generate(server: RunningServer, **fields: object) -> httpx.Response:
    body = {"model": "default", "stream": False, "options": {"num_predict": 2}, **fields}
    return httpx.post(f"{server.base_url}/api/generate", json=body, timeout=60)


def test_the_issues_request_is_refused_in_under_a_second_without_growing(
        bounded: RunningServer) -> None:
    answers: list[httpx.Response] = []

    def send() -> None:
        started = time.monotonic()
        answers.append(_generate(bounded, prompt="x" * 300_000, template=ISSUE_TEMPLATE))
        answers.append(httpx.Response(200, json={"s": time.monotonic() - started}))

    growth = _peak_growth_bytes(bounded.process.pid, send)
    answer, elapsed = answers[0], answers[1].json()["s"]
    assert answer.status_code == 400, answer.text
    assert "fits the context" in answer.json()["error"]
    assert elapsed < 1.0
    assert growth < 50 * 2**20, f"peak RSS grew {growth / 2**20:.0f} MiB"


def test_a_prompt_that_fits_reaches_the_stop_inside_the_render(bounded: RunningServer) -> None:
    started = time.monotonic()
    answer = _generate(bounded, prompt="x" * 1000, template=ISSUE_TEMPLATE)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert "template's output" in message and "stopped" in message
    assert time.monotonic() - started < 1.0


def test_system_repeated_by_the_template_is_stopped_too(bounded: RunningServer) -> None:
    answer = _generate(bounded, prompt="hi", system="y" * 1000,
                       template="{{.System}}" * 5000 + "{{.Prompt}}")
    assert answer.status_code == 400, answer.text
    assert "template's output" in answer.json()["error"]


def test_a_template_within_the_limit_still_generates(bounded: RunningServer) -> None:
    answer = _generate(bounded, prompt="Hello", system="Be brief.",
                       template="{{ if .System }}{{ .System }} {{ end }}{{ .Prompt }}")
    assert answer.status_code == 200, answer.text
    assert answer.json()["eval_count"] <= 2


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/apply-template"])
def test_a_chat_template_amplified_by_template_kwargs_is_stopped(
        bounded: RunningServer, path: str) -> None:
    # 100,000 x 100,000 copies of a 1 KB message, were it written out.
    body = {"model": "default", "max_tokens": 2,
            "messages": [{"role": "user", "content": "x" * 1000}],
            "chat_template_kwargs": {"repeat": 100_000}}
    started = time.monotonic()
    answer = httpx.post(bounded.base_url + path, json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "stopped" in error["message"]
    assert time.monotonic() - started < 1.0
    body |= {"chat_template_kwargs": {"repeat": 2},
             "messages": [{"role": "user", "content": "Hi"}]}
    assert httpx.post(bounded.base_url + path, json=body, timeout=60).status_code == 200
