"""The grammar a request's fields ask for: llama-server's `grammar` and `json_schema`, and
OpenAI's `response_format` (JSON mode, JSON schema), as bounded GBNF."""

from __future__ import annotations

import logging
from typing import Any

from edge_server.api.common.llama_fields import (
    grammar_conflict,
    user_grammar,
)
from edge_server.api.common.protocol import (
    SamplingRequest,
)
from edge_server.api.http.errors import invalid
from edge_server.engine.grammar.json_grammar import (
    ANY_JSON_OBJECT,
    SchemaError,
    compile_schema,
    name_tool_paths,
)

log = logging.getLogger(__name__)


def request_grammar(req: SamplingRequest) -> str | None:
    """The grammar the request asks for: `grammar` (GBNF text), `json_schema` (llama-
    server's) or `response_format`; at most one of them."""
    given = [name for name in ("grammar", "json_schema") if getattr(req, name) is not None]
    if req.response_format is not None and req.response_format.type != "text":
        given.append("response_format")
    if len(given) > 1:
        raise grammar_conflict(given[1])
    if req.grammar is not None:
        return user_grammar(req.grammar)
    if req.json_schema is not None:
        return schema_grammar(req.json_schema, strict=False, param="json_schema")
    return response_grammar(req)


def response_grammar(req: SamplingRequest) -> str | None:
    """The GBNF grammar that response_format asks for, or None for free text."""
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        schema, strict = fmt.object_schema, False
    else:
        if fmt.json_schema is None:
            raise invalid("response_format.json_schema", "json_schema needs a `json_schema` object")
        schema, strict = fmt.json_schema.json_schema, bool(fmt.json_schema.strict)
    if schema is None:
        return ANY_JSON_OBJECT
    return schema_grammar(schema, strict=strict, param="response_format")


def schema_grammar(schema: dict[str, Any], *, strict: bool, param: str) -> str:
    """The grammar for the schema that `param` gave (for `tools`, the schema of a call to
    one of them). A malformed schema, or a strict one past the grammar limits, is a 400
    naming `param`; a non-strict one is relaxed to the limits (logged)."""
    try:
        compiled = compile_schema(schema, strict=strict)
    except SchemaError as exc:
        message = name_tool_paths(str(exc), schema) if param == "tools" else str(exc)
        raise invalid(param, f"{param}: {message}", "unsupported_schema") from exc
    if compiled.relaxed:
        log.info("%s: best effort, not enforced: %s", param, "; ".join(compiled.relaxed))
    return compiled.grammar
