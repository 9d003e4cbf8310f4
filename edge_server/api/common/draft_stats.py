"""LM Studio's `stats` for a request that named a draft model (`draft_model`): how many
tokens were drafted for it and how many of them its answer kept."""

from __future__ import annotations

from typing import Any

from edge_server.engine.request import Usage


def draft_stats(draft_model: str, usage: Usage) -> dict[str, Any]:
    """Every draft is verified in the decode after it is made, so none is ignored."""
    return {
        "draft_model": draft_model.removesuffix(".gguf"),
        "total_draft_tokens_count": usage.drafted,
        "accepted_draft_tokens_count": usage.draft_accepted,
        "rejected_draft_tokens_count": usage.drafted - usage.draft_accepted,
        "ignored_draft_tokens_count": 0,
    }
