"""The response object: before any output (`response.created`), and whole (the answer,
`response.completed`, what the store keeps)."""

from __future__ import annotations

from typing import Any

from edge_server.api.common.serving import now
from edge_server.api.openai.responses.protocol import ResponsesRequest
from edge_server.api.openai.responses.streaming import OutputItems, item_id
from edge_server.engine import Engine
from edge_server.engine.request import RequestHandle


def shell(req: ResponsesRequest, engine: Engine, *, stored: bool) -> dict[str, Any]:
    """The response before any output: the request's settings echoed as the API does."""
    fmt = req.text.format if req.text and req.text.format else None
    return {
        "id": item_id("resp"), "object": "response", "created_at": now(),
        "status": "in_progress", "error": None, "incomplete_details": None,
        "model": engine.model_id, "output": [], "usage": None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                      "summary": None},
        "store": stored, "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt
                 else {"type": "text"}},
        "tool_choice": _echo_choice(req),
        # Every key of the schema's FunctionTool, null where the request gave none.
        "tools": [{"type": t.type, "name": t.name, "description": t.description,
                   "parameters": t.parameters, "strict": t.strict} for t in req.tools or []],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled", "user": req.user,
        # Settings the Open Responses schema requires in every response object, echoed
        # as served: no penalties, top_logprobs and max_tool_calls are refused by name,
        # and nothing runs in the background.
        "completed_at": None, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "top_logprobs": 0, "max_tool_calls": None, "background": False,
        "service_tier": "default", "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key,
    }


def _echo_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else {"type": "function", "name": choice.name}


def final(shell: dict[str, Any], items: OutputItems, handle: RequestHandle, engine: Engine,
          finish_reason: str | None) -> dict[str, Any]:
    usage = handle.usage
    reasoning = "".join(part["text"] for item in items.items if item["type"] == "reasoning"
                        for part in item["content"])
    reasoning_tokens = len(engine.tokenize(reasoning, add_special=False)) if reasoning else 0
    incomplete = finish_reason == "length"
    return {
        **shell,
        "status": "incomplete" if incomplete else "completed",
        "completed_at": None if incomplete else now(),
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": items.items,
        "output_text": items.output_text,
        "usage": {
            "input_tokens": usage.prompt_tokens,
            # Prompt tokens evaluated now are kept as a reusable prefix: written to cache.
            "input_tokens_details": {
                "cached_tokens": usage.cached_tokens,
                "cache_write_tokens": max(0, usage.prompt_tokens - usage.cached_tokens)},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {
                "reasoning_tokens": min(reasoning_tokens, usage.completion_tokens)},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        },
    }
