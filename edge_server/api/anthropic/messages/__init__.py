"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API as a thin
protocol layer over chat completions (same prompt, sampling, grammars, tool parsing and
reasoning split)."""
