"""Edge values in every numeric field of every door, for tests/fuzz/test_fuzz.py and
scripts/soak/fuzz.py: integers at and around the bounds of C types and of the model served
(n_ctx, n_vocab), floats at their limits, and strings that spell numbers.

The fields come from the running server: every integer or number in the request schemas
of /openapi.json (nested ones and token-id lists included), plus the numbers its
schemas leave untyped (Ollama's `options`, llama-server's fields the OpenAI doors take
at a neutral value, logit_bias keys). n_ctx comes from /props and n_vocab from where
/detokenize starts refusing ids, so the edges move with the model and --ctx-size.
"""

from __future__ import annotations

import copy
import itertools
import random
from dataclasses import dataclass
from typing import Any

import httpx

from edge_testkit.fuzz.bounds import DETOKENIZE, TOKENIZE
from edge_testkit.fuzz.extras import RERANK_PATHS
from edge_testkit.fuzz.ollama import CHAT as OLLAMA_CHAT
from edge_testkit.fuzz.ollama import EMBED as OLLAMA_EMBED
from edge_testkit.fuzz.ollama import EMBEDDINGS as OLLAMA_EMBEDDINGS
from edge_testkit.fuzz.ollama import GENERATE as OLLAMA_GENERATE
from edge_testkit.fuzz.ollama import OPTION_NAMES
from edge_testkit.fuzz.strategies import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    MODEL,
    NATIVE,
    RESPONSES,
    TIMEOUT_S,
    Case,
    Raw,
    dumps,
)

INFILL = "/infill"
RERANK = RERANK_PATHS[0]
COUNT_TOKENS = "/v1/messages/count_tokens"
APPLY_TEMPLATE = "/apply-template"

_HELLO = [{"role": "user", "content": "Hi"}]
# Every generating door's base asks for a JSON string of at most 4 characters (each door
# in its own way), so that an edge value asking for the whole context is answered in a
# few tokens whatever the sampler draws: what is checked is how each number is taken
# (refused, clamped, handed to the sampler), not how long a long answer takes (the
# campaign's other generators ask for those).
_SHORT = {"type": "string", "maxLength": 4}
_SHORT_FORMAT = {"format": {"type": "json_schema", "name": "out", "schema": _SHORT}}
# Each door's smallest valid request, answered in a token or two; an edge value then
# replaces (or adds) one field of it.
BASE_BODIES: dict[str, dict[str, Any]] = {
    COMPLETIONS: {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "json_schema": _SHORT},
    CHAT: {"model": MODEL, "messages": _HELLO, "max_tokens": 2, "json_schema": _SHORT},
    RESPONSES: {"model": MODEL, "input": "Hi", "max_output_tokens": 2, "text": _SHORT_FORMAT},
    EMBEDDINGS: {"model": MODEL, "input": "Hi"},
    MESSAGES: {"model": MODEL, "messages": _HELLO, "max_tokens": 2, "output_config": {
        "format": {"type": "json_schema", "schema": _SHORT}}},
    COUNT_TOKENS: {"model": MODEL, "messages": _HELLO},
    OLLAMA_GENERATE: {"model": MODEL, "prompt": "Hi", "stream": False, "format": _SHORT,
                      "options": {"num_predict": 2}},
    # A replayed call first: the numbers of its messages go there.
    OLLAMA_CHAT: {"model": MODEL, "stream": False, "format": _SHORT,
                  "options": {"num_predict": 2},
                  "messages": [{"role": "assistant", "content": "", "tool_calls": [
                      {"function": {"name": "f", "arguments": {}}}]}, *_HELLO]},
    OLLAMA_EMBED: {"model": MODEL, "input": "Hi"},
    OLLAMA_EMBEDDINGS: {"model": MODEL, "prompt": "Hi"},
    NATIVE: {"model": MODEL, "prompt": "Hi", "n_predict": 2, "json_schema": _SHORT},
    INFILL: {"model": MODEL, "input_prefix": "def f(", "input_suffix": ")", "n_predict": 2,
             "json_schema": _SHORT},
    TOKENIZE: {"model": MODEL, "content": "Hi"},
    DETOKENIZE: {"model": MODEL, "tokens": [1]},
    APPLY_TEMPLATE: {"model": MODEL, "messages": _HELLO},
    # Refused on a model that is no reranker: after its numbers are read, or before?
    RERANK: {"model": MODEL, "query": "Hi", "documents": ["a", "b"]},
}
DOORS = tuple(BASE_BODIES)
STREAMING = {COMPLETIONS, CHAT, RESPONSES, MESSAGES, OLLAMA_GENERATE, OLLAMA_CHAT, NATIVE,
             INFILL}

# Numbers the schemas do not type. llama-server's fields that the OpenAI doors accept
# at a neutral value only (edge_server/api/common/llama_fields.py):
LLAMA_SERVER_NUMBERS = ["n_keep", "n_discard", "n_cache_reuse", "sse_ping_interval",
                        "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p",
                        "dynatemp_range", "dynatemp_exponent", "repeat_last_n",
                        "dry_multiplier", "dry_base", "dry_allowed_length",
                        "dry_penalty_last_n", "adaptive_target", "adaptive_decay", "n_probs",
                        "min_keep", "reasoning_budget_tokens", "id_slot"]
OLLAMA_OPTIONS = [f"options.{name}" for name in OPTION_NAMES
                  if name not in ("stop", "penalize_newline", "bogus")]
UNTYPED: dict[str, list[str]] = {
    **{door: [*LLAMA_SERVER_NUMBERS, "logit_bias.<key>"]
       for door in (COMPLETIONS, CHAT, NATIVE, INFILL)},
    **{door: OLLAMA_OPTIONS
       for door in (OLLAMA_GENERATE, OLLAMA_CHAT, OLLAMA_EMBED, OLLAMA_EMBEDDINGS)},
    RESPONSES: ["top_logprobs", "max_tool_calls"],  # OpenAI's, refused by name here
    DETOKENIZE: ["tokens[]"],  # a list its own validator reads
    # Doors with no number of their own: numbers where a string or boolean belongs.
    TOKENIZE: ["content", "add_special", "parse_special", "with_pieces"],
    APPLY_TEMPLATE: ["add_generation_prompt", "enable_thinking"],
}

# Floats at their limits, written as JSON text: 1e309 and 1e-400 are numbers in JSON
# that a parser turns into infinity and 0.0; NaN and Infinity are not JSON at all.
FLOAT_EDGES = [Raw(t) for t in ("-0.0", "5e-324", "-5e-324", "2.2250738585072014e-308",
                                "1.7e308", "-1.7e308", "1e309", "-1e309", "1e-400", "0.5",
                                "NaN", "Infinity")]
NUMBER_STRINGS = ["NaN", "nan", "Infinity", "-inf", "1e309", "0x10", "1_000", " 7", ""]


@dataclass(frozen=True)
class ModelLimits:
    n_ctx: int  # tokens one request may use
    n_vocab: int


def int_edges(limits: ModelLimits) -> list[int]:
    fixed = [0, -1, 1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, -(2**63), -(2**31) - 1]
    around = [n + d for n in (limits.n_ctx, limits.n_vocab) for d in (-1, 0, 1)]
    return list(dict.fromkeys(fixed + around))


def edge_values(limits: ModelLimits) -> list[Any]:
    return [*int_edges(limits), *FLOAT_EDGES, *NUMBER_STRINGS]


def read_limits(base_url: str) -> ModelLimits:
    """n_ctx as /props reports it; n_vocab as the first id /detokenize refuses."""
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as client:
        props = client.get("/props").raise_for_status().json()
        n_ctx = int(props["default_generation_settings"]["n_ctx"])

        def known(token: int) -> bool:
            r = client.post(DETOKENIZE, json={"model": MODEL, "tokens": [token]})
            return r.status_code == 200

        low, high = 0, 2**31  # known(low), not known(high)
        if not known(low) or known(high):
            raise RuntimeError("/detokenize does not bound token ids: n_vocab unknown")
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if known(mid) else (low, mid)
        return ModelLimits(n_ctx=n_ctx, n_vocab=high)


# --- the numeric fields of a request schema ---------------------------------------------

def _resolve(schema: Any, spec: dict[str, Any]) -> dict[str, Any]:
    while isinstance(schema, dict) and "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema if isinstance(schema, dict) else {}


def _branches(schema: dict[str, Any], spec: dict[str, Any]) -> list[dict[str, Any]]:
    alternatives = schema.get("anyOf") or schema.get("oneOf") or [schema]
    return [_resolve(s, spec) for s in alternatives]


def _numeric_paths(schema: Any, spec: dict[str, Any], path: str, depth: int) -> list[str]:
    """Dotted paths of the numbers under `schema`: `a.b`, `a[]` for a list's item,
    `a.<value>` for a map's value."""
    found: list[str] = []
    for branch in _branches(_resolve(schema, spec), spec):
        kind = branch.get("type")
        if kind in ("integer", "number"):
            found.append(path)
        elif depth >= 8:
            continue
        elif kind == "array" and "items" in branch:
            found += _numeric_paths(branch["items"], spec, path + "[]", depth + 1)
        elif kind == "object" or "properties" in branch:
            for name, sub in branch.get("properties", {}).items():
                found += _numeric_paths(sub, spec, f"{path}.{name}".lstrip("."), depth + 1)
            extra = branch.get("additionalProperties")
            if isinstance(extra, dict) and extra:
                found += _numeric_paths(extra, spec, path + ".<value>", depth + 1)
    return list(dict.fromkeys(found))


def numeric_fields(spec: dict[str, Any]) -> dict[str, list[str]]:
    """Each door's numeric fields: its request schema's, then the untyped ones."""
    fields = {}
    for door in DOORS:
        content = spec["paths"][door]["post"]["requestBody"]["content"]
        schema = content["application/json"]["schema"]
        fields[door] = list(dict.fromkeys(_numeric_paths(schema, spec, "", 0)
                                          + UNTYPED.get(door, [])))
    return fields


# --- placing a value ----------------------------------------------------------------------

ITEM, VALUE, KEY = "[]", "<value>", "<key>"  # a list's first item, a map's value, its key


def _steps(path: str) -> list[str]:
    steps: list[str] = []
    for part in path.split("."):
        name = part.replace(ITEM, "")
        steps += ([name] if name else []) + [ITEM] * part.count(ITEM)
    return steps


def _key_text(value: Any) -> str:
    return value.text if isinstance(value, Raw) else str(value)


def place(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `body` with `value` at `path`; containers on the way are the body's own
    where it has them (its first message, say), else new and minimal."""
    out = copy.deepcopy(body)
    node: Any = out
    steps = _steps(path)
    for step, after in zip(steps, [*steps[1:], None], strict=True):
        if step == KEY:  # the value as the map's only key (logit_bias's token ids)
            node.clear()
            node[_key_text(value)] = 1
            break
        fresh: Any = [] if after == ITEM else {}
        if step == ITEM:
            if after is None or not node or type(node[0]) is not type(fresh):
                node[:] = [value if after is None else fresh]
            node = node[0]
            continue
        if step == VALUE:  # the map's only value, at a key valid as a token id
            node.clear()
            step = "1"
        if after is None:
            node[step] = value
        elif type(node.get(step)) is not type(fresh):
            node[step] = fresh
        node = node.get(step)
    return out


def edge_cases(spec: dict[str, Any], limits: ModelLimits) -> list[Case]:
    """Every edge value in every numeric field of every door: one case each (every
    other one streamed, where the door streams)."""
    fields = numeric_fields(spec)
    return [_case(door, path, value, i % 2 == 1) for door in DOORS
            for i, (path, value) in enumerate(itertools.product(fields[door],
                                                                edge_values(limits)))]


def covering_cases(spec: dict[str, Any], limits: ModelLimits, door: str,
                   rounds: int = 1) -> list[Case]:
    """A sample of one door's edge cases, for a bounded test: each round, every field
    takes an edge value and every edge value goes into a field."""
    fields = numeric_fields(spec)[door]
    values = edge_values(limits)
    width = max(len(fields), len(values))
    return [_case(door, fields[i % len(fields)], values[(i + 7 * r) % len(values)],
                  (i + r) % 2 == 1) for r in range(rounds) for i in range(width)]


def _case(door: str, path: str, value: Any, stream: bool) -> Case:
    body = place(BASE_BODIES[door], path, value)
    if door in STREAMING:
        body["stream"] = stream
    return Case(door, dumps(body).encode(), f"edge {path}")


def shuffled(cases: list[Case], seed: int) -> list[Case]:
    out = list(cases)
    random.Random(seed).shuffle(out)
    return out


def read_spec(base_url: str) -> dict[str, Any]:
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as client:
        spec: dict[str, Any] = client.get("/openapi.json").raise_for_status().json()
        return spec
