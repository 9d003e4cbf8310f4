"""Code infill end to end on a model that has fill-in-the-middle tokens: the tiny random
model of edge_testkit/models/make_test_fim_model.py (neither real test model declares FIM tokens).
POST /infill as llama.vscode / llama.vim send it and /v1/completions with `suffix`:
the token layout, extra context cached across keystrokes, the time budgets, n_indent,
streaming and prompt progress."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server

from edge_testkit.models import make_test_fim_model

FILE = "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(40))  # ~1,100 chars


def write_fim_model(path: Path, **kwargs: int) -> Path:
    return make_test_fim_model.write_model(path, **kwargs)


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("fim")
    model = write_fim_model(tmp / "fim.gguf")
    running = start_server(tmp, "--model", str(model), "--parallel", "2",
                           "--ctx-size", "4096", "--draft-max", "0")
    yield running
    stop_server(running)
    assert "Traceback" not in running.log_text(), running.log_text()


@pytest.fixture()
def fim(fim_server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fim_server.base_url, timeout=120) as c:
        yield c


def tokens(fim: httpx.Client, text: str, *, special: bool = False) -> list[int]:
    r = fim.post("/tokenize", json={"model": "default", "content": text,
                                    "parse_special": special})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def special(fim: httpx.Client, text: str) -> int:
    [token] = tokens(fim, text, special=True)
    return token


def test_infill_token_layout_is_extra_then_prefix_suffix_middle(fim) -> None:
    """The prompt /infill evaluates is exactly [BOS] <rep>myproject\\n <sep>name\\n text
    <sep>filename\\n <pre> prefix prompt <suf> suffix <mid>: a completion of those token
    ids afterwards finds all but the last one cached."""
    bos, rep = special(fim, "<s>"), special(fim, "<|repo_name|>")
    sep = special(fim, "<|file_sep|>")
    pre, suf, mid = (special(fim, t) for t in ("<|fim_prefix|>", "<|fim_suffix|>",
                                                "<|fim_middle|>"))
    body = {"input_prefix": "def add(a, b):\n    ret", "input_suffix": "\n\nprint(add(1, 2))",
            "input_extra": [{"filename": "util.py", "text": "X = 1\n"}], "prompt": "urn",
            "n_predict": 2, "temperature": 0}
    r = fim.post("/infill", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    plain = lambda text: tokens(fim, text)  # noqa: E731
    layout = [bos, rep, *plain("myproject\n"), sep, *plain("util.py\n"), *plain("X = 1\n"),
              sep, *plain("filename\n"), pre, *plain(body["input_prefix"]), *plain("urn"),
              suf, *plain(body["input_suffix"]), mid]
    assert answer["tokens_evaluated"] == len(layout)
    assert answer["stop"] is True and answer["truncated"] is False
    again = fim.post("/v1/completions", json={"prompt": layout, "max_tokens": 1}).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == len(layout) - 1


def test_suffix_on_completions_is_infill_without_extra_context(fim) -> None:
    prefix, suffix = "def square(x):\n    return ", "\n\nsquare(3)\n"
    infill = fim.post("/infill", json={"input_prefix": prefix, "input_suffix": suffix,
                                       "n_predict": 4, "temperature": 0}).json()
    completion = fim.post("/v1/completions", json={
        "prompt": prefix, "suffix": suffix, "max_tokens": 4, "temperature": 0}).json()
    usage = completion["usage"]
    assert usage["prompt_tokens"] == infill["tokens_evaluated"]
    # The same tokens: the second request found the first one's prompt cached.
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert completion["choices"][0]["text"] == infill["content"]  # greedy, same prompt


def test_extra_context_stays_cached_across_keystrokes(fim) -> None:
    """The extra context comes first, and the prefix (longer than its 384-token window)
    is cut at a line start: typing on the cursor's line re-evaluates only that line on."""
    extra = [{"filename": "lib.py", "text": FILE}]
    typed = "def g(y):\n    return y"
    shares = []
    for k in range(len(typed) - 5, len(typed) + 1):  # one keystroke after another
        r = fim.post("/infill", json={"input_prefix": FILE + typed[:k], "input_suffix": "\n",
                                      "input_extra": extra, "n_predict": 1})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["truncated"] is True
        shares.append(body["tokens_cached"] / body["tokens_evaluated"])
        assert body["timings"]["cache_n"] == body["tokens_cached"]
    assert all(share >= 0.9 for share in shares[1:]), shares


def test_prompt_time_budget_ends_the_request_and_keeps_what_was_read(fim) -> None:
    extra = [{"filename": "big.py", "text": FILE * 3}]  # ~3,300 tokens: several steps
    body = {"input_prefix": "x = ", "input_suffix": "", "input_extra": extra,
            "n_predict": 8, "t_max_prompt_ms": 1}
    first = fim.post("/infill", json=body).json()
    assert first["content"] == "" and first["stop_type"] == "limit"
    assert first["tokens_predicted"] == 0
    # What was evaluated before the budget ran out is a cached prefix for the next try.
    body["t_max_prompt_ms"] = -1
    second = fim.post("/infill", json=body).json()
    assert second["tokens_cached"] > 0 and second["tokens_predicted"] > 0


def test_predict_time_budget_stops_at_a_newline(fim) -> None:
    # The grammar makes every other token a newline and never ends; the budget is spent
    # at once, so the first newline ends the completion.
    r = fim.post("/infill", json={"input_prefix": "a", "input_suffix": "", "n_predict": 400,
                                  "grammar": 'root ::= "a\\n" root', "t_max_predict_ms": 1})
    body = r.json()
    assert r.status_code == 200, body
    assert body["stop_type"] == "limit" and body["tokens_predicted"] < 400
    assert body["content"].endswith("\n")


def test_n_indent_cuts_the_first_line_indented_less(fim) -> None:
    grammar = 'root ::= "if x:\\n" "    y = 1\\n" "z = 2" [a-z]*'
    r = fim.post("/infill", json={"input_prefix": "", "input_suffix": "", "n_predict": 64,
                                  "grammar": grammar, "n_indent": 4, "temperature": 0})
    body = r.json()
    assert r.status_code == 200, body
    assert body["content"] == "if x:\n    y = 1\n"
    assert body["stop_type"] == "limit"


def test_infill_streams_in_llama_servers_shape(fim) -> None:
    # ignore_eos: five tokens whatever the model would write (it may end at once).
    body = {"input_prefix": "def f(", "input_suffix": "):\n", "n_predict": 5, "stream": True,
            "return_progress": True, "input_extra": [{"text": FILE}], "ignore_eos": True}
    events = []
    with fim.stream("POST", "/infill", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert progress and progress[-1]["processed"] == progress[-1]["total"]
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 5
    assert all(e["stop"] is False for e in events[:-1])


def test_long_prompt_reports_progress_before_its_first_token(fim) -> None:
    """A completions stream with return_progress: prompt_progress events while the prompt
    is evaluated (at least two before the first token), counting the cached tokens."""
    body = {"prompt": FILE * 2, "max_tokens": 2, "stream": True, "return_progress": True}
    before_first: list[dict] = []
    seen_token = False
    with fim.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "prompt_progress" in chunk and not seen_token:
                before_first.append(chunk["prompt_progress"])
            seen_token = seen_token or any(c["text"] for c in chunk["choices"])
    assert len(before_first) >= 2
    processed = [p["processed"] for p in before_first]
    assert processed == sorted(processed) and processed[-1] == before_first[-1]["total"]
    assert {p["cache"] for p in before_first} == {before_first[0]["cache"]}


def test_n_predict_minus_one_generates_until_the_context_is_full(fim) -> None:
    # A 4,060-character prompt (one token each) in a 4,096-token context.
    r = fim.post("/completions", json={"prompt": "a" * 4060, "n_predict": -1,
                                       "ignore_eos": True})
    body = r.json()
    assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == 4096
    assert body["usage"]["completion_tokens"] > 16  # completions default to 16 otherwise
    assert body["choices"][0]["finish_reason"] == "length"


def test_infill_refusals(fim, http) -> None:
    # `http` is the SmolLM2 server: its vocabulary has no FIM tokens.
    r = http.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "fill-in-the-middle" in r.json()["error"]["message"]
    for body, param in [({"input_suffix": "b"}, "input_prefix"),
                        ({"input_prefix": "a", "input_suffix": "b", "n": 2}, "n"),
                        ({"input_prefix": "a", "input_suffix": "b",
                          "input_extra": [{"filename": "x"}]}, "input_extra[0].text")]:
        r = fim.post("/infill", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
