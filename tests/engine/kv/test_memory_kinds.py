"""Prompt reuse, drafting and `n` choices on every kind of model memory, through the real
server: plain attention with experts (qwen3moe), a sliding window (gemma3), hybrid
attention and recurrent layers (qwen35, lfm2, nemotron_h, granitehybrid) and recurrent
only (mamba2), each a tiny random model of edge_testkit/models/make_test_arch_model.py.

Each greedy answer must be the one a reference server gives from an empty context
(`--parallel 1 --prompt-cache-mb 0 --draft-max 0`): a KV stream or recurrent state that
held other tokens than the server believes (a cut that failed) changes what follows."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import RunningServer, arch_model, start_server, stop_server

# llama.cpp can roll these back by the last decode (llm_arch_supports_rs_rollback) ...
ROLLBACK = ("qwen35", "lfm2", "nemotron_h")
# ... these cannot be cut at all ...
UNCUTTABLE = ("granitehybrid", "mamba2")
# ... and these cut anywhere (attention, with experts or a sliding window).
ATTENTION = ("qwen3moe", "gemma3")
ARCHS = (*ATTENTION, *ROLLBACK, *UNCUTTABLE)
KINDS = {"qwen3moe": "attention", "gemma3": "sliding_window", "mamba2": "recurrent",
         **dict.fromkeys(("qwen35", "lfm2", "nemotron_h", "granitehybrid"), "hybrid")}
MAX_TOKENS = 12
# Logprobs closer than this are a tie that numerical noise may break (assert_same).
NEAR_TIE = 0.02
REFERENCE_ARGS = ("--parallel", "1", "--prompt-cache-mb", "0", "--draft-max", "0")
# The served server drafts a row a step wherever a lookup has a guess, whatever the step
# cost measured at its start says (on a busy machine it may say drafts never pay), so
# the drafted and rolled-back paths run on every memory that can take drafts back.
SERVED_ARGS = ("--draft-min", "1")
_WORDS = ("river", "stone", "lamp", "quiet", "orange", "market", "window", "seven", "travel",
          "garden", "letter", "north", "silver", "paper", "engine", "basket", "winter",
          "cloud", "honest", "lantern", "copper", "meadow")


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n))


@dataclass
class Pair:
    arch: str
    served: RunningServer  # default flags and SERVED_ARGS
    reference: RunningServer
    model: str
    tmp: Path  # the served server's data directory is in here

    def restart_served(self) -> None:
        """Stops the served server (saving its prompt store to disk) and starts it again
        on the same data directory."""
        assert stop_server(self.served) == 0
        assert "Traceback" not in self.served.log_text()
        self.served = start_server(self.tmp, "--model", self.model, *SERVED_ARGS,
                                   name="restarted")

    def post(self, server: RunningServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A greedy answer, with its tokens' logprobs and the runner-up's."""
        scored = ({"logprobs": True, "top_logprobs": 2} if path == "/chat/completions"
                  else {"logprobs": 2})
        r = httpx.post(f"{server.v1}{path}", timeout=300,
                       json={"temperature": 0, "max_tokens": MAX_TOKENS, **scored, **body})
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def expected(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.post(self.reference, path, body)

    def memory(self) -> dict[str, Any]:
        props = httpx.get(f"{self.served.base_url}/props", timeout=30).json()
        return props["memory"]  # type: ignore[no-any-return]

    def drafting(self) -> bool:
        """Lookup drafting is on: the memory can take drafts back."""
        memory = self.memory()
        assert memory["kind"] == KINDS[self.arch]
        if self.arch in UNCUTTABLE:
            assert memory["cuts"] == "back to a checkpoint" and not memory["drafting"]
        return bool(memory["drafting"])

    def stats(self) -> dict[str, int]:
        health = httpx.get(f"{self.served.base_url}/health", timeout=30).json()
        return next(iter(health["models"].values()))  # type: ignore[no-any-return]


def text_of(body: dict[str, Any], choice: int = 0) -> str:
    picked = body["choices"][choice]
    return picked["message"]["content"] if "message" in picked else picked["text"]


def scored_tokens(body: dict[str, Any], choice: int = 0) -> list[tuple[str, float, float]]:
    """Each answer token, its logprob and the best one's lead over the runner-up."""
    logprobs = body["choices"][choice]["logprobs"]
    if "content" in logprobs:  # chat
        return [(t["token"], t["logprob"],
                 t["top_logprobs"][0]["logprob"] - t["top_logprobs"][1]["logprob"])
                for t in logprobs["content"]]
    out = []
    for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"],
                                   logprobs["top_logprobs"], strict=True):
        best = sorted(top.values(), reverse=True)
        out.append((token, logprob, best[0] - best[1]))
    return out


def assert_same(got: dict[str, Any], expected: dict[str, Any], choice: int = 0) -> None:
    """The same greedy answer as the reference, token for token, with the same logprobs.
    Where the reference's best two tokens were within NEAR_TIE of each other, the answers
    may part (llama.cpp's sums run in another order over other batch shapes: the
    logprobs differ by 1e-4 or so), but not before; a stream holding other tokens than
    its books say moves the logprobs by far more, at once."""
    mine, theirs = scored_tokens(got, choice), scored_tokens(expected)
    for k, ((token, logprob, _), (want, their_logprob, lead)) in enumerate(
            zip(mine, theirs, strict=False)):
        if token != want:
            assert lead < NEAR_TIE, (k, token, want, lead, text_of(got, choice))
            return
        assert abs(logprob - their_logprob) < NEAR_TIE, (k, token, logprob, their_logprob)
    assert text_of(got, choice) == text_of(expected)


@pytest.fixture(scope="module", params=ARCHS)
def pair(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    model = str(arch_model(request.param))
    tmp = tmp_path_factory.mktemp(request.param)
    served = start_server(tmp, "--model", model, *SERVED_ARGS, name="served")
    reference = start_server(tmp, "--model", model, *REFERENCE_ARGS, name="reference")
    running = Pair(request.param, served, reference, model, tmp)
    yield running
    for server in (running.served, reference):
        stop_server(server)
        log = server.log_text()
        assert "Traceback" not in log and "llama_decode failed" not in log, log


def chat(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def test_repeated_prompt_after_a_drafted_one(pair: Pair) -> None:
    body = chat(words(120, seed=1))
    expected = pair.expected("/chat/completions", body)
    before = pair.stats()
    # Predicted right: the rows drafted from the prediction are kept.
    drafted = pair.post(pair.served, "/chat/completions", {
        **body, "prediction": {"type": "content", "content": text_of(expected)}})
    assert_same(drafted, expected)
    assert_same(pair.post(pair.served, "/chat/completions", body), expected)
    after = pair.stats()
    if pair.drafting():
        assert after["draft_tokens_accepted"] > before["draft_tokens_accepted"]
    else:
        assert after["draft_tokens"] == before["draft_tokens"]


def test_request_after_a_rejected_prediction(pair: Pair) -> None:
    body = chat(words(100, seed=2))
    expected = pair.expected("/chat/completions", body)
    # The prediction follows the answer for a while, then goes elsewhere: the drafts
    # past that point are rejected, and must leave no trace in the stream.
    text = text_of(expected)
    wrong = text[: len(text) // 2] + " " + words(40, seed=3)
    before = pair.stats()
    answer = pair.post(pair.served, "/chat/completions", {
        **body, "prediction": {"type": "content", "content": wrong}})
    assert_same(answer, expected)
    after = pair.stats()
    assert (after["draft_tokens"] > before["draft_tokens"]) == pair.drafting()
    assert (after["draft_tokens"] - before["draft_tokens"]
            >= after["draft_tokens_accepted"] - before["draft_tokens_accepted"])
    again = {"messages": [*body["messages"], {"role": "assistant", "content": text},
                          {"role": "user", "content": words(20, seed=4)}]}
    assert_same(pair.post(pair.served, "/chat/completions", again),
                pair.expected("/chat/completions", again))


def test_second_chat_turn(pair: Pair) -> None:
    messages: list[dict[str, str]] = [
        {"role": "system", "content": words(150, seed=5)},
        {"role": "user", "content": words(30, seed=6)},
    ]
    first = pair.post(pair.served, "/chat/completions", {"messages": messages})
    assert_same(first, pair.expected("/chat/completions", {"messages": messages}))
    messages += [{"role": "assistant", "content": text_of(first)},
                 {"role": "user", "content": words(20, seed=7)}]
    second = pair.post(pair.served, "/chat/completions", {"messages": messages})
    assert_same(second, pair.expected("/chat/completions", {"messages": messages}))
    # Every kind reuses the first turn: a recurrent state from its checkpoint there.
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * first["usage"]["prompt_tokens"], (cached, first["usage"])


def test_prefix_shared_with_a_request_still_generating(pair: Pair) -> None:
    prefix = words(300, seed=8)
    long_answer = {"prompt": prefix + " first", "max_tokens": 100, "ignore_eos": True}
    expected_long = pair.expected("/completions", long_answer)
    shared = {"prompt": prefix + " second"}
    expected_shared = pair.expected("/completions", shared)
    got: dict[str, Any] = {}
    started = threading.Event()

    def stream_long() -> None:
        text, scored = [], []
        with httpx.stream("POST", f"{pair.served.v1}/completions", timeout=300, json={
                "temperature": 0, "stream": True, "logprobs": 2, **long_answer}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    text.append(choice["text"])
                    scored.append(choice["logprobs"])
                    started.set()
        got["long"] = {"choices": [{"text": "".join(text), "logprobs": {
            key: [v for part in scored if part for v in part[key]]
            for key in ("tokens", "token_logprobs", "top_logprobs")}}]}

    thread = threading.Thread(target=stream_long)
    thread.start()
    assert started.wait(60)
    assert_same(pair.post(pair.served, "/completions", shared), expected_shared)
    thread.join(300)
    assert_same(got["long"], expected_long)


def test_prompts_arriving_together_share_their_prefix(pair: Pair) -> None:
    prefix = words(450, seed=9)
    bodies = [{"prompt": f"{prefix} {tail}"} for tail in ("one", "two", "three")]
    expected = [pair.expected("/completions", body) for body in bodies]
    results: list[dict[str, Any]] = [{} for _ in bodies]

    def send(i: int) -> None:
        results[i] = pair.post(pair.served, "/completions", bodies[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    for got, want in zip(results, expected, strict=True):
        assert_same(got, want)


def test_prefix_restored_from_the_prompt_store(pair: Pair) -> None:
    """A prompt whose slot was taken by others comes back from the host-RAM store, and a
    prompt parting from it earlier gets only what the saved state holds exactly (a
    sliding window's saved state lacks the cells before its last token's window)."""
    first = {"prompt": words(200, seed=11)}
    pair.post(pair.served, "/completions", first)
    slots = httpx.get(f"{pair.served.base_url}/props", timeout=30).json()["total_slots"]
    for i in range(slots):  # each takes a slot, the least recently used last
        pair.post(pair.served, "/completions", {"prompt": words(150, seed=100 + i),
                                                 "max_tokens": 1})
    parted = {"prompt": first["prompt"].rsplit(" ", 30)[0] + " " + words(30, seed=12)}
    for body in (parted, first):
        assert_same(pair.post(pair.served, "/completions", body),
                    pair.expected("/completions", body))


def test_prefix_restored_from_disk_after_a_restart(pair: Pair) -> None:
    """A chat's first turn, saved to disk at shutdown with its slot (on a recurrent state
    with its checkpoint after the prompt), gives the second turn after a restart. (The
    test models' template leaves system messages out: the turn is the user's.)"""
    messages = [{"role": "user", "content": words(180, seed=20)}]
    first = pair.post(pair.served, "/chat/completions", {"messages": messages})
    assert_same(first, pair.expected("/chat/completions", {"messages": messages}))
    assert first["usage"]["prompt_tokens"] >= 150  # saved: 128 tokens and more
    pair.restart_served()
    stats = pair.stats()
    assert stats["prompt_store_on_disk_only"] >= 1, stats
    messages += [{"role": "assistant", "content": text_of(first)},
                 {"role": "user", "content": words(15, seed=22)}]
    second = pair.post(pair.served, "/chat/completions", {"messages": messages})
    assert_same(second, pair.expected("/chat/completions", {"messages": messages}))
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * first["usage"]["prompt_tokens"], (cached, first["usage"])
    assert pair.stats()["prompt_store_on_disk_only"] < stats["prompt_store_on_disk_only"]


def test_drafting_gives_the_answers_of_draft_false(pair: Pair) -> None:
    """Where llama.cpp rolls the last decode back, drafting stays on, and a drafted
    answer (a prediction half right, half wrong) is the one `draft: false` gives."""
    if pair.arch in UNCUTTABLE:
        assert not pair.drafting()
        return
    assert pair.drafting(), pair.memory()
    body = chat(words(90, seed=30))
    plain = pair.post(pair.served, "/chat/completions", {**body, "draft": False})
    text = text_of(plain)
    prediction = text[: len(text) // 2] + " " + words(30, seed=31)
    before = pair.stats()
    drafted = pair.post(pair.served, "/chat/completions", {
        **body, "prediction": {"type": "content", "content": prediction}})
    assert pair.stats()["draft_tokens"] > before["draft_tokens"]
    assert_same(drafted, plain)
    assert_same(plain, pair.expected("/chat/completions", body))


def test_n_choices_greedy(pair: Pair) -> None:
    prompt = words(80, seed=10)
    expected = pair.expected("/completions", {"prompt": prompt})
    body = pair.post(pair.served, "/completions", {"prompt": prompt, "n": 2})
    for i in range(2):
        assert_same(body, expected, choice=i)
    # More choices than free slots: the later ones start on the slots the first free.
    many = pair.post(pair.served, "/completions", {"prompt": prompt, "n": 10})
    for i in range(10):
        assert_same(many, expected, choice=i)
