"""Speculative decoding with a draft model (engine/sched/model_draft.py), through the
real server: the target is SmolLM2-135M converted to Q8_0, the draft the packaged Q4_1
file of the same model (the same vocabulary, guesses that mostly agree). The draft
drafts 3 tokens a step at least (`--draft-min 3`): on a 2-core CPU this small a target's
multi-row steps cost too much for its cost model to draft on its own.

What it must keep: greedy answers are the undrafted server's (up to a near tie, where
multi-row numerics may pick the other token: lookup_draft.py, Numerics), and seeded
sampled answers too, since a drafted row is sampled with the sampler and random stream
one-token decoding would use there; so the sampled distribution is the target's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import RunningServer, arch_model, start_server, stop_server

from edge_server.catalogue.default_model import default_model_path

PROMPTS = ("Write a short story about a fox.", "List five uses of copper.",
           "Explain why the sky is blue.")
NEAR_TIE = 0.02
TARGET = ("--default-model-quant", "q8_0", "--parallel", "4")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[RunningServer, RunningServer]]:
    tmp = tmp_path_factory.mktemp("model-draft")
    drafted = start_server(tmp, *TARGET, "--model-draft", str(default_model_path()),
                           "--draft-min", "3", name="drafted")
    plain = start_server(tmp, *TARGET, "--draft-max", "0", name="plain")
    yield drafted, plain
    for server in (drafted, plain):
        assert stop_server(server) == 0
        assert "Traceback" not in server.log_text()


def chat(server: RunningServer, prompt: str, **fields: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 40,
            "logprobs": True, "top_logprobs": 2, **fields}
    r = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def tokens(answer: dict[str, Any]) -> list[str]:
    return [t["token"] for t in answer["choices"][0]["logprobs"]["content"]]


def untied(answer: dict[str, Any]) -> int:
    """How many leading tokens were picked by a clear margin (not a near tie)."""
    for i, t in enumerate(answer["choices"][0]["logprobs"]["content"]):
        top = sorted((alt["logprob"] for alt in t["top_logprobs"]), reverse=True)
        if len(top) > 1 and top[0] - top[1] < NEAR_TIE:
            return i
    return len(answer["choices"][0]["logprobs"]["content"])


def counts(server: RunningServer) -> dict[str, int]:
    models = httpx.get(f"{server.base_url}/health", timeout=30).json()["models"]
    return next(iter(models.values()))  # type: ignore[no-any-return]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_answers_are_the_undrafted_ones(servers: tuple[RunningServer, RunningServer],
                                               prompt: str) -> None:
    drafted, plain = servers
    before = counts(drafted)["draft_model_tokens_accepted"]
    expected = chat(plain, prompt, temperature=0)
    got = chat(drafted, prompt, temperature=0)
    same = untied(expected)
    assert tokens(got)[:same] == tokens(expected)[:same]
    assert counts(drafted)["draft_model_tokens_accepted"] > before


def test_seeded_samples_are_the_undrafted_ones(servers: tuple[RunningServer, RunningServer]
                                               ) -> None:
    """At temperature 1, 24 seeds: a drafted row is sampled from the target's own
    distribution with the random stream undrafted decoding uses, so the same seed gives
    the same tokens but where multi-row numerics move a draw across a boundary."""
    drafted, plain = servers
    agree = total = 0
    for seed in range(24):
        fields = {"temperature": 1.0, "seed": seed, "max_tokens": 16}
        expected = tokens(chat(plain, PROMPTS[seed % 3], **fields))
        got = tokens(chat(drafted, PROMPTS[seed % 3], **fields))
        total += len(expected)
        agree += next((i for i, (a, b) in enumerate(zip(expected, got, strict=False))
                       if a != b), min(len(expected), len(got)))
    assert agree >= 0.9 * total, f"{agree} of {total} leading tokens agree"
    stats = counts(drafted)
    assert stats["draft_model_tokens"] > 0 and stats["draft_model_tokens_accepted"] > 0


def test_a_request_that_asks_for_no_drafts_gets_none(
        servers: tuple[RunningServer, RunningServer]) -> None:
    drafted, _ = servers
    before = counts(drafted)["draft_model_tokens"]
    chat(drafted, PROMPTS[0], temperature=0, draft=False)
    assert counts(drafted)["draft_model_tokens"] == before


def test_the_draft_model_is_in_the_memory_account_and_the_metrics(
        servers: tuple[RunningServer, RunningServer]) -> None:
    drafted, plain = servers
    memory = httpx.get(f"{drafted.base_url}/health", timeout=30).json()["memory"]
    assert memory["draft_model"] > 0
    assert httpx.get(f"{plain.base_url}/health", timeout=30).json()["memory"]["draft_model"] == 0
    metrics = httpx.get(f"{drafted.base_url}/metrics", timeout=30).text
    assert "edge_server_draft_model_tokens_accepted_total" in metrics


@pytest.mark.parametrize(("draft", "reason"), [
    ("qwen3moe", "vocabulary is not the target's"),  # another tokenizer (phi-3's)
])
def test_a_draft_model_that_cannot_draft_for_the_model_stops_the_server(
        tmp_path: Path, draft: str, reason: str) -> None:
    server = start_server(tmp_path, "--model-draft", str(arch_model(draft)), wait=False)
    assert server.process.wait(timeout=120) != 0
    assert reason in server.log_text()
    assert "Traceback" not in server.log_text()


def test_a_recurrent_draft_model_is_refused(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--model", str(arch_model("qwen3moe")), "--model-draft",
                          str(arch_model("mamba2")), wait=False)
    assert server.process.wait(timeout=120) != 0
    assert "choose a transformer" in server.log_text()


def test_llama_server_timings_count_the_drafts(servers: tuple[RunningServer, RunningServer]
                                               ) -> None:
    drafted, plain = servers
    body = {"prompt": "The capital of France is", "n_predict": 24, "temperature": 0}
    timings = httpx.post(f"{drafted.base_url}/completion", json=body, timeout=120).json()[
        "timings"]
    assert timings["draft_n"] > 0 and 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    plain_timings = httpx.post(f"{plain.base_url}/completion", json=body, timeout=120).json()[
        "timings"]
    assert "draft_n" not in plain_timings  # as llama-server: only where drafts were made


@pytest.fixture(scope="module")
def unforced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A draft model without --draft-min: it drafts where its cost says that pays, and
    for every request that names it (LM Studio's `draft_model`)."""
    server = start_server(tmp_path_factory.mktemp("model-draft-lmstudio"), *TARGET,
                          "--model-draft", str(default_model_path()), name="unforced")
    yield server
    assert stop_server(server) == 0
    assert "Traceback" not in server.log_text()


def draft_name() -> str:
    return default_model_path().name.removesuffix(".gguf")


def assert_stats(stats: dict[str, Any]) -> None:
    assert stats["draft_model"] == draft_name()
    total, kept = stats["total_draft_tokens_count"], stats["accepted_draft_tokens_count"]
    assert total > 0 and 0 <= kept <= total
    assert stats["rejected_draft_tokens_count"] == total - kept
    assert stats["ignored_draft_tokens_count"] == 0


def test_a_request_naming_the_draft_model_drafts_with_it(unforced: RunningServer) -> None:
    """LM Studio's `draft_model`: drafts whatever the cost model says, and `stats` counts
    them, in answers and in streams, on chat and completions."""
    for name in (draft_name(), f"{draft_name()}.gguf"):
        before = counts(unforced)["draft_model_tokens"]
        answer = chat(unforced, PROMPTS[0], temperature=0, draft_model=name)
        assert_stats(answer["stats"])
        assert counts(unforced)["draft_model_tokens"] > before
    plain = chat(unforced, PROMPTS[0], temperature=0)
    assert "stats" not in plain
    same = untied(plain)
    assert tokens(answer)[:same] == tokens(plain)[:same]
    with httpx.stream("POST", f"{unforced.v1}/chat/completions", timeout=180, json={
            "messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 30,
            "stream": True, "draft_model": draft_name()}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert [e for e in events if "stats" in e][-1]["choices"] == []
    assert_stats([e for e in events if "stats" in e][-1]["stats"])
    r = httpx.post(f"{unforced.v1}/completions", timeout=180, json={
        "prompt": "Copper is used", "max_tokens": 30, "draft_model": draft_name()})
    assert r.status_code == 200, r.text
    assert_stats(r.json()["stats"])


def test_a_draft_model_the_model_lacks_is_a_400(
        unforced: RunningServer, servers: tuple[RunningServer, RunningServer]) -> None:
    _, plain = servers
    cases = [(unforced, {"draft_model": "qwen2.5-0.5b-instruct"}, "drafts with"),
             (unforced, {"draft_model": draft_name(), "draft": False}, "draft: false"),
             (plain, {"draft_model": draft_name()}, "has no draft model")]
    for server, fields, words in cases:
        r = httpx.post(f"{server.v1}/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **fields})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert "draft_model" in error["message"] and words in error["message"], error
