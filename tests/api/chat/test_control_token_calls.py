"""Tool calls whose markers are control tokens, on models with real vocabularies.

Each family's model is the tiny random model of scripts/make_test_vocab_model.py with
that family's real tokenizer (llama.cpp's models/ggml-vocab-*.gguf) and chat template
(models/templates): its markers are control tokens with the real ids, which llama.cpp
does not render as text unless asked. A GBNF `grammar` makes the model write the
family's native output (as in llama.cpp's test-chat.cpp), and a `logit_bias` on the
control tokens makes it write each marker as its token, as a real model does (llama.cpp
matches a control token against a grammar by its text; this server refuses the
grammar's token references, `<[id]>`): the answer is known while everything around it
is real: sampling, the engine's pieces, the parsers, the HTTP layers.

Where the answer is parsed (tools attached), the parser reads the text with its control
tokens and the call comes out as `tool_calls`; what the caller is shown (content, and
the text of routes that parse nothing) never holds a control token's text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server, vocab_model

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# Content the grammar puts before a control token. It ends in a digit: tokenizers split
# digits from everything else, so no token spans its end and the start of the marker's
# text (a piece `.[` would write `[TOOL_CALLS]` as characters, the bias notwithstanding).
LEAD = "Checking 1"


@dataclass(frozen=True)
class Family:
    vocab: str  # models/ggml-vocab-<vocab>.gguf
    template: str  # under models/templates
    marker: str  # the control token that opens a call
    # The family's native output (content, marker, call): parts that are control
    # tokens are matched as tokens by the grammar, the others as text.
    output: tuple[str, ...]
    other: str  # a control token that is no marker
    add_control: tuple[str, ...] = ()  # markers the vocab file lacks (CONTROL, as real)
    think: tuple[str, str] = ("<think>", "</think>")  # where reasoning opens and closes


FAMILIES = {
    # Llama 3.1's vocabulary is Llama 3's (llama-bpe) with reserved tokens renamed:
    # `<|python_tag|>` and `<|eom_id|>` are control tokens there.
    "llama3": Family(
        "llama-bpe", "meta-llama-Llama-3.1-8B-Instruct.jinja", "<|python_tag|>",
        (LEAD, "<|python_tag|>", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
        "<|start_header_id|>", add_control=("<|python_tag|>", "<|eom_id|>")),
    # Mistral's SentencePiece vocabulary (v3) holds its instruction and tool tokens as
    # control tokens; llama-spm is that tokenizer without them. Devstral writes
    # `[TOOL_CALLS]name[ARGS]{…}`, `[ARGS]` a control token too (Tekken, v11+), as are
    # Magistral's `[THINK]` and `[/THINK]`.
    "mistral": Family(
        "llama-spm", "unsloth-mistral-Devstral-Small-2507.jinja", "[TOOL_CALLS]",
        (LEAD, "[TOOL_CALLS]", "get_weather", "[ARGS]", '{"city": "Paris"}'), "[INST]",
        add_control=("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                     "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[ARGS]",
                     "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[THINK]", "[/THINK]"),
        think=("[THINK]", "[/THINK]")),
}


class FamilyServer:
    """One family's model behind a running server, and its control tokens' ids."""

    def __init__(self, server: RunningServer, family: Family) -> None:
        self.server = server
        self.family = family
        self.http = httpx.Client(base_url=server.base_url, timeout=120)
        self.controls = {text: self.token(text)
                         for text in (*family.add_control, family.marker, family.other)}

    def token(self, text: str) -> int:
        r = self.http.post("/tokenize", json={"content": text, "parse_special": True})
        assert r.status_code == 200, r.text
        [token] = r.json()["tokens"]
        return int(token)

    def forcing(self, *parts: str) -> dict[str, object]:
        """Request fields that make the model write `parts`: a grammar of their text, and
        a bias that picks each part that is a control token as that token."""
        return {"grammar": "root ::= " + json.dumps("".join(parts)),
                "logit_bias": {str(self.controls[p]): 100 for p in parts if p in self.controls}}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[FamilyServer]:
    spec = FAMILIES[request.param]
    model = vocab_model(spec.vocab, add_control=spec.add_control, template=spec.template)
    tmp = tmp_path_factory.mktemp(request.param)
    running = start_server(tmp, "--model", str(model), "--parallel", "2",
                           "--ctx-size", "8192")
    served = FamilyServer(running, spec)
    yield served
    served.http.close()
    stop_server(running)
    assert "Traceback" not in running.log_text(), running.log_text()


def chat_body(family: FamilyServer, **extra: object) -> dict[str, object]:
    return {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "auto",
            "max_tokens": 60, "temperature": 0, **family.forcing(*family.family.output),
            **extra}


def test_marker_token_call_parses_and_content_hides_markers(family: FamilyServer) -> None:
    r = family.http.post("/v1/chat/completions", json=chat_body(family, logprobs=True))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    # The marker was the control token (its logprob entry shows no text), not characters.
    assert family.family.marker not in "".join(t["token"] for t in choice["logprobs"]["content"])
    assert choice["finish_reason"] == "tool_calls", message
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert message["content"] == LEAD


def test_streamed_call_matches_the_whole_answer(family: FamilyServer) -> None:
    whole = family.http.post("/v1/chat/completions", json=chat_body(family))
    message = whole.json()["choices"][0]["message"]
    content, names, arguments, finish = [], [], [], None
    with family.http.stream("POST", "/v1/chat/completions",
                            json=chat_body(family, stream=True)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            [choice] = json.loads(line[6:])["choices"]
            delta = choice["delta"]
            content.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                names.append(call["function"].get("name") or "")
                arguments.append(call["function"]["arguments"])
            finish = choice["finish_reason"] or finish
    assert "".join(content) == message["content"] == LEAD
    assert "".join(names) == "get_weather"
    assert "".join(arguments) == message["tool_calls"][0]["function"]["arguments"]
    assert finish == "tool_calls"


def test_the_marker_is_the_control_token_and_plain_routes_hide_it(
        family: FamilyServer) -> None:
    """The same prompt and grammar on /completion, which parses nothing: the tokens
    generated hold the marker's control token, its text shows no marker."""
    r = family.http.post("/tokenize", json={"messages": MESSAGES, "tools": [WEATHER]})
    prompt = r.json()["tokens"]
    r = family.http.post("/completion", json={
        "prompt": prompt, "n_predict": 60, "temperature": 0, "return_tokens": True,
        **family.forcing(*family.family.output)})
    assert r.status_code == 200, r.text
    body = r.json()
    assert family.controls[family.family.marker] in body["tokens"]
    assert body["content"].startswith(LEAD)
    assert family.family.marker not in body["content"]


def test_other_control_tokens_never_show(family: FamilyServer) -> None:
    """A control token that is no marker (an end of header, an instruction tag) written
    amid content is left out of it, with tools attached (text parsed) or not."""
    forcing = family.forcing("Hi 1", family.family.other, " there")
    for extra in ({"tools": [WEATHER]}, {}):
        r = family.http.post("/v1/chat/completions", json={
            "messages": MESSAGES, "max_tokens": 20, "temperature": 0, **forcing, **extra})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "Hi 1 there", extra


def test_control_text_split_by_a_stop_string_never_shows(family: FamilyServer) -> None:
    """A stop string that a control token's text ends with a part of holds that part
    back, so the token's text reaches the parser in two deltas: neither shows."""
    other = family.family.other
    body = {"messages": MESSAGES, "tools": [WEATHER], "max_tokens": 20, "temperature": 0,
            "stop": [other[-4:] + "!"], "stream": True,
            **family.forcing("Hi 1", other, " there")}
    content = []
    with family.http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                [choice] = json.loads(line[6:])["choices"]
                content.append(choice["delta"].get("content") or "")
    assert "".join(content) == "Hi 1 there"


def test_reasoning_is_split_at_its_markers_and_hides_control_tokens(
        family: FamilyServer) -> None:
    """The family's reasoning markers (control tokens in Mistral's vocabulary) split the
    answer; a control token inside the reasoning does not show."""
    opener, closer = family.family.think
    r = family.http.post("/v1/chat/completions", json={
        "messages": MESSAGES, "max_tokens": 30, "temperature": 0, "separate_reasoning": True,
        **family.forcing(opener, "Why 1", family.family.other, " not 2", closer, "Hi")})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Why 1 not 2", "Hi")
