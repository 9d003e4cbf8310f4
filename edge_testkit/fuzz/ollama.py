"""Mutated requests to Ollama's API (/api/*) for the fuzz campaign, built from the values
of `strategies`; `judge` judges their answers in Ollama's shapes (NDJSON streams,
{"error": "..."} errors), and /api/create with /api/blobs (model_file_cases: Modelfiles up
to their bound, uploads of a few MiB). /api/pull and /api/delete are left out: they reach
the network and delete saved models."""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

from edge_testkit.fuzz.strategies import (
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
        body = {"source": body["model"], "destination": draw(st.one_of(
            small_text, st.sampled_from(["*", "m?", "[ab]", "claude-*", "a b"])))}
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


# --- /api/create and /api/blobs ----------------------------------------------------------

CREATE = "/api/create"
BLOBS = "/api/blobs/{digest}"
# Uploads that start as a GGUF file and are none: kept under their own digest when the
# digest sent matches, and then named by /api/create's `files` or FROM.
JUNK_GGUFS = [b"GGUF", b"GGUF\x03\x00\x00\x00" + b"\x00" * 16,
              b"GGUF\x03\x00\x00\x00" + b"\xff" * 16, b"GGUF" + bytes(range(256)) * 4]


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


blob_digests = st.one_of(
    st.sampled_from(JUNK_GGUFS).map(_digest),
    st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex()),
    st.sampled_from(["sha256-" + "0" * 64, "sha256:" + "A" * 64, "sha256:" + "0" * 63,
                     "sha256:", "md5:" + "0" * 32, "sha256:../../x", ""]),
    st.text(max_size=24))  # short: digests go into paths
model_sources = st.one_of(st.sampled_from([MODEL, f"{MODEL}:latest", "/etc/passwd",
                                           "./model.gguf", "hf.co/x/y", ""]),
                          blob_digests, small_text)
new_names = st.one_of(st.integers(0, 5).map(lambda n: f"fuzz-{n}"), small_text,
                      # outside Ollama's grammar: refused, never a glob alias
                      st.sampled_from(["*", "claude-*", "gpt-?", "[a-z]*", "a/b/c/d", "x:",
                                       "ns/m:t", "host.io:5000/ns/m:v1", "_x.y-z"]))
_ARGUMENTS = st.one_of(small_text, templates, st.just('"""{{ .Prompt }}"""'),
                       st.just('"quoted\\n"'), st.just('"""not closed'))
modelfile_lines = st.one_of(
    model_sources.map(lambda s: f"FROM {s}"),
    _ARGUMENTS.map(lambda a: f"TEMPLATE {a}"), _ARGUMENTS.map(lambda a: f"SYSTEM {a}"),
    st.tuples(st.sampled_from(OPTION_NAMES), st.one_of(small_text, st.sampled_from(
        ["1", "-1", "1e400", "NaN", "2147483648", "9223372036854775808", "0.5"]))).map(
        lambda kv: f"PARAMETER {kv[0]} {kv[1]}"),
    st.sampled_from(["ADAPTER x.gguf", "LICENSE MIT", "MESSAGE user hi", "# note", "",
                     "BOGUS 1", "from", "PARAMETER", "parameter stop <|im_end|>"]),
    small_text)


@st.composite
def create_cases(draw: st.DrawFn) -> Case:
    """/api/create in both shapes: a Modelfile's text, or its parts as fields."""
    body: dict[str, Any] = {"model": draw(new_names), "stream": draw(BOOLEAN)}
    if draw(BOOLEAN):
        body["modelfile"] = "\n".join(draw(st.lists(modelfile_lines, min_size=1,
                                                    max_size=5)))
    else:
        parts: dict[str, st.SearchStrategy[Any]] = {
            "template": templates, "system": small_text, "parameters": options,
            "files": st.dictionaries(st.sampled_from(["model.gguf", "x.safetensors", ""]),
                                     blob_digests, max_size=2),
            "quantize": st.just("q4_K_M"), "messages": st.just([])}
        body["from"] = draw(model_sources)
        for name in draw(st.lists(st.sampled_from(sorted(parts)), max_size=3, unique=True)):
            body[name] = draw(parts[name])
    if draw(st.integers(0, 3)) == 0:
        body[draw(st.sampled_from(sorted({*body, "name", "from"})))] = draw(weird)
    return Case(CREATE, dumps(body).encode("utf-8", "surrogatepass"), "ollama-create")


@st.composite
def blob_cases(draw: st.DrawFn) -> Case:
    """HEAD or POST /api/blobs/<digest> with junk bodies (some a match for their digest)."""
    data = draw(st.one_of(st.sampled_from(JUNK_GGUFS), st.binary(max_size=64),
                          st.sampled_from([b"", b"GGU", b"GGUX", b"\x00" * 100_000])))
    digest = _digest(data) if draw(BOOLEAN) else draw(blob_digests)
    method = draw(st.sampled_from(["HEAD", "POST", "POST"]))
    path = "/api/blobs/" + quote(digest.encode("utf-8", "replace"), safe=":")
    return Case(path, data if method == "POST" else b"", "ollama-blobs", method=method,
                route=BLOBS)


# Long Modelfiles: about as long as `modelfile` may be (262,144 characters; one more is a
# 400), its lines repeated by the thousand: comments, blank or odd lines (CR, tabs, NUL,
# Unicode spaces and line separators), FROM or PARAMETER lines, with a long SYSTEM, an
# unclosed \"\"\" or an unknown command at the end. Each is read in one pass, off the event
# loop: answered within the time limit, the server's address space capped.
MODELFILE_CHARS = 262_144
_REPEATED = ["#", "# comment", "", "\r", "\t", " \t ", "\x00", "\u00a0", "\u2028", "\u3000#",
             f"FROM {MODEL}", "FROM sha256:" + "0" * 64, "from x", "PARAMETER stop x",
             "PARAMETER temperature 0.5", "parameter\ttop_k\t40", "PARAMETER num_ctx 1e400",
             'SYSTEM "a\\nb"', 'TEMPLATE """{{ .Prompt }}"""', "PARAMETER", "FROM"]
_ENDINGS = ["", 'SYSTEM """never closed', "SYSTEM " + "x" * 70_000, "BOGUS line",
            'TEMPLATE """' + "{{ .Prompt }}" * 5_000 + '"""', "PARAMETER stop " + "s" * 600]


@st.composite
def long_modelfile_cases(draw: st.DrawFn) -> Case:
    head = draw(st.sampled_from([f"FROM {MODEL}\n", ""]))
    pattern = "\n".join(draw(st.lists(st.sampled_from(_REPEATED), min_size=1,
                                      max_size=3))) + "\n"
    ending = draw(st.sampled_from(_ENDINGS))
    size = draw(st.sampled_from([MODELFILE_CHARS, MODELFILE_CHARS + 1, 100_000, 20_000]))
    room = max(0, size - len(head) - len(ending))
    text = head + (pattern * (room // len(pattern) + 1))[:room] + ending
    body = {"model": draw(new_names), "modelfile": text, "stream": draw(BOOLEAN)}
    return Case(CREATE, dumps(body).encode("utf-8", "surrogatepass"), "ollama-create-long")


@st.composite
def big_blob_cases(draw: st.DrawFn) -> Case:
    """Uploads of a few MiB (kept under their digest, or refused for a wrong one after
    the whole body streamed to disk)."""
    data = b"GGUF" + bytes([draw(st.integers(0, 255))]) * (draw(st.integers(1, 4)) * 2**20)
    digest = _digest(data) if draw(BOOLEAN) else _digest(data + b"x")
    return Case(f"/api/blobs/{digest}", data, "ollama-blobs-big", route=BLOBS)


def model_file_cases() -> st.SearchStrategy[Case]:
    return st.one_of(create_cases(), blob_cases(), long_modelfile_cases(), big_blob_cases())
