"""llama-server's request fields on the OpenAI routes: each is honoured, accepted at the
value that changes nothing, or refused with a 400 naming it.

Clients written for llama-server (llama.vscode, llama.vim, its web UI, scripts from its
README; docs/api/llama-server.md) send these fields beside OpenAI's. Silently dropping
one would change what the client gets without telling it, so every field of
llama-server's list is sorted here:

- honoured: declared on SamplingRequest (`grammar`, `json_schema`, `n_predict`,
  `repeat_penalty`, `repeat_last_n`, `mirostat` 2 with `mirostat_tau` / `mirostat_eta`,
  `cache_prompt`, `return_progress`, `n_indent`, `t_max_prompt_ms`, `t_max_predict_ms`,
  `n_cmpl`, `lora`);
- neutral: below, with the values that leave sampling and output as they are; those
  values are accepted (clients often send every field at its default), others refused;
- fields that are neither OpenAI's, the server's own nor llama-server's are accepted and
  logged (see docs/api/llama-server.md): OpenAI's own SDKs and wrappers add vendor fields of
  their own, and refusing them would break clients that work against OpenAI.
"""

from __future__ import annotations

from typing import Any

from edge_server.api.http.errors import APIError, invalid
from edge_server.engine.grammar.limits import SchemaError, check_grammar

# llama-server's fields this server does not implement, with the values that mean "off"
# (llama-server's defaults where those change nothing).
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "verbose": (False,),
    "timings_per_token": (False,),
    "return_tokens": (False,),
    "sse_ping_interval": (0,),
    "n_keep": (0, -1),
    "n_discard": (0,),
    "n_cache_reuse": (0,),
    "response_fields": ([],),
    "top_n_sigma": (-1, -1.0),
    "xtc_probability": (0, 0.0),
    "xtc_threshold": (0.1,),
    "typical_p": (1, 1.0),
    "dynatemp_range": (0, 0.0),
    "dynatemp_exponent": (1, 1.0),
    "dry_multiplier": (0, 0.0),
    "dry_base": (1.75,),
    "dry_allowed_length": (2,),
    "dry_penalty_last_n": (-1,),
    "dry_sequence_breakers": (["\n", ":", '"', "*"],),
    "adaptive_target": (-1, -1.0),
    "adaptive_decay": (0.9,),
    "n_probs": (0,),
    "min_keep": (0,),
    "backend_sampling": (False,),
    "post_sampling_probs": (False,),
    "grammar_lazy": (False,),
    "grammar_triggers": ([],),
    "preserved_tokens": ([],),
    "chat_format": (),
    "reasoning_format": (),
    "generation_prompt": (),
    "parse_tool_calls": (),
    "chat_parser": (),
    "continue_final_message": (False,),
    "reasoning_control": (),
    "reasoning_budget_tokens": (-1,),
    "reasoning_budget_start_tag": (),
    "reasoning_budget_end_tags": (),
    "reasoning_budget_message": (),
    "samplers": (),
    "id_slot": (-1,),
}


def check_llama_server_fields(extra: dict[str, Any] | None) -> None:
    """A 400 naming the first llama-server field whose value this server cannot honour."""
    for name, value in (extra or {}).items():
        neutral = NEUTRAL_VALUES.get(name)
        if neutral is None:
            continue
        if not any(type(value) is type(v) and value == v for v in neutral):
            shown = ", ".join(repr(v) for v in neutral) or "none"
            raise invalid(name, f"{name} is a llama-server field this server does not "
                          f"implement; accepted values: {shown}", "unsupported_parameter")


def user_grammar(gbnf: str) -> str:
    """GBNF text from a request's `grammar`, held to the bounds of schema grammars: a 400
    naming `grammar` for text llama.cpp's parser could choke on. Whether llama.cpp then
    parses it is checked where the grammar is built (a 400 naming `grammar` as well)."""
    if "\x00" in gbnf:
        raise invalid("grammar", "the grammar may not contain NUL characters")
    if not gbnf.strip():
        raise invalid("grammar", "the grammar is empty")
    try:
        check_grammar(gbnf)
    except SchemaError as exc:
        raise invalid("grammar", str(exc).replace(" for this schema", ""),
                      "invalid_grammar") from exc
    return gbnf


def grammar_conflict(param: str) -> APIError:
    return invalid(param, f"{param} cannot be combined with another grammar (`grammar`, "
                   "`json_schema`, `response_format` or a forced tool call): give one")
