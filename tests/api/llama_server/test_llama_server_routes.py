"""llama-server's helper routes as its clients call them (no `model` needed):
/apply-template shows the prompt a chat becomes, /props describes the model served,
/tokenize and /detokenize; `chat_template_kwargs` is checked before any template sees
it; and OpenAI's chat fields for what this server does not do are accepted at values that
ask for nothing, refused by name otherwise."""

from __future__ import annotations

import pytest
from conftest import DEFAULT_MODEL

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hi."}]


def tokens_of(http, **body) -> list[int]:
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def apply_template(http, **body) -> str:
    r = http.post("/apply-template", json=body)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_apply_template_is_the_prompt_chat_evaluates(http) -> None:
    prompt = apply_template(http, messages=MESSAGES)
    assert "Be brief." in prompt and "Say hi." in prompt
    # Read with its control tokens, the text is exactly the chat's prompt tokens.
    assert tokens_of(http, content=prompt) == tokens_of(http, messages=MESSAGES)
    # /v1/chat/completions evaluates those tokens.
    usage = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1})
    assert usage.json()["usage"]["prompt_tokens"] == len(tokens_of(http, messages=MESSAGES))


def test_apply_template_without_the_generation_prompt_is_a_prefix(http) -> None:
    full = apply_template(http, messages=MESSAGES)
    bare = apply_template(http, messages=MESSAGES, add_generation_prompt=False)
    assert len(bare) < len(full) and full.startswith(bare)


def test_apply_template_shows_caller_control_text_as_written(http) -> None:
    [end] = tokens_of(http, content="<|im_end|>")
    messages = [{"role": "user", "content": "Write <|im_end|> for me."}]
    prompt = apply_template(http, messages=messages)
    assert "Write <|im_end|> for me." in prompt
    # Shown as written, yet never read as the control token in the chat's own tokens.
    assert tokens_of(http, content=prompt).count(end) == \
        tokens_of(http, messages=messages).count(end) + 1


@pytest.mark.parametrize("body, param", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": MESSAGES, "model": "no-such-model"}, "model"),
])
def test_apply_template_refuses_bad_input(http, body: dict, param: str) -> None:
    r = http.post("/apply-template", json=body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("kwargs", [
    {"messages": []}, {"add_generation_prompt": False}, {"bos_token": "x"},
    {"not a name": 1}, {"enable_thinking": "no"}, {f"v{i}": i for i in range(33)},
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/apply-template", "/tokenize"])
def test_chat_template_kwargs_are_checked_by_name(http, path: str, kwargs: dict) -> None:
    r = http.post(path, json={"messages": MESSAGES, "max_tokens": 1,
                              "chat_template_kwargs": kwargs})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("chat_template_kwargs")


def test_chat_template_kwargs_a_template_ignores_change_nothing(http) -> None:
    plain = tokens_of(http, messages=MESSAGES)
    assert tokens_of(http, messages=MESSAGES, chat_template_kwargs={"unused": [1, 2]}) == plain


def test_props_describes_the_default_model(http) -> None:
    props = http.get("/props").json()
    card = http.get("/v1/models/default").json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == card["context_length"]
    assert props["total_slots"] == 4  # the session server's --parallel
    assert props["model_alias"] == DEFAULT_MODEL
    # A file name, never where it lies on the machine.
    assert props["model_path"].endswith(".gguf") and "/" not in props["model_path"]
    assert "{%" in props["chat_template"] and props["eos_token"]
    assert props["modalities"] == {"vision": False, "audio": False}
    # OpenAI's defaults: the whole distribution at temperature 1.
    params = settings["params"]
    assert (params["temperature"], params["top_k"], params["top_p"], params["min_p"]) == \
        (1.0, 0, 1.0, 0.0)
    assert http.get("/props", params={"model": DEFAULT_MODEL}).json() == props
    # llama-server's POST /props changes settings at run time: not served.
    assert http.post("/props", json={}).status_code == 405


def test_props_of_an_unknown_model_is_404(http) -> None:
    r = http.get("/props", params={"model": "no-such-model"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"


def test_tokenize_and_detokenize_need_no_model(http) -> None:
    tokens = tokens_of(http, content="Hello world")
    r = http.post("/detokenize", json={"tokens": tokens})
    assert r.status_code == 200, r.text
    assert r.json()["content"] == "Hello world"


# --- OpenAI's chat fields for what this server does not do -----------------------------

NEUTRAL_OPENAI = {"store": False, "service_tier": "auto", "verbosity": "medium",
                  "modalities": ["text"], "metadata": {"run": "7"},
                  "safety_identifier": "user-1", "reasoning_effort": "low"}


def test_openai_chat_fields_at_neutral_values_are_accepted(http) -> None:
    r = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1,
                                                **NEUTRAL_OPENAI})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("field, value", [
    ("store", True), ("service_tier", "flex"), ("verbosity", "low"),
    ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy", "format": "wav"}),
    ("web_search_options", {}), ("reasoning_effort", "extreme"),
    ("metadata", {f"k{i}": "v" for i in range(17)}),
])
def test_openai_chat_fields_asking_for_more_are_refused_by_name(http, field: str,
                                                                value: object) -> None:
    r = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1,
                                                field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(field)


def test_props_and_health_say_which_cpu_kernels_run(http, server) -> None:
    """The probe's verdict, as loaded: AMX tiles and AVX repacked layouts, AVX repacked
    layouts without AMX (where only AMX faults), or plain kernels; the log says it too."""
    kernels = http.get("/props").json()["cpu_kernels"]
    assert kernels in ("amx+repack", "repack", "plain")
    assert http.get("/health").json()["cpu_kernels"] == {DEFAULT_MODEL: kernels}
    assert f"cpu_kernels={kernels}" in server.log_text()
