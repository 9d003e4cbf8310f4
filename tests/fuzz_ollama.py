"""Mutated requests to Ollama's API (/api/*) for the fuzz campaign, built from the values
of fuzz_strategies; fuzz_judge judges their answers in Ollama's shapes (NDJSON streams,
{"error": "..."} errors). /api/pull and /api/delete are left out: they reach the network
and the models directory."""

from __future__ import annotations

from typing import Any

from fuzz_strategies import (
    BOOLEAN,
    MODEL,
    SPECIAL_TEXT,
    Case,
    bounds,
    dumps,
    function_names,
    schemas,
    small_text,
    token_ids,
    weird,
)
from hypothesis import strategies as st

CHAT = "/api/chat"
GENERATE = "/api/generate"
EMBED = "/api/embed"
EMBEDDINGS = "/api/embeddings"
SHOW = "/api/show"
COPY = "/api/copy"
PATHS = (CHAT, GENERATE, EMBED, EMBEDDINGS, SHOW, COPY)

OPTION_NAMES = ["num_predict", "num_ctx", "num_keep", "temperature", "top_k", "top_p",
                "min_p", "typical_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
                "frequency_penalty", "mirostat", "mirostat_tau", "mirostat_eta", "seed", "stop",
                "tfs_z", "num_thread", "num_gpu", "penalize_newline", "bogus"]
# Embedding inputs are cut to the embedding context (Ollama's truncate), not refused: a
# full 2,048-token context takes longer than the time limit on the fuzz server's one
# thread, so texts stay short of it.
embed_text = st.one_of(st.text(max_size=24), st.sampled_from(SPECIAL_TEXT),
                       st.just("ab " * 300))
options = st.dictionaries(st.sampled_from(OPTION_NAMES),
                          st.one_of(bounds, st.lists(small_text, max_size=20), weird),
                          max_size=4)
keep_alive = st.one_of(st.sampled_from(["5m", "1h30m", "-1", "0", "10s", "bogus", "1e400",
                                        "-5m", "9999999h", "1.5s"]),
                       st.sampled_from([0, -1, 3.5, 10**30]), weird)
# Mostly the subset of Go templates the server renders, some of what it refuses.
templates = st.sampled_from(["{{ .Prompt }}", "{{ if .System }}{{ .System }}{{ end }}Q: "
                             "{{ .Prompt }}\nA:", "{{- .Prompt -}}", "{{ if .Prompt }}",
                             "{{ end }}", "{{ range .Messages }}{{ end }}", "{{ .Response }}",
                             "{{ else }}{{ .Prompt }}", "{{", "}}"])
images = st.lists(st.one_of(small_text, st.sampled_from(["iVBORw0KGgo=", "/9j/4AAQ",
                                                         "data:image/png;base64,AAAA"])),
                  max_size=2)
tools = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "x"]),
     "function": st.fixed_dictionaries({"name": function_names},
                                       optional={"parameters": schemas})}), max_size=2)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "bogus"])},
    optional={"content": st.one_of(small_text, weird), "images": images,
              "tool_name": st.one_of(function_names, small_text), "thinking": small_text,
              "tool_calls": st.lists(st.fixed_dictionaries({"function": st.fixed_dictionaries(
                  {"name": function_names, "arguments": weird})}), max_size=2)})
GENERATION_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "stream": BOOLEAN, "format": st.one_of(st.sampled_from(["json", "", "yaml"]), schemas),
    "keep_alive": keep_alive, "think": st.one_of(BOOLEAN, st.sampled_from(["high", "x"])),
    "logprobs": BOOLEAN, "top_logprobs": st.integers(-1, 25), "options": options}
FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    CHAT: {**GENERATION_FIELDS, "tools": tools},
    GENERATE: {**GENERATION_FIELDS, "suffix": small_text, "system": small_text,
               "template": templates, "raw": BOOLEAN, "images": images,
               "context": st.lists(token_ids, max_size=8)},
    EMBED: {"truncate": BOOLEAN, "dimensions": st.sampled_from([0, 1, 576, 2**63]),
            "options": options, "keep_alive": keep_alive},
    EMBEDDINGS: {"options": options, "keep_alive": keep_alive},
    SHOW: {"verbose": BOOLEAN},
    COPY: {},
}


@st.composite
def _bodies(draw: st.DrawFn, path: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": draw(st.sampled_from([MODEL, f"{MODEL}:latest"]))}
    if path in (CHAT, GENERATE):
        # A bounded answer unless a mutation takes num_predict away.
        body["options"] = {"num_predict": draw(st.integers(1, 4))}
        if path == CHAT:
            body["messages"] = draw(st.lists(message, max_size=3))
        else:
            body["prompt"] = draw(small_text)
    elif path == EMBED:
        body["input"] = draw(st.one_of(embed_text, st.lists(embed_text, max_size=3)))
    elif path == EMBEDDINGS:
        body["prompt"] = draw(embed_text)
    elif path == COPY:
        body = {"source": body["model"], "destination": draw(small_text)}
    fields = FIELDS[path]
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True)
                  ) if fields else []
    for name in chosen:
        if name == "options" and "options" in body:
            body["options"] = {**body["options"], **draw(options)}
        else:
            body[name] = draw(fields[name])
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(sorted({*body, *fields, "name", "model"})))
        how = draw(st.sampled_from(["replace", "replace", "delete", "unknown"]))
        if how == "delete":
            body.pop(key, None)
        elif how == "unknown":
            body[draw(st.text(max_size=10))] = draw(weird)
        else:
            body[key] = draw(weird)
    return body


def ollama_cases(path: str | None = None) -> st.SearchStrategy[Case]:
    paths = st.just(path) if path is not None else st.sampled_from(PATHS)
    return paths.flatmap(lambda p: _bodies(p).map(
        lambda b: Case(p, dumps(b).encode("utf-8", "surrogatepass"), "ollama")))
