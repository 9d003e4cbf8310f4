"""Ollama's native API (/api/*) through the official `ollama` Python client, on the real
default model over real HTTP: model listing and details, chat and generate streamed and
not, options mapped onto the samplers, `format`, tools, embeddings, and errors in
Ollama's shape."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import ollama
import pytest
from conftest import DEFAULT_MODEL, JSON_MESSAGES, RunningServer

# A call made once in the history: the model answers the next question the same way.
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
ADD_SHOT = [
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": "",
     "tool_calls": [{"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
    {"role": "tool", "tool_name": "add", "content": "5"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "Add 4 and 7."},
]
HELLO = [{"role": "user", "content": "Say hello."}]
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture()
def oc(server: RunningServer) -> ollama.Client:
    return ollama.Client(host=server.base_url, timeout=120)


def assert_final(obj: Any, eval_count: int | None = None) -> None:
    """The object that ends an answer: done, a reason, counts and nanosecond durations."""
    assert obj.done is True and obj.done_reason in ("stop", "length")
    assert obj.prompt_eval_count > 0
    for name in DURATIONS:
        assert isinstance(getattr(obj, name), int) and getattr(obj, name) >= 0
    assert obj.total_duration >= obj.eval_duration
    if eval_count is not None:
        assert obj.eval_count == eval_count


def test_version_tags_show_and_ps(oc: ollama.Client, http: httpx.Client) -> None:
    version = http.get("/api/version").json()["version"]
    assert [int(p) for p in version.split(".")] >= [0, 5, 0]
    listed = oc.list().models
    ours = next(m for m in listed if m.model == f"{DEFAULT_MODEL}:latest")
    assert ours.size > 0 and len(ours.digest) == 64 and int(ours.digest, 16) >= 0
    details = ours.details
    assert details.format == "gguf" and details.family == "llama"
    assert details.parameter_size.endswith("M") and details.quantization_level == "Q8_0"
    # The digest is the file's SHA-256, computed once: a second listing agrees.
    assert oc.list().models[0].digest == listed[0].digest

    for name in (DEFAULT_MODEL, f"{DEFAULT_MODEL}:latest"):
        shown = oc.show(name)
        assert shown.details.family == "llama" and "completion" in shown.capabilities
        assert shown.template and shown.modelinfo["general.architecture"] == "llama"
        assert shown.modelinfo["tokenizer.ggml.tokens"] == []  # long arrays need verbose
    verbose = http.post("/api/show", json={"model": DEFAULT_MODEL, "verbose": True}).json()
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) > 1000

    oc.generate(model=DEFAULT_MODEL, prompt="Hi", options={"num_predict": 1})
    running = oc.ps().models
    loaded = next(m for m in running if m.model == f"{DEFAULT_MODEL}:latest")
    assert loaded.size > 0 and loaded.context_length > 0 and loaded.expires_at is not None


def test_chat_whole_and_streamed(oc: ollama.Client) -> None:
    whole = oc.chat(model=DEFAULT_MODEL, messages=HELLO, options={"num_predict": 8})
    assert whole.message.role == "assistant" and whole.message.content
    assert_final(whole)
    assert whole.eval_count <= 8

    parts = list(oc.chat(model=f"{DEFAULT_MODEL}:latest", messages=HELLO,
                         options={"num_predict": 8}, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts[:-1])
    assert parts[-1].message.content == ""  # the final object carries no text
    assert_final(parts[-1])


def test_stream_is_the_default_and_ndjson(server: RunningServer) -> None:
    body = {"model": DEFAULT_MODEL, "prompt": "Hello", "options": {"num_predict": 4}}
    with httpx.stream("POST", f"{server.base_url}/api/generate", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        objects = [json.loads(line) for line in r.iter_lines() if line]
    assert len(objects) >= 2 and objects[-1]["done"] is True
    assert all("response" in o and o["model"] == DEFAULT_MODEL for o in objects)


def test_generate_whole_streamed_raw_and_context(oc: ollama.Client) -> None:
    opts = {"num_predict": 6, "temperature": 0}
    whole = oc.generate(model=DEFAULT_MODEL, prompt="Name a colour.", options=opts)
    assert whole.response and whole.context and len(whole.context) > whole.prompt_eval_count
    assert_final(whole)
    parts = list(oc.generate(model=DEFAULT_MODEL, prompt="Name a colour.", options=opts,
                             stream=True))
    assert parts[-1].done and "".join(p.response for p in parts)
    assert_final(parts[-1])
    # The context carries the conversation into the next request's prompt.
    follow = oc.generate(model=DEFAULT_MODEL, prompt="And another?", context=whole.context,
                         options=opts)
    assert follow.prompt_eval_count > len(whole.context)
    raw = oc.generate(model=DEFAULT_MODEL, prompt="The capital of France is", raw=True,
                      options=opts)
    assert raw.response and raw.context is None  # raw answers give no context back
    system = oc.generate(model=DEFAULT_MODEL, prompt="Hi", system="Answer in one word.",
                         options=opts)
    assert system.prompt_eval_count != whole.prompt_eval_count


def test_template_override(oc: ollama.Client, http: httpx.Client) -> None:
    template = "{{ if .System }}{{ .System }}\n{{ end }}Q: {{ .Prompt }}\nA:"
    out = oc.generate(model=DEFAULT_MODEL, prompt="2+2?", template=template,
                      options={"num_predict": 4})
    assert out.done and out.prompt_eval_count == len(
        http.post("/tokenize", json={"model": DEFAULT_MODEL, "content": "Q: 2+2?\nA:"})
        .json()["tokens"])
    bad = http.post("/api/generate", json={"model": DEFAULT_MODEL, "prompt": "x",
                                           "template": "{{ range .Messages }}{{ end }}"})
    assert bad.status_code == 400 and "template" in bad.json()["error"]


def test_seeded_options_repeat(oc: ollama.Client) -> None:
    """Every sampler option at once, seeded, draws the same text again. The first draw
    only puts the prompt's KV in the cache: a prompt evaluated afresh can differ in the
    last bits of its logits from one read back (see agree_up_to_near_ties)."""
    opts = {"seed": 42, "temperature": 1.0, "top_k": 50, "top_p": 0.95, "min_p": 0.01,
            "typical_p": 0.9, "repeat_penalty": 1.2, "repeat_last_n": 32,
            "presence_penalty": 0.5, "frequency_penalty": 0.5, "num_predict": 12}
    draws = [oc.generate(model=DEFAULT_MODEL, prompt="Tell a story.", options=opts).response
             for _ in range(3)]
    assert draws[1] == draws[2]
    for mirostat in (1, 2):
        miro = {"seed": 7, "mirostat": mirostat, "mirostat_tau": 4.0, "mirostat_eta": 0.2,
                "num_predict": 8}
        texts = [oc.chat(model=DEFAULT_MODEL, messages=HELLO, options=miro).message.content
                 for _ in range(3)]
        assert texts[1] == texts[2]


def test_num_predict_ends_with_length_and_stop_ends_with_stop(oc: ollama.Client) -> None:
    cut = oc.generate(model=DEFAULT_MODEL, prompt="Count: 1, 2, 3,", raw=True,
                      options={"num_predict": 3, "temperature": 0})
    assert cut.done_reason == "length" and cut.eval_count == 3
    streamed = list(oc.chat(model=DEFAULT_MODEL, messages=HELLO, stream=True,
                            options={"num_predict": 2}))
    assert streamed[-1].done_reason == "length" and streamed[-1].eval_count == 2

    free = oc.generate(model=DEFAULT_MODEL, prompt="Count: 1, 2, 3,", raw=True,
                       options={"num_predict": 12, "temperature": 0})
    stop = free.response.strip()[:1] or free.response[:1]
    assert stop
    stopped = oc.generate(model=DEFAULT_MODEL, prompt="Count: 1, 2, 3,", raw=True,
                          options={"num_predict": 12, "temperature": 0, "stop": [stop]})
    assert stopped.done_reason == "stop" and stop not in stopped.response
    assert stopped.eval_count < free.eval_count or free.done_reason == "stop"


def test_format_json_and_schema(oc: ollama.Client) -> None:
    as_json = oc.chat(model=DEFAULT_MODEL, messages=JSON_MESSAGES, format="json",
                      options={"num_predict": 80, "temperature": 0})
    if as_json.done_reason == "stop":
        assert isinstance(json.loads(as_json.message.content), dict)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    for stream in (False, True):
        if stream:
            parts = list(oc.generate(model=DEFAULT_MODEL, prompt="A person as JSON.",
                                     format=schema, options={"num_predict": 60}, stream=True))
            text, reason = "".join(p.response for p in parts), parts[-1].done_reason
        else:
            out = oc.generate(model=DEFAULT_MODEL, prompt="A person as JSON.", format=schema,
                              options={"num_predict": 60})
            text, reason = out.response, out.done_reason
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), schema)


def _well_formed(calls: Any) -> None:
    for call in calls:
        assert call.function.name == "add"
        assert isinstance(call.function.arguments, dict)
        assert set(call.function.arguments) <= {"a", "b"}


def test_tools_with_object_arguments(oc: ollama.Client) -> None:
    whole = oc.chat(model=DEFAULT_MODEL, messages=ADD_SHOT, tools=[ADD],
                    options={"num_predict": 60, "temperature": 0})
    assert whole.message.content or whole.message.tool_calls
    _well_formed(whole.message.tool_calls or [])
    parts = list(oc.chat(model=DEFAULT_MODEL, messages=ADD_SHOT, tools=[ADD], stream=True,
                         options={"num_predict": 60, "temperature": 0}))
    calls = [c for p in parts for c in p.message.tool_calls or []]
    _well_formed(calls)
    assert parts[-1].done and (calls or "".join(p.message.content for p in parts))
    # A Python function is a tool too (the client writes its schema from the signature).

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
          a: the first
          b: the second
        """
        return a + b

    assert oc.chat(model=DEFAULT_MODEL, messages=ADD_SHOT, tools=[add],
                   options={"num_predict": 30}).done


def test_embed_and_legacy_embeddings(oc: ollama.Client) -> None:
    many = oc.embed(model=DEFAULT_MODEL, input=["first text", "second text"])
    assert len(many.embeddings) == 2 and len(many.embeddings[0]) == 576
    assert many.prompt_eval_count > 0 and many.total_duration > 0
    norm = sum(x * x for x in many.embeddings[0]) ** 0.5
    assert abs(norm - 1.0) < 1e-3
    one = oc.embed(model=f"{DEFAULT_MODEL}:latest", input="first text")
    assert len(one.embeddings) == 1
    assert max(abs(a - b) for a, b in zip(one.embeddings[0], many.embeddings[0],
                                          strict=True)) < 1e-3
    legacy = oc.embeddings(model=DEFAULT_MODEL, prompt="first text")
    assert len(legacy.embedding) == 576
    # truncate (the default) cuts an input longer than the context; false refuses it.
    long = "word " * 5000
    assert len(oc.embed(model=DEFAULT_MODEL, input=long).embeddings) == 1
    with pytest.raises(ollama.ResponseError) as refused:
        oc.embed(model=DEFAULT_MODEL, input=long, truncate=False)
    assert refused.value.status_code == 400


@pytest.mark.parametrize(("body", "status", "names"), [
    ({"model": "no-such-model", "messages": HELLO}, 404, "no-such-model"),
    ({"model": "no-such-model:7b", "prompt": "x"}, 404, "no-such-model:7b"),
    ({"model": DEFAULT_MODEL, "messages": HELLO, "options": {"tfs_z": "x"}}, 400, "tfs_z"),
    ({"model": DEFAULT_MODEL, "messages": HELLO, "options": {"bogus": 1}}, 400, "bogus"),
    ({"model": DEFAULT_MODEL, "messages": HELLO, "options": {"num_thread": "two"}}, 400,
     "num_thread"),
    ({"model": DEFAULT_MODEL, "messages": HELLO, "options": {"use_mmap": 1}}, 400,
     "use_mmap"),
    ({"model": DEFAULT_MODEL, "messages": HELLO, "think": "extreme"}, 400, "think"),
    ({"model": DEFAULT_MODEL, "messages": HELLO, "options": {"top_p": 7}}, 400, "top_p"),
    ({"model": DEFAULT_MODEL, "messages": HELLO, "keep_alive": "soon"}, 400, "keep_alive"),
    ({"model": DEFAULT_MODEL, "messages": HELLO, "unknown_field": 1}, 400, "unknown_field"),
    ({"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "x",
                                            "images": ["aGVsbG8="]}]}, 400, "images"),
    ({"model": DEFAULT_MODEL, "prompt": "x", "suffix": "y", "system": "z"}, 400, "system"),
])
def test_errors_in_ollama_shape(http: httpx.Client, body: dict[str, Any], status: int,
                                names: str) -> None:
    path = "/api/chat" if "messages" in body else "/api/generate"
    r = http.post(path, json={**body, "stream": False})
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and names in r.json()["error"]


def test_client_raises_for_unknown_model_and_bad_option(oc: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as missing:
        oc.chat(model="llama3:8b", messages=HELLO)
    assert missing.value.status_code == 404 and "not found" in missing.value.error
    with pytest.raises(ollama.ResponseError) as bad:
        list(oc.generate(model=DEFAULT_MODEL, prompt="x", options={"temperature": -1},
                         stream=True))
    assert bad.value.status_code == 400 and "temperature" in bad.value.error


def test_refused_routes_and_unknown_route(http: httpx.Client) -> None:
    r = http.post("/api/push", json={"model": "x"})
    assert r.status_code == 400 and "not supported" in r.json()["error"]
    r = http.get("/api/nothing")
    assert r.status_code == 404 and set(r.json()) == {"error"}


def test_ollama_and_openai_requests_share_the_prefix_cache(oc: ollama.Client,
                                                          http: httpx.Client) -> None:
    messages = [{"role": "user", "content": "A question asked at both doors: why is the "
                 "sky blue at noon and red at dusk?"}]
    first = oc.chat(model=DEFAULT_MODEL, messages=messages, options={"num_predict": 1})
    again = http.post("/v1/chat/completions", json={
        "model": DEFAULT_MODEL, "messages": messages, "max_tokens": 1}).json()["usage"]
    assert again["prompt_tokens"] == first.prompt_eval_count
    assert again["prompt_tokens_details"]["cached_tokens"] >= again["prompt_tokens"] - 1


def test_logprobs_think_and_suffix(oc: ollama.Client) -> None:
    scored = oc.chat(model=DEFAULT_MODEL, messages=HELLO, logprobs=True, top_logprobs=2,
                     options={"num_predict": 3})
    assert scored.logprobs and len(scored.logprobs) == scored.eval_count
    assert all(len(entry.top_logprobs or []) == 2 for entry in scored.logprobs)
    streamed = list(oc.generate(model=DEFAULT_MODEL, prompt="Hi", logprobs=True, stream=True,
                                options={"num_predict": 3}))
    assert sum(len(p.logprobs or []) for p in streamed) == streamed[-1].eval_count
    # think: the template is told to think, and thinking (if any) comes apart.
    thought = oc.chat(model=DEFAULT_MODEL, messages=HELLO, think=True,
                      options={"num_predict": 4})
    assert thought.done and (thought.message.content or thought.message.thinking)
    with pytest.raises(ollama.ResponseError) as no_fim:  # SmolLM2 has no FIM tokens
        oc.generate(model=DEFAULT_MODEL, prompt="def f(", suffix="return 1")
    assert no_fim.value.status_code == 400 and "suffix" in no_fim.value.error
