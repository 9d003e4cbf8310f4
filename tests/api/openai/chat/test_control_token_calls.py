"""Tool calls whose markers are control tokens, on models with real vocabularies.

Each family's model is the tiny random model of edge_testkit/models/make_test_vocab_model.py with
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

# ruff: noqa: RUF001  (DeepSeek's markers are written with fullwidth bars)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                       "required": ["city"]},
    },
}
# Forced calls: a parameter every family's layout holds to its schema (an XML-like
# layout writes a string parameter as free text).
FORECAST = {
    "type": "function",
    "function": {
        "name": "forecast",
        "description": "The forecast for the next days.",
        "parameters": {"type": "object",
                       "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 7}},
                       "required": ["days"]},
    },
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# Content the grammar puts before a control token. It ends in a digit: tokenizers split
# digits from everything else, so no token spans its end and the start of the marker's
# text (a piece `.[` would write `[TOOL_CALLS]` as characters, the bias notwithstanding).
LEAD = "Checking 1"
ARGS = '{"city": "Paris"}'
_DS = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", \
    "<｜tool▁calls▁end｜>"


@dataclass(frozen=True)
class Family:
    vocab: str  # models/ggml-vocab-<vocab>.gguf
    template: str  # under models/templates
    marker: str  # the control (or added) token of the output the parsers must see
    # The family's native output (content, marker, call): parts that are control
    # tokens are matched as tokens by the grammar, the others as text.
    output: tuple[str, ...]
    other: str  # a control token that is no marker
    add_control: tuple[str, ...] = ()  # markers the vocab file lacks (CONTROL, as real)
    add_user: tuple[str, ...] = ()  # ... that the real tokenizer always renders as text
    think: tuple[str, str] = ("<think>", "</think>")  # where reasoning opens and closes
    after_think: tuple[str, ...] = ()  # what the family writes between reasoning and answer
    fields: tuple[tuple[str, object], ...] = ()  # request fields the output needs
    content: str | None = LEAD  # the output's content, reasoning
    reasoning: str | None = None
    ends_with: str = ""  # the end-of-generation token the output ends with
    forced_marker: str | None = None  # the token a forced call starts with, if special
    template_fix: tuple[str, str] | None = None  # (old, new) text of the template


FAMILIES = {
    # Llama 3.1's vocabulary is Llama 3's (llama-bpe) with reserved tokens renamed:
    # `<|python_tag|>` and `<|eom_id|>` are control tokens there.
    "llama3": Family(
        "llama-bpe", "meta-llama-Llama-3.1-8B-Instruct.jinja", "<|python_tag|>",
        (LEAD, "<|python_tag|>", '{"name": "get_weather", "parameters": ' + ARGS + "}"),
        "<|start_header_id|>", add_control=("<|python_tag|>", "<|eom_id|>"),
        forced_marker="<|python_tag|>"),
    # Mistral's SentencePiece vocabulary (v3) holds its instruction and tool tokens as
    # control tokens; llama-spm is that tokenizer without them. Devstral writes
    # `[TOOL_CALLS]name[ARGS]{…}`, `[ARGS]` a control token too (Tekken, v11+), as are
    # Magistral's `[THINK]` and `[/THINK]`.
    "mistral": Family(
        "llama-spm", "unsloth-mistral-Devstral-Small-2507.jinja", "[TOOL_CALLS]",
        (LEAD, "[TOOL_CALLS]", "get_weather", "[ARGS]", ARGS), "[INST]",
        add_control=("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                     "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[ARGS]",
                     "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[THINK]", "[/THINK]"),
        think=("[THINK]", "[/THINK]"), forced_marker="[TOOL_CALLS]"),
    # gpt-oss (harmony). Its o200k tokenizer is not among llama.cpp's vocab files: Llama
    # 3's BPE with harmony's special tokens added as control tokens (llama.cpp itself
    # renders <|start|> <|channel|> <|message|> <|constrain|> always, ends generation at
    # <|call|> and <|return|>, and keeps <|end|> a control token that ends reasoning).
    "gpt-oss": Family(
        "llama-bpe", "openai-gpt-oss-120b.jinja", "<|end|>",
        ("<|channel|>analysis<|message|>", LEAD, "<|end|>", "<|start|>",
         "assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
         "<|message|>", ARGS), "<|begin_of_text|>", ends_with="<|call|>",
        add_control=("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                     "<|return|>", "<|call|>"),
        think=("<|channel|>analysis<|message|>", "<|end|>"),
        after_think=("<|start|>", "assistant<|channel|>final<|message|>"),
        fields=(("separate_reasoning", True),), content=None, reasoning=LEAD),
    # DeepSeek R1 (llama.cpp's template of it, which teaches the tools; V3.1's does not
    # render them): DeepSeek's BPE (deepseek-llm) with its chat and tool-call tokens
    # added as control tokens, <think> </think> as plain added tokens. The prompt opens
    # the reasoning. The template's `map | tojson` gets a `| list` in between: Python's
    # Jinja maps lazily, and a generator is no JSON.
    "deepseek": Family(
        "deepseek-llm", "llama-cpp-deepseek-r1.jinja", _DS[0],
        (LEAD, _DS[0], _DS[1], "function", _DS[2], "get_weather\n```json\n", ARGS, "\n```",
         _DS[3], _DS[4]),
        "<｜begin▁of▁sentence｜>",
        add_control=(*_DS, "<｜User｜>", "<｜Assistant｜>", "<｜tool▁outputs▁begin｜>",
                     "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"),
        add_user=("<think>", "</think>"), think=("", "</think>"), forced_marker=_DS[0],
        template_fix=("map(attribute='function') | tojson",
                      "map(attribute='function') | list | tojson")),
    # Qwen 3.5: its XML-like calls open with <tool_call>, an added token that the real
    # tokenizer renders as text (not a control token), as are <think> and </think>.
    "qwen3.5": Family(
        "qwen35", "Qwen3.5-4B.jinja", "<tool_call>",
        (LEAD, "<tool_call>", "\n<function=get_weather>\n<parameter=city>\nParis\n"
         "</parameter>\n</function>\n", "</tool_call>"),
        "<|im_start|>",
        add_user=("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>",
                  "</tool_response>"), fields=(("enable_thinking", False),),
        forced_marker="<tool_call>"),
}


class FamilyServer:
    """One family's model behind a running server, and its special tokens' ids."""

    def __init__(self, server: RunningServer, family: Family) -> None:
        self.server = server
        self.family = family
        self.http = httpx.Client(base_url=server.base_url, timeout=120)
        self.special = {text: self.token(text) for text in
                        (*family.add_control, *family.add_user, family.marker, family.other)}
        self.fields = dict(family.fields)

    def token(self, text: str) -> int:
        r = self.http.post("/tokenize", json={"content": text, "parse_special": True})
        assert r.status_code == 200, r.text
        [token] = r.json()["tokens"]
        return int(token)

    def forcing(self, *parts: str, end: str = "") -> dict[str, object]:
        """Request fields that make the model write `parts`: a grammar of their text, and
        a bias that picks each part that is a special token as that token; `end`: the
        end-of-generation token to stop with (a grammar never matches one)."""
        biased = [p for p in (*parts, end) if p in self.special]
        return {"grammar": "root ::= " + json.dumps("".join(parts)),
                "logit_bias": {str(self.special[p]): 100 for p in biased}}

    def is_control(self, text: str) -> bool:
        """llama.cpp leaves the token out of plain text (as loaded: it renders some
        families' markers itself, such as harmony's <|channel|> and <|end|>)."""
        r = self.http.post("/detokenize", json={"tokens": [self.special[text]]})
        return r.json()["content"] == ""

    @property
    def marker_is_control(self) -> bool:
        return self.is_control(self.family.marker)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[FamilyServer]:
    spec = FAMILIES[request.param]
    model = vocab_model(spec.vocab, add_control=spec.add_control, add_user=spec.add_user,
                        template=spec.template, template_fix=spec.template_fix)
    tmp = tmp_path_factory.mktemp(request.param)
    running = start_server(tmp, "--model", str(model), "--parallel", "2",
                           "--ctx-size", "8192")
    served = FamilyServer(running, spec)
    yield served
    served.http.close()
    stop_server(running)
    assert "Traceback" not in running.log_text(), running.log_text()


def chat_body(family: FamilyServer, **extra: object) -> dict[str, object]:
    forcing = family.forcing(*family.family.output, end=family.family.ends_with)
    return {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "auto",
            "max_tokens": 80, "temperature": 0, **family.fields, **forcing, **extra}


def logprob_text(choice: dict) -> str:
    """The answer's tokens as logprobs show them: a control token shows no text."""
    return "".join(t["token"] for t in choice["logprobs"]["content"])


def test_marker_token_call_parses_and_content_hides_markers(family: FamilyServer) -> None:
    r = family.http.post("/v1/chat/completions", json=chat_body(family, logprobs=True))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    # The marker was the control token (its logprob entry shows no text), not characters.
    assert (family.family.marker in logprob_text(choice)) != family.marker_is_control
    assert choice["finish_reason"] == "tool_calls", message
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert message["content"] == family.family.content
    assert message.get("reasoning_content") == family.family.reasoning


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
    assert ("".join(content) or None) == message["content"] == family.family.content
    assert "".join(names) == "get_weather"
    assert "".join(arguments) == message["tool_calls"][0]["function"]["arguments"]
    assert finish == "tool_calls"


def test_the_marker_is_the_control_token_and_plain_routes_hide_it(
        family: FamilyServer) -> None:
    """The same prompt and grammar on /completion, which parses nothing: the tokens
    generated hold the marker's control token, its text shows no marker."""
    thinking = {k: v for k, v in family.fields.items() if k == "enable_thinking"}
    r = family.http.post("/tokenize", json={"messages": MESSAGES, "tools": [WEATHER],
                                            **thinking})
    prompt = r.json()["tokens"]
    r = family.http.post("/completion", json={
        "prompt": prompt, "n_predict": 80, "temperature": 0, "return_tokens": True,
        **family.forcing(*family.family.output, end=family.family.ends_with)})
    assert r.status_code == 200, r.text
    body = r.json()
    assert family.special[family.family.marker] in body["tokens"]
    assert LEAD in body["content"]
    assert (family.family.marker in body["content"]) != family.marker_is_control


def test_other_control_tokens_never_show(family: FamilyServer) -> None:
    """A control token that is no marker (an end of header, an instruction tag) written
    amid content is left out of it, with tools attached (text parsed) or not."""
    forcing = family.forcing("Hi 1", family.family.other, " there")
    for extra in ({"tools": [WEATHER]}, {}):
        r = family.http.post("/v1/chat/completions", json={
            "messages": MESSAGES, "max_tokens": 20, "temperature": 0, **family.fields,
            **forcing, **extra})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "Hi 1 there", extra


def test_control_text_split_by_a_stop_string_never_shows(family: FamilyServer) -> None:
    """A stop string that a control token's text ends with a part of holds that part
    back, so the token's text reaches the parser in two deltas: neither shows."""
    other = family.family.other
    body = {"messages": MESSAGES, "tools": [WEATHER], "max_tokens": 20, "temperature": 0,
            "stop": [other[-4:] + "!"], "stream": True, **family.fields,
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
    """The family's reasoning markers (control tokens in Mistral's vocabulary, gpt-oss's
    <|end|>) split the answer; a control token inside the reasoning does not show."""
    opener, closer = family.family.think
    parts = (opener, "Why 1", family.family.other, " not 2", closer,
             *family.family.after_think, "Hi")
    # Harmony's headers around the final answer are dropped by its call parser only.
    for extra in ({"tools": [WEATHER]}, {})[: 1 if family.family.after_think else 2]:
        r = family.http.post("/v1/chat/completions", json={
            "messages": MESSAGES, "max_tokens": 80, "temperature": 0, **family.fields,
            "separate_reasoning": True, **family.forcing(*parts), **extra})
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == ("Why 1 not 2", "Hi")


def test_forced_call_comes_out_in_the_family_format(family: FamilyServer) -> None:
    """`tool_choice: required`: the grammar is the family's own call layout, and the
    model (biased to its special tokens, as a trained one prefers them) starts the
    answer with the family's marker token; the call parses, nothing shows as content."""
    bias = {str(token): 100 for token in family.special.values()}
    r = family.http.post("/v1/chat/completions", json={
        "messages": MESSAGES, "tools": [FORECAST], "tool_choice": "required",
        "max_tokens": 80, "temperature": 0, "logprobs": True, "logit_bias": bias,
        **family.fields})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls", message
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "forecast"
    assert json.loads(call["function"]["arguments"])["days"] in range(1, 8)
    assert not message.get("content")
    marker = family.family.forced_marker
    if marker is not None:
        first = choice["logprobs"]["content"][0]["token"]
        assert first == ("" if family.is_control(marker) else marker)
